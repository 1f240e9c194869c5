"""The rollout job every command shares: items and seeds, the graded sink, and the reward leak.

The engine is the scripted test double (tests/unit/scripted.py); the tools run in a real
`LocalSandbox` and grading uses the real `Grader`, so a tool that prints a boxed answer really
prints it into the trajectory, and the real reward decides what it earns.
"""

from __future__ import annotations

import asyncio

import pytest
from scripted import ScriptedEngine

from rstar2cli import protocol as P
from rstar2cli.agent.loop import AgentConfig
from rstar2cli.agent.tools import ToolBatcher
from rstar2cli.data.tiny import build_tokenizer
from rstar2cli.errors import EngineDead, UserError
from rstar2cli.reward.grader import Grader
from rstar2cli.rollout.jobs import (
    GradedSink,
    graded_text,
    in_item_order,
    make_items,
    rollout_and_grade,
    seed_base,
)
from rstar2cli.scheduler.scheduler import SchedulerConfig
from sandboxd.pool import LocalSandbox

ITEM = {"id": "q1", "question": "Compute 12*7+5.", "answer": "89"}
# the tool prints a whole answer block: it lands in the masked tool chunk, never in the model text
LEAKY_CALL = P.format_tool_call('print("<answer>\\\\boxed{89}</answer>")') + P.IM_END
NO_ANSWER = "</reason>\nThe tool said it." + P.IM_END
OWN_ANSWER = "</reason>\n<answer>\\boxed{89}</answer>" + P.IM_END


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _roll(tok, turns: list[str], num_samples: int = 1) -> list[dict]:
    engine = ScriptedEngine(tok, {"*": list(turns)})
    items = make_items([ITEM], num_samples)

    async def go():
        sandbox = LocalSandbox(num_workers=1, timeout_s=5.0)
        try:
            with Grader(num_workers=1, strict=True) as grader:
                sink = GradedSink(grader, flush_every=None)
                await rollout_and_grade(
                    [engine],
                    items,
                    tok,
                    AgentConfig(max_turns=4, max_response_tokens=600, seed=seed_base(0)),
                    SchedulerConfig(),
                    ToolBatcher(sandbox),
                    sink,
                )
                return in_item_order(sink.rows, items)
        finally:
            await sandbox.close()

    return asyncio.run(go())


def test_a_tool_that_prints_the_answer_earns_nothing(tok):
    (rec,) = _roll(tok, [LEAKY_CALL, NO_ANSWER])
    assert [c["status"] for c in rec["tool_calls"]] == ["ok"]
    assert "<answer>\\boxed{89}</answer>" in rec["text"]  # the tool output is in the trajectory
    assert "\\boxed{89}</answer>\n</tool_response>" in rec["text"]
    assert rec["finish_reason"] == "no_answer" and rec["num_answer_tags"] == 0
    assert rec["reward"] == 0.0 and rec["correct"] is False and rec["grade_status"] == "no_answer"


def test_the_same_answer_written_by_the_model_earns_the_reward(tok):
    # the control: same call, then the model writes the answer itself
    (rec,) = _roll(tok, [LEAKY_CALL, OWN_ANSWER])
    assert rec["finish_reason"] == "answer" and rec["reward"] == 1.0 and rec["extracted"] == "89"


def test_an_answer_inside_the_models_own_tool_code_is_not_an_answer(tok):
    code_only = P.format_tool_call('x = "<answer>\\\\boxed{89}</answer>"') + P.IM_END
    (rec,) = _roll(tok, [code_only, NO_ANSWER])
    assert "\\boxed{89}" in rec["model_text"]  # the model wrote it, inside its tool call
    assert graded_text(rec).count("boxed") == 0
    assert rec["num_answer_tags"] == 0 and rec["reward"] == 0.0


def test_an_engine_that_dies_stops_the_run_keeping_only_what_finished_before_it(tok):
    # one request at a time: three trajectories finish, the fourth request finds the engine dead
    engine = ScriptedEngine(tok, {"*": [OWN_ANSWER]}, die_after=3)
    items = make_items([ITEM], 6)

    async def go(sink):
        sandbox = LocalSandbox(num_workers=1, timeout_s=5.0)
        try:
            await rollout_and_grade(
                [engine],
                items,
                tok,
                AgentConfig(max_turns=4, max_response_tokens=600, seed=seed_base(0)),
                SchedulerConfig(max_active_per_engine=1),
                ToolBatcher(sandbox),
                sink,
            )
        finally:
            await sandbox.close()

    with Grader(num_workers=1, strict=True) as grader:
        sink = GradedSink(grader, flush_every=None)
        with pytest.raises(EngineDead, match="engine scripted died"):
            asyncio.run(go(sink))
        sink.flush()
    # the dead engine's requests are not written as finished (a resumed run would skip them)
    assert [(r["sample"], r["finish_reason"], r["reward"]) for r in sink.rows] == [
        (0, "answer", 1.0), (1, "answer", 1.0), (2, "answer", 1.0),
    ]  # fmt: skip
    assert len(engine.requests) == 4


def test_a_sandbox_that_refuses_the_token_stops_the_run_with_no_tool_error(
    tok, tmp_path, monkeypatch
):
    # a real daemon that wants a token, a client sending none: no call can run, so the run stops
    # with one line instead of writing trajectories whose tool calls ended in sandbox_error
    from sandboxd.client import SandboxClient
    from sandboxd.spawn import spawn_daemon

    monkeypatch.delenv("RSTAR2_SANDBOX_TOKEN", raising=False)
    token_file = tmp_path / "sandbox.token"
    token_file.write_text("rollout-job-token-77\n")
    token_file.chmod(0o600)
    # every trajectory (request ids t0-s0, t1-s0, ...) calls the tool first
    engine = ScriptedEngine(tok, {f"t{i}": [LEAKY_CALL, OWN_ANSWER] for i in range(3)})
    items = make_items([ITEM], 3)

    async def go(sink, url):
        async with SandboxClient([url], timeout_s=30.0) as client:
            await rollout_and_grade(
                [engine],
                items,
                tok,
                AgentConfig(max_turns=4, max_response_tokens=600, seed=seed_base(0)),
                SchedulerConfig(),
                ToolBatcher(client),
                sink,
            )

    extra = ("--token-file", str(token_file))
    with spawn_daemon(workers=1, timeout_s=5.0, extra_args=extra) as daemon:
        with Grader(num_workers=1, strict=True) as grader:
            sink = GradedSink(grader, flush_every=None)
            with pytest.raises(UserError, match=f"sandbox at {daemon.url} answered 401") as err:
                asyncio.run(go(sink, daemon.url))
            sink.flush()
    assert "rollout-job-token-77" not in str(err.value)
    assert sink.rows == [] and len(engine.requests) == 3  # each made its call, none went on


def test_items_number_samples_per_problem_and_skip_done():
    probs = [{"id": "a", "question": "x"}, {"id": "b", "question": "y"}]
    items = make_items(probs, 2, done={("a", 1)})
    assert [(i["id"], i["sample"]) for i in items] == [("a", 0), ("b", 0), ("b", 1)]
    # a problem drawn twice in one RL batch keeps (id, sample) unique: its second draw continues
    again = make_items([probs[0], probs[1], probs[0]], 2)
    assert [(i["id"], i["sample"]) for i in again] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("a", 2), ("a", 3),
    ]  # fmt: skip


def test_seed_namespaces_differ_by_seed_step_and_eval_pass():
    bases = {seed_base(0), seed_base(1), seed_base(0, 1), seed_base(0, 0, eval_pass=True)}
    assert len(bases) == 4 and seed_base(3, 7) == seed_base(3, 7)


def test_sink_batches_grades_decorates_and_stops_taking_after_an_interrupt(tok):
    written: list[list[dict]] = []

    def record(i: int, text: str, reason: str = "answer") -> dict:
        return {
            "id": str(i),
            "sample": 0,
            "answer": "7",
            "model_text": text,
            "finish_reason": reason,
        }

    with Grader(num_workers=1, strict=True) as grader:
        sink = GradedSink(
            grader, write=written.append, decorate=lambda r: {**r, "tag": "x"}, flush_every=2
        )
        sink.add(record(0, "<answer>\\boxed{7}</answer>"))
        assert written == []  # below the batch size: buffered
        sink.add(record(1, "<answer>\\boxed{8}</answer>"))
        assert [[r["reward"] for r in batch] for batch in written] == [[1.0, 0.0]]
        sink.add(record(2, "<answer>\\boxed{7}</answer>", reason="budget"))  # truncated -> 0
        sink.close_intake()
        sink.add(record(3, "<answer>\\boxed{7}</answer>"))  # finished after the interrupt
        sink.flush()
    rows = [r for batch in written for r in batch]
    assert [r["id"] for r in rows] == ["0", "1", "2"] and all(r["tag"] == "x" for r in rows)
    assert rows[2]["reward"] == 0.0 and rows[2]["grade_status"] == "truncated"
    assert (sink.num_written, sink.num_correct, sink.num_dropped) == (3, 1, 1)
