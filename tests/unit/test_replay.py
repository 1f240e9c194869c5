"""The replay workload (benchmarks/sim/replay.py) and what plays it on real engines: trajectory
records -> per-turn lengths and tool latencies, the simulator round trip, the file format, the
scripted trajectory's forced turns and sized tool answers, and `SamplingSpec.ignore_eos` as the
vLLM and endpoint engines send it (no engine is started)."""

import asyncio
import contextlib
import io
import json
import time

import pytest

from benchmarks.scheduler.scripted import (
    ScriptedTrajectory,
    SleepTools,
    chunk_digits,
    replay_items,
)
from benchmarks.sim.replay import (
    Replay,
    from_records,
    from_sim,
    load,
    main,
    save,
    summary,
    to_sim,
)
from benchmarks.sim.workload import make_workload
from rstar2cli import protocol as P
from rstar2cli.engines.base import GenOutput, SamplingSpec
from sandboxd.wire import JobResult

IM_END = 7


def _record(rid, *, runs, durations=(), sample=0, **extra):
    """A record with a 5-token prompt; `runs` are (mask value, length) of the response."""
    mask = [m for m, n in runs for _ in range(n)]
    return {
        "id": rid,
        "sample": sample,
        "prompt_ids": [1] * 5,
        "response_ids": [2] * len(mask),
        "loss_mask": mask,
        "tool_calls": [{"status": "ok", "duration_s": d, "code": ""} for d in durations],
        **extra,
    }


def test_from_records_turns_chunks_and_latencies():
    records = [
        _record("a", runs=[(1, 4)]),  # no tool call: one turn
        # two calls, the second a parse error (never ran: 0.0)
        _record("a", runs=[(1, 3), (0, 2), (1, 4), (0, 5), (1, 1)], durations=[0.5, 0.0], sample=1),
        # budget cut: the second call ran but its answer did not fit -> left out
        _record("b", runs=[(1, 2), (0, 3), (1, 6)], durations=[1.25, 2.0], group="3.1"),
        # an engine error after a tool answer: the trailing chunk and its call are dropped
        _record("c", runs=[(1, 2), (0, 3)], durations=[0.4]),
        _record("d", runs=[]),  # no model token: nothing to replay
    ]
    assert from_records(records) == [
        Replay(group="a", sample=0, prompt_tokens=5, turns=[4], chunks=[], tool_s=[]),
        Replay(
            group="a", sample=1, prompt_tokens=5, turns=[3, 4, 1], chunks=[2, 5], tool_s=[0.5, 0.0]
        ),
        Replay(group="3.1", sample=0, prompt_tokens=5, turns=[2, 6], chunks=[3], tool_s=[1.25]),
        Replay(group="c", sample=0, prompt_tokens=5, turns=[2], chunks=[], tool_s=[]),
    ]
    # a chunk with no recorded call gets 0.0
    [r] = from_records([_record("e", runs=[(1, 1), (0, 2), (1, 1)])])
    assert r.tool_s == [0.0]


def test_bad_replays_and_records_are_refused():
    with pytest.raises(ValueError, match="len\\(turns\\) - 1"):
        Replay(group=0, sample=0, prompt_tokens=1, turns=[3, 4], chunks=[], tool_s=[])
    with pytest.raises(ValueError, match="starts with a tool-response token"):
        from_records([_record("x", runs=[(0, 2), (1, 1)])])


def test_sim_round_trip_and_summary():
    trajs = make_workload(num_prompts=3, num_samples=2, max_response=4000, seed=1)
    replays = from_sim(trajs)
    assert [(r.group, r.sample) for r in replays] == [(g, s) for g in range(3) for s in range(2)]
    assert to_sim(replays) == trajs  # fresh SimTrajs, run state included (turn_left = turns[0])
    assert from_sim(to_sim(replays)) == replays
    s = summary(replays)
    assert s["num_trajectories"] == 6 and s["num_groups"] == 3
    assert s["max_response_tokens"] == max(sum(t.turns) + sum(t.chunks) for t in trajs)
    assert s["num_tool_calls"] == sum(len(t.tool_s) for t in trajs)
    assert set(summary([]).values()) == {0.0}


def test_summary_by_hand():
    replays = [
        Replay(group="a", sample=0, prompt_tokens=5, turns=[10], chunks=[], tool_s=[]),
        Replay(group="a", sample=1, prompt_tokens=5, turns=[10, 20], chunks=[10], tool_s=[1.0]),
        Replay(group="b", sample=0, prompt_tokens=5, turns=[5, 5], chunks=[10], tool_s=[3.0]),
    ]
    # response tokens 10, 40, 20: mean 70/3, p50 20 (rank 2 of 3), p90 40 (rank 3)
    assert summary(replays) == {
        "num_trajectories": 3.0,
        "num_groups": 2.0,
        "mean_response_tokens": 70 / 3,
        "p50_response_tokens": 20.0,
        "p90_response_tokens": 40.0,
        "max_response_tokens": 40.0,
        "mean_turns": 5 / 3,
        "num_tool_calls": 2.0,
        "mean_tool_s": 2.0,
    }


def test_save_load_round_trip_and_bad_files(tmp_path):
    replays = from_sim(make_workload(num_prompts=2, num_samples=2, max_response=2000, seed=0))
    replays.append(Replay(group="p7", sample=0, prompt_tokens=9, turns=[3], chunks=[], tool_s=[]))
    path = tmp_path / "w.json"
    save(path, replays, meta={"source": "make_workload", "seed": 0})
    assert load(path) == (replays, {"source": "make_workload", "seed": 0})
    bad = {
        "trunc.json": path.read_text()[:50],
        "version.json": json.dumps({"version": 2, "meta": {}, "trajectories": []}),
        "keys.json": json.dumps({"version": 1, "meta": {}, "trajectories": [{"group": 0}]}),
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=f"{name}: not a replay file") as err:
            load(tmp_path / name)
        assert "\n" not in str(err.value)


class _CharTokenizer:
    """One token per character; `<|im_end|>` is IM_END."""

    def convert_tokens_to_ids(self, token):
        return IM_END if token == P.IM_END else 0

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def _out(token_ids, finish_reason):
    return GenOutput(token_ids=token_ids, logprobs=None, finish_reason=finish_reason)


def _play_tool(traj):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(traj.tool_job().code, {})
    return JobResult(status="ok", stdout=out.getvalue(), stderr="", exit_code=0, duration_s=0.0)


def test_forced_scripted_trajectory_plays_a_replay_exactly():
    tok = _CharTokenizer()
    replay = Replay(
        group="g", sample=1, prompt_tokens=1500, turns=[3, 2], chunks=[150], tool_s=[0.0]
    )
    [item] = replay_items([replay], tok)
    assert item["id"] == "g" and item["sample"] == 1 and item["chunks"] == [150]
    prompt = tok.encode(P.render_prompt(item["question"]))
    assert len(prompt) == 1500  # the char tokenizer: the system prompt alone is ~1.3k
    traj = ScriptedTrajectory(
        item, prompt_ids=prompt, tokenizer=tok, max_response=1000, forced=True
    )
    spec = traj.sampling_spec()
    assert spec.ignore_eos and spec.max_tokens == 3
    # a forced turn does not end at <|im_end|>
    assert traj.on_generated(_out([5, IM_END], "length")) == "generate"
    assert traj.on_generated(_out([5], "length")) == "tool"
    assert traj.on_tool_result(_play_tool(traj)) == "generate"
    assert len(traj.response_ids) == 3 + 150  # the chunk has the replay's token count
    assert traj.on_generated(_out([5, 5], "length")) == "done"
    assert traj.finish_reason == "answer" and len(traj.response_ids) == 3 + 150 + 2
    assert chunk_digits(1, tok) == 1  # a chunk smaller than its frame prints one digit


def test_unforced_scripted_turn_ends_at_im_end():
    item = {"id": "p0", "sample": 0, "turns": [5, 5], "tool_s": [0.0]}
    traj = ScriptedTrajectory(item, prompt_ids=[1], tokenizer=_CharTokenizer(), max_response=100)
    assert not traj.sampling_spec().ignore_eos
    assert traj.on_generated(_out([5, IM_END], "stop")) == "tool"
    assert traj.tool_job().stdout == "0\n"


def test_sleep_tools_answer_what_the_scripted_code_prints():
    item = {"id": "p0", "sample": 0, "turns": [5, 5, 5], "tool_s": [0.0, 0.02]}
    traj = ScriptedTrajectory(item, prompt_ids=[1], tokenizer=_CharTokenizer(), max_response=100)
    traj.turn = 1
    job = traj.tool_job()
    seen = []
    started = time.monotonic()
    [result] = asyncio.run(SleepTools().run_batch([job], on_result=lambda i, r: seen.append(i)))
    assert time.monotonic() - started >= 0.02 and seen == [0]
    assert result.status == "ok" and result.stdout == _play_tool(traj).stdout == "7\n"


def test_vllm_sampling_params_ignore_eos():
    from rstar2cli.engines.vllm_engine import sampling_params

    forced = sampling_params(SamplingSpec(max_tokens=33, ignore_eos=True), im_end_id=IM_END)
    # NOTE: vLLM still stops on a stop id with ignore_eos, so none is passed
    assert forced.ignore_eos and forced.max_tokens == 33 and not forced.stop_token_ids
    default = sampling_params(SamplingSpec(max_tokens=33, stop_token_ids=[3]), im_end_id=IM_END)
    assert not SamplingSpec(max_tokens=1).ignore_eos
    assert not default.ignore_eos and default.max_tokens == 33
    assert default.stop_token_ids == [3, IM_END]


def test_endpoint_body_asks_ignore_eos_only_when_set():
    from rstar2cli.engines.endpoint_engine import EndpointEngine, EndpointInfo

    engine = EndpointEngine(
        EndpointInfo(base_url="http://x", model_id="m", max_model_len=None), stop_token_ids=[IM_END]
    )
    bodies = []

    async def post(body):
        bodies.append(body)
        return {"choices": [{"token_ids": [5, 5], "finish_reason": "length"}]}

    engine._post = post
    for spec in (SamplingSpec(max_tokens=2, ignore_eos=True), SamplingSpec(max_tokens=2)):
        assert asyncio.run(engine.generate("r", [1, 2], spec)).token_ids == [5, 5]
    assert bodies[0]["ignore_eos"] is True and bodies[0]["stop_token_ids"] == []
    assert "ignore_eos" not in bodies[1] and bodies[1]["stop_token_ids"] == [IM_END]


def test_sessions_are_identical_many_turn_trajectories(tmp_path):
    out = tmp_path / "s.json"
    main(
        ["--sessions", "4,64,40,1.5", "--num-prompts", "3", "--num-samples", "2", "--out", str(out)]
    )
    replays, meta = load(out)
    assert meta["source"] == "sessions" and len(replays) == 6
    assert {(r.group, r.sample) for r in replays} == {(g, k) for g in range(3) for k in range(2)}
    r = replays[0]
    assert (r.prompt_tokens, r.turns, r.chunks, r.tool_s) == (200, [64] * 4, [40] * 3, [1.5] * 3)
    assert r.response_tokens == 4 * 64 + 3 * 40
