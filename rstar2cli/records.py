"""The trajectory record: the one object that travels from rollout to loss, as typed dicts.

`agent.loop.Trajectory.record()` builds a `TrajectoryRecord`; `rollout.jobs.GradedSink` grades it
into a `GradedRecord`; `rl/selection.select` turns graded records into `rl.trainer.TrainSample`s,
and the eval report, `filter-hard` and the quickstart summary read them. On disk a record is one
plain JSON object per line (rollout `--out`, eval `results.jsonl`, rl-stage `carried.json`), and
`read_graded` is where such lines become records again.

What it does not do: build, grade or check records. The types are for the type checker only;
records written by an older version may lack a key, so readers of a record read back from disk
keep their `.get(key, default)`.
Tested in tests/unit/test_records.py (the real agent loop and grader produce exactly these keys).
"""

# NOTE: no `from __future__ import annotations` here: TypedDict reads NotRequired[...] from the
# evaluated annotations, and a string annotation would count as a required key.
from pathlib import Path
from typing import cast

from typing_extensions import NotRequired, TypedDict


class ToolCallRecord(TypedDict):
    """One tool call of a trajectory, in call order."""

    status: str  # the sandbox's structured status ("ok", "error", "timeout", ...; "parse_error")
    duration_s: float  # seconds the sandbox ran it (0.0 for a call that never ran)
    code: str  # the program run; for a call that did not parse, the raw text of the call


class TrajectoryRecord(TypedDict):
    """One finished trajectory of one (problem, sample), as the agent loop leaves it."""

    id: str  # problem id
    sample: int  # sample index within the problem (its own seed stream)
    question: str  # problem text, as rendered into the prompt
    answer: str | None  # reference answer; None for a problem without one (never graded)
    prompt_ids: list[int]  # token ids of the rendered prompt (chat template + generation prompt)
    response_ids: list[int]  # token ids after the prompt: model turns and tool-response chunks
    loss_mask: list[int]  # per response_ids entry: 1 model token, 0 tool-response token
    text: str  # response_ids decoded, tool outputs included (for reading)
    model_text: str  # the model's own turns only (loss mask 1): the only text answers come from
    tool_calls: list[ToolCallRecord]  # every tool call, in order
    num_turns: int  # model turns, a turn cut by the budget included
    num_answer_tags: int  # `<answer>` tags the model wrote outside its tool calls
    finish_reason: str  # one of agent.loop.FINISH_REASONS
    extracted: str | None  # answer read from model_text (the grader's reading replaces it)
    rollout_logprobs: list[float] | None  # per response token: engine log-prob (tool: 0.0); or None
    turn_versions: list[int]  # per model turn: the policy version (updates so far) that began it
    group: NotRequired[str]  # partial rollout only: the prompt instance ("step.i")
    stale_tokens: NotRequired[int]  # partial rollout only: response tokens made in earlier steps


class GradedRecord(TrajectoryRecord):
    """A record after `GradedSink`: graded when it has a reference answer, plus what a command
    adds before writing it."""

    reward: NotRequired[float]  # 1.0 correct, 0.0 otherwise; absent when `answer` is None
    correct: NotRequired[bool]  # the grader's verdict; absent when `answer` is None
    grade_status: NotRequired[str]  # one of reward.grader.GRADE_STATUSES; absent likewise
    label: NotRequired[str]  # eval only: the run's label (a checkpoint's name)
    benchmark: NotRequired[str]  # eval only: the benchmark the problem belongs to
    num_response_tokens: NotRequired[int]  # eval only: len(response_ids)


def read_graded(path: str | Path) -> list[GradedRecord]:
    """The records a run wrote to `path` (JSON lines), as written; a missing file -> []."""
    from rstar2cli.fileio import read_jsonl_if_exists

    # NOTE: the JSON boundary: rows are taken as written, not checked key by key.
    return cast(list[GradedRecord], read_jsonl_if_exists(path))
