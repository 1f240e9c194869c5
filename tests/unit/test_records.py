"""The trajectory record types (rstar2cli/records.py) against what the code really produces.

The real agent loop runs on the scripted engine (tests/unit/scripted.py) with tools in a real
`LocalSandbox`, and the real `GradedSink` grades with the real `Grader`; every record must have
exactly the keys its TypedDict declares, each value of the declared type, and survive JSON.
"""

from __future__ import annotations

import asyncio
import copy
import json
import types
from typing import Any, Union, get_args, get_origin

import pytest
from scripted import ScriptedEngine
from typing_extensions import get_type_hints, is_typeddict

from rstar2cli import protocol as P
from rstar2cli.agent.loop import AgentConfig
from rstar2cli.agent.tools import ToolBatcher
from rstar2cli.data.tiny import build_tokenizer
from rstar2cli.records import GradedRecord, TrajectoryRecord
from rstar2cli.reward.grader import Grader
from rstar2cli.rollout.jobs import GradedSink, in_item_order, rollout_and_grade, seed_base
from rstar2cli.scheduler.scheduler import SchedulerConfig
from sandboxd.pool import LocalSandbox

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CALL = "Let me compute.\n" + P.format_tool_call("print(37*41+5)") + P.IM_END
BAD_CALL = "<tool_call>\nnot json\n</tool_call>" + P.IM_END  # a parse error: never run
ANSWER = "</reason>\n<answer>\\boxed{1522}</answer>" + P.IM_END
WRONG = "</reason>\n<answer>\\boxed{7}</answer>" + P.IM_END
QUESTION = "Compute 37*41+5."
# item i's requests are t{i}-s{step}: a tool call then the answer; no reference answer; a
# partial-rollout instance whose call does not parse and whose answer is wrong
ITEMS: list[dict[str, Any]] = [
    {"id": "q1", "sample": 0, "question": QUESTION, "answer": "1522"},
    {"id": "q2", "sample": 0, "question": QUESTION, "answer": None},
    {"id": "q3", "sample": 1, "question": QUESTION, "answer": "1522", "group": "0.0"},
]
SCRIPTS = {"t0": [CALL, ANSWER], "t1": [ANSWER], "t2": [BAD_CALL, WRONG]}
PARTIAL_KEYS = {"group", "stale_tokens"}
GRADE_KEYS = {"reward", "correct", "grade_status"}
EVAL_KEYS = {"label", "benchmark", "num_response_tokens"}


@pytest.fixture(scope="module")
def produced():
    """(the records the agent loop handed over, the rows the sink graded), in item order."""
    tok = build_tokenizer()
    raw: list[dict[str, Any]] = []

    async def go():
        async with LocalSandbox(num_workers=1, timeout_s=5.0) as sandbox:
            with Grader(num_workers=1, strict=True) as grader:
                sink = GradedSink(grader, flush_every=None)
                await rollout_and_grade(
                    [ScriptedEngine(tok, {k: list(v) for k, v in SCRIPTS.items()})],
                    [dict(it) for it in ITEMS],
                    tok,
                    AgentConfig(max_turns=4, max_response_tokens=600, seed=seed_base(0)),
                    SchedulerConfig(),
                    ToolBatcher(sandbox),
                    sink,
                    on_record=lambda r: raw.append(copy.deepcopy(r)),
                )
                return sink.rows

    rows = asyncio.run(go())
    return in_item_order(raw, ITEMS), in_item_order(rows, ITEMS)


def conforms(value: object, hint: Any) -> bool:
    """Is `value` of the declared type `hint` (the few forms records use)?"""
    if get_origin(hint) in (Union, types.UnionType):
        return any(conforms(value, arg) for arg in get_args(hint))
    if get_origin(hint) is list:
        (item,) = get_args(hint)
        return isinstance(value, list) and all(conforms(v, item) for v in value)
    if is_typeddict(hint):
        return isinstance(value, dict) and typed_dict_problems(value, hint, set()) == []
    if hint is type(None):
        return value is None
    if hint in (int, float):  # a bool is not a count, an int is not a float
        return type(value) is hint
    return isinstance(value, hint)


def typed_dict_problems(row: dict, td: Any, present_optional: set[str]) -> list[str]:
    """What is wrong with `row` as a `td`: keys other than the required ones plus
    `present_optional`, and values not of their declared types."""
    assert present_optional <= td.__optional_keys__
    problems = []
    expected = td.__required_keys__ | present_optional
    if set(row) != expected:
        problems.append(f"keys: missing {expected - set(row)}, extra {set(row) - expected}")
    hints = get_type_hints(td)
    for key, value in row.items():
        if key in hints and not conforms(value, hints[key]):
            problems.append(f"{key}={value!r} is not {hints[key]}")
    return problems


def test_the_types_declare_which_keys_only_some_records_have():
    assert TrajectoryRecord.__optional_keys__ == PARTIAL_KEYS
    assert GradedRecord.__required_keys__ == TrajectoryRecord.__required_keys__
    assert GradedRecord.__optional_keys__ == PARTIAL_KEYS | GRADE_KEYS | EVAL_KEYS


def test_the_agent_loop_makes_exactly_a_trajectory_record(produced):
    raw, _ = produced
    assert [r["id"] for r in raw] == ["q1", "q2", "q3"]
    for record, optional in zip(raw, [set(), set(), PARTIAL_KEYS], strict=True):
        assert typed_dict_problems(record, TrajectoryRecord, optional) == []
    assert [c["status"] for r in raw for c in r["tool_calls"]] == ["ok", "parse_error"]


def test_the_sink_makes_exactly_a_graded_record(produced):
    _, rows = produced
    assert [(r["id"], r.get("reward")) for r in rows] == [("q1", 1.0), ("q2", None), ("q3", 0.0)]
    for row, optional in zip(rows, [GRADE_KEYS, set(), GRADE_KEYS | PARTIAL_KEYS], strict=True):
        assert typed_dict_problems(row, GradedRecord, optional) == []


def test_records_round_trip_through_json(produced):
    for row in [*produced[0], *produced[1]]:
        assert json.loads(json.dumps(row)) == row
