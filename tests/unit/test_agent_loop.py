"""The agent loop with a scripted engine (it emits protocol text we wrote) and a real sandbox.

The engine here is a test double honouring the `Engine` Protocol: it tokenizes scripted turns with
the real tiny tokenizer and returns them, cut at `max_tokens` like a real engine. Tools run in a
real `sandboxd.pool.LocalSandbox` (fork server + zygotes), so the sandbox path is the real one.
"""

import asyncio

import pytest
from scripted import ScriptedEngine

from rstar2cli import protocol as P
from rstar2cli.agent.loop import (
    AgentConfig,
    Trajectory,
    prompt_ids_for,
    run_trajectory,
    shared_prompt_prefix,
)
from rstar2cli.agent.tools import ToolBatcher
from rstar2cli.data.tiny import build_tokenizer
from rstar2cli.engines.base import GenOutput
from rstar2cli.rollout.driver import run_rollout
from rstar2cli.scheduler.scheduler import SchedulerConfig
from sandboxd.pool import LocalSandbox

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CALL_1522 = P.format_tool_call("print(37*41+5)")
ANSWER = "</reason>\n<answer>\\boxed{1522}</answer>" + P.IM_END


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


class CountingRunner:
    def __init__(self, inner):
        self.inner = inner
        self.batches = []

    async def run_batch(self, jobs, on_result=None):
        self.batches.append(len(jobs))
        return await self.inner.run_batch(jobs, on_result)

    async def close(self):
        await self.inner.close()


def run_one(tok, turns, config=None, runner=None):
    config = config or AgentConfig(max_response_tokens=2000)
    item = {"id": "q1", "sample": 0, "question": "Compute 37*41+5.", "answer": "1522"}
    engine = ScriptedEngine(tok, {"*": list(turns)})

    async def go():
        sandbox = LocalSandbox(num_workers=2, timeout_s=5.0)
        counting = CountingRunner(sandbox)
        try:
            traj = Trajectory(item, prompt_ids_for(item["question"], tok), tok, config)
            rec = await run_trajectory(traj, engine, ToolBatcher(runner or counting), "t0")
            return rec, engine, counting
        finally:
            await sandbox.close()

    return asyncio.run(go())


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_tool_call_then_answer_layout_mask_and_record(tok):
    turn1 = "Let me compute.\n" + CALL_1522 + P.IM_END
    rec, engine, runner = run_one(tok, [turn1, ANSWER])
    assert rec["finish_reason"] == "answer" and rec["num_turns"] == 2
    assert [c["status"] for c in rec["tool_calls"]] == ["ok"]
    assert (
        rec["tool_calls"][0]["code"] == "print(37*41+5)" and rec["tool_calls"][0]["duration_s"] > 0
    )
    chunk = ids(tok, P.render_tool_response("1522"))
    t1, t2 = ids(tok, turn1), ids(tok, ANSWER)
    assert rec["response_ids"] == t1 + chunk + t2  # ids appended, never re-rendered
    assert rec["loss_mask"] == [1] * len(t1) + [0] * len(chunk) + [1] * len(t2)
    assert rec["extracted"] == "1522" and rec["num_answer_tags"] == 1
    assert rec["prompt_ids"] == prompt_ids_for("Compute 37*41+5.", tok)
    # the second request continued the exact context, with the remaining budget as max_tokens
    (_, ctx1, max1), (_, ctx2, max2) = engine.requests
    assert ctx2 == ctx1 + t1 + chunk
    assert (max1, max2) == (2000, 2000 - len(t1) - len(chunk))
    assert "<tool_response>\n1522\n</tool_response>" in rec["text"]
    assert runner.batches == [1]
    assert set(rec) >= {"id", "sample", "question", "answer", "text", "finish_reason"}


def test_record_keeps_the_engines_logprobs_and_each_turns_policy_version(tok):
    """rollout_logprobs: one per response token, the engine's on model tokens (the scripted
    engine's -0.1, -0.2, ... per request), 0.0 on the tool chunk; turn_versions: the
    config's policy version per model turn. Without want_logprobs: None."""
    turn1 = "Let me compute.\n" + CALL_1522 + P.IM_END
    config = AgentConfig(max_response_tokens=2000, policy_version=7)
    rec, _, _ = run_one(tok, [turn1, ANSWER], config=config)
    t1, t2 = len(ids(tok, turn1)), len(ids(tok, ANSWER))
    chunk = len(ids(tok, P.render_tool_response("1522")))
    expected = [-0.1 * (i + 1) for i in range(t1)] + [0.0] * chunk
    expected += [-0.1 * (i + 1) for i in range(t2)]
    assert rec["rollout_logprobs"] == pytest.approx(expected)
    assert len(rec["rollout_logprobs"]) == len(rec["response_ids"])
    assert rec["turn_versions"] == [7, 7]
    off = AgentConfig(max_response_tokens=2000, want_logprobs=False)
    rec, _, _ = run_one(tok, [turn1, ANSWER], config=off)
    assert rec["rollout_logprobs"] is None and rec["turn_versions"] == [0, 0]


def test_a_turn_continued_under_new_weights_keeps_its_first_version_through_a_carry(tok):
    """Partial rollout: a turn cut between requests, saved (`state`), taken up by the next
    step's config (version 1): the turn keeps version 0, the next turn gets 1, and the
    log-probs survive the round trip."""
    item = {"id": "q", "sample": 0, "question": "Q"}
    traj = Trajectory(item, [1, 2, 3], tok, AgentConfig(max_response_tokens=100))
    text_ids = ids(tok, "first part " + CALL_1522 + P.IM_END)
    traj.sampling_spec(4)
    assert traj.on_generated(GenOutput(text_ids[:4], [-1.0] * 4, "length")) == "generate"
    later = AgentConfig(max_response_tokens=100, policy_version=1)
    traj = Trajectory.from_state(traj.state(), tok, later)
    traj.sampling_spec(100)
    rest = len(text_ids) - 4
    assert traj.on_generated(GenOutput(text_ids[4:], [-2.0] * rest, "stop")) == "tool"
    assert traj.on_tool_result(None) == "generate"  # answered locally (a parse error or not)
    traj.on_generated(GenOutput(ids(tok, ANSWER), [-3.0] * len(ids(tok, ANSWER)), "stop"))
    rec = traj.record()
    assert rec["turn_versions"] == [0, 1]
    assert rec["rollout_logprobs"][:4] == [-1.0] * 4 and rec["rollout_logprobs"][-1] == -3.0
    assert len(rec["rollout_logprobs"]) == len(rec["response_ids"])


def test_failing_code_reports_error_status_and_stderr(tok):
    turn1 = P.format_tool_call("print(1/0)") + P.IM_END
    rec, _, _ = run_one(tok, [turn1, "no idea" + P.IM_END])
    assert [c["status"] for c in rec["tool_calls"]] == ["error"]
    assert "ZeroDivisionError" in rec["text"]
    assert rec["finish_reason"] == "no_answer" and rec["extracted"] is None


def test_malformed_call_is_answered_with_its_error_without_the_sandbox(tok):
    turn1 = "<tool_call>\n{not json}\n</tool_call>" + P.IM_END
    rec, _, runner = run_one(tok, [turn1, ANSWER])
    assert [c["status"] for c in rec["tool_calls"]] == ["parse_error"]
    assert "invalid JSON in tool call" in rec["text"]
    assert runner.batches == [] and rec["finish_reason"] == "answer"


def test_max_turns_stops_before_running_the_last_call(tok):
    turn = CALL_1522 + P.IM_END
    rec, _, runner = run_one(tok, [turn], AgentConfig(max_turns=3, max_response_tokens=4000))
    assert rec["finish_reason"] == "max_turns" and rec["num_turns"] == 3
    assert len(rec["tool_calls"]) == 2 and runner.batches == [1, 1]


def test_budget_cuts_the_response_and_every_request_gets_the_remaining_budget(tok):
    turn1 = CALL_1522 + P.IM_END
    budget = len(ids(tok, turn1)) + len(ids(tok, P.render_tool_response("1522"))) + 5
    long_turn = "thinking " * 50 + P.IM_END
    rec, engine, _ = run_one(tok, [turn1, long_turn], AgentConfig(max_response_tokens=budget))
    assert rec["finish_reason"] == "budget" and rec["num_turns"] == 2  # the cut turn counts
    assert len(rec["response_ids"]) == budget == len(rec["loss_mask"])
    assert engine.requests[-1][2] == 5


def test_tool_chunk_that_does_not_fit_ends_with_budget(tok):
    turn1 = CALL_1522 + P.IM_END
    budget = len(ids(tok, turn1)) + 3
    rec, _, _ = run_one(tok, [turn1, ANSWER], AgentConfig(max_response_tokens=budget))
    assert rec["finish_reason"] == "budget" and rec["loss_mask"] == [1] * len(ids(tok, turn1))


def test_tool_output_truncation_setting(tok):
    turn1 = P.format_tool_call("print('x' * 1000)") + P.IM_END
    cfg = AgentConfig(max_response_tokens=4000, max_tool_output_chars=40)
    rec, _, _ = run_one(tok, [turn1, ANSWER], cfg)
    assert "[960 characters truncated]" in rec["text"]
    cfg_all = AgentConfig(max_response_tokens=4000, max_tool_output_chars=None)
    rec_all, _, _ = run_one(tok, [turn1, ANSWER], cfg_all)
    assert "x" * 1000 in rec_all["text"]


def test_engine_error_ends_the_trajectory(tok):
    item = {"id": "q", "sample": 0, "question": "Q"}
    engine = ScriptedEngine(tok, {"*": ["x"]}, fail=True)

    async def go():
        traj = Trajectory(item, prompt_ids_for("Q", tok), tok, AgentConfig())
        return await run_trajectory(traj, engine, ToolBatcher(CountingRunner(None)), "t")

    rec = asyncio.run(go())
    assert rec["finish_reason"] == "engine_error" and rec["response_ids"] == []


def test_a_turn_cut_by_the_step_continues_as_the_same_turn(tok):
    item = {"id": "q", "sample": 0, "question": "Q"}
    traj = Trajectory(item, [1, 2, 3], tok, AgentConfig(max_response_tokens=100))
    text_ids = ids(tok, "a long turn without calls" + P.IM_END)
    traj.sampling_spec(4)
    assert traj.on_generated(GenOutput(text_ids[:4], None, "length")) == "generate"
    assert traj.num_turns == 0
    traj.sampling_spec(100)
    assert traj.on_generated(GenOutput(text_ids[4:], None, "stop")) == "done"
    assert traj.num_turns == 1 and traj.finish_reason == "no_answer"


def test_tool_batcher_coalesces_calls_made_in_one_tick():
    from sandboxd.wire import Job

    async def go():
        async with LocalSandbox(num_workers=2, timeout_s=5.0) as sandbox:
            runner = CountingRunner(sandbox)
            batcher = ToolBatcher(runner)
            results = await asyncio.gather(*(batcher.run(Job(f"print({i}*2)")) for i in range(5)))
            return runner.batches, [r.stdout.strip() for r in results], batcher.num_in_flight

    batches, outs, in_flight = asyncio.run(go())
    assert batches == [5] and outs == ["0", "2", "4", "6", "8"] and in_flight == 0


@pytest.mark.parametrize("policy", ["kv", "static", "least-requests"])
def test_rollout_driver_with_two_scripted_engines(tok, policy):
    """Every item x sample comes back once, through the scheduler, tools and two engines."""
    turn1 = CALL_1522 + P.IM_END
    items = [
        {"id": f"q{i}", "sample": s, "question": f"Compute 37*41+{i}.", "answer": "1522"}
        for i in range(4)
        for s in range(2)
    ]
    scripts = {f"t{k}": [turn1, ANSWER] if k % 2 else [ANSWER] for k in range(len(items))}
    prompt_len = len(prompt_ids_for(items[0]["question"], tok))
    # each engine holds two worst-case reservations: the kv policy must queue the rest
    engines = [
        ScriptedEngine(tok, scripts, capacity_tokens=2 * (prompt_len + 300)) for _ in range(2)
    ]
    records = []

    async def go():
        async with LocalSandbox(num_workers=2, timeout_s=5.0) as sandbox:
            return await run_rollout(
                engines,
                items,
                tok,
                AgentConfig(max_response_tokens=300),
                SchedulerConfig(policy=policy, max_active_per_engine=2),
                ToolBatcher(sandbox),
                records.append,
                sample_every_s=0.01,
            )

    stats = asyncio.run(go())
    assert sorted((r["id"], r["sample"]) for r in records) == sorted(
        (i["id"], i["sample"]) for i in items
    )
    assert all(r["finish_reason"] == "answer" and r["extracted"] == "1522" for r in records)
    assert sum(len(r["tool_calls"]) for r in records) == 4 == stats.num_tool_calls
    assert {r["tool_calls"][0]["status"] for r in records if r["tool_calls"]} == {"ok"}
    assert all(len(e.requests) > 0 for e in engines)  # both engines did work
    assert stats.num_generated_tokens == sum(sum(r["loss_mask"]) for r in records)
    assert stats.makespan_s > 0 and 0.0 <= stats.idle_fraction <= 1.0 and stats.kv_samples
    if policy == "kv":
        assert max(stats.max_ledger_used_tokens) <= 2 * (prompt_len + 300)


def test_the_driver_stops_with_an_error_when_its_scheduler_starts_nothing(tok, monkeypatch):
    """Every event comes from a request or tool call in flight: with none and a scheduler that
    places nothing, the loop would wait forever. It raises instead, saying how many were left."""
    from rstar2cli.scheduler.scheduler import Scheduler

    monkeypatch.setattr(Scheduler, "schedule", lambda self: [])
    items = [{"id": "q", "sample": s, "question": "Q", "answer": "1"} for s in range(2)]
    engine = ScriptedEngine(tok, {}, capacity_tokens=4096)

    async def go():
        async with LocalSandbox(num_workers=1, timeout_s=5.0) as sandbox:
            run = run_rollout(
                engines=[engine],
                items=items,
                tokenizer=tok,
                agent_config=AgentConfig(max_response_tokens=64),
                sched_config=SchedulerConfig(),
                tools=ToolBatcher(sandbox),
                on_record=lambda rec: None,
            )
            return await asyncio.wait_for(run, timeout=30)

    with pytest.raises(RuntimeError, match="placed none of the 2 unfinished trajectories"):
        asyncio.run(go())
    assert engine.requests == []


def test_the_shared_prompt_prefix_is_what_every_rendered_prompt_starts_with(tok):
    shared = shared_prompt_prefix(tok)
    prompts = [prompt_ids_for(q, tok) for q in ("What is 2+2?", "Solve x^2=4.", "7 * 6")]
    assert all(p[:shared] == prompts[0][:shared] for p in prompts)
    assert len({p[shared] for p in prompts}) > 1  # one token further, they part
    assert shared > 10  # the system prompt
