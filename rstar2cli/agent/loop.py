"""The multi-turn agent loop: one trajectory's state, from prompt to the trajectory record.

Per trajectory (the paper's multi-turn rollout, arXiv 2508.20722 section 2): generate -> parse
the turn -> run the tool call in the sandbox -> append the masked tool-response chunk -> generate
again, until a stop rule fires:

- a finished turn with no tool call: finish "answer" if the model wrote an `<answer>` tag, else
  "no_answer";
- a tool call in turn `max_turns`: finish "max_turns" (the call is not run);
- the response budget spent (model tokens and tool chunks both count, so prompt + response never
  exceeds prompt + `max_response_tokens`, the reservation the scheduler makes): finish "budget";
- the engine failing a request: finish "engine_error" (an engine that died, `errors.EngineDead`,
  or refused the request, a `UserError`, is raised to the caller instead: every request after it
  would fail too).

`Trajectory` is a synchronous state machine: the caller sends it engine outputs
(`on_generated`) and tool results (`on_tool_result`) and reads what to do next (`Next`). Who
generates where and when is the scheduler's business (`rstar2cli.rollout.driver`);
`run_trajectory` here is the plain sequential driver for one engine (tests, small evals).
A generation cut short by `max_tokens` while budget is left (the scheduler's per-turn step) is
continued as the same turn. History is never re-rendered: token ids are appended
(`protocol.TrajectoryLayout`); tool chunks are tokenized with `add_special_tokens=False`.

Each record carries what the trainer needs to correct for the engine (rstar2cli/rl/correction.py):
`rollout_logprobs`, one float per `response_ids` entry, the engine's log-probability of each
model-sampled token under the distribution it was drawn from (its temperature and top-p; 0.0 for
tool-output tokens; None when the engine gave none), and `turn_versions`, the policy version
(`AgentConfig.policy_version`: in rl-stage, the number of updates the engine's weights have had)
of each model turn; a turn continued across an update (partial rollout) gets its first
version, and `stale_tokens` counts the response tokens made before the current version.

Tools run through a `ToolBatcher` over a `ToolRunner` (rstar2cli/agent/tools.py).

Tested in tests/unit/test_agent_loop.py (scripted engine + a real LocalSandbox).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rstar2cli import protocol as P
from rstar2cli.agent.tools import TOOL_TIMEOUT_S, ToolBatcher
from rstar2cli.errors import UserError
from rstar2cli.records import ToolCallRecord, TrajectoryRecord
from sandboxd.wire import Job, JobResult

FINISH_REASONS = ("answer", "no_answer", "max_turns", "budget", "engine_error")


class Next:
    """What the caller does next with a trajectory."""

    GENERATE = "generate"
    TOOL = "tool"
    DONE = "done"


def sample_seed(base: int, problem_id: object, sample: int, turn: int) -> int:
    """Per-request sampling seed: distinct per (problem, sample, turn), reproducible across runs.

    NOTE: the problem id is hashed in (crc32, stable across processes unlike hash()) so that sample
    s of different problems does not share one random stream.
    """
    problem_key = zlib.crc32(str(problem_id).encode("utf-8"))
    return (base * 1_000_003 + problem_key) % 2**31 + 1000 * sample + turn


@dataclass
class AgentConfig:
    """One trajectory's rules. The defaults are the paper's stage-1 RL rollouts (section 5)."""

    max_turns: int = 10
    max_response_tokens: int = 8192
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    template: str = "paper"
    # Tool-output truncation (release: 256 characters, middle); None keeps everything.
    max_tool_output_chars: int | None = 256
    tool_truncate_side: str = "middle"
    tool_timeout_s: float = TOOL_TIMEOUT_S
    # Ask engines for each sampled token's log-probability (the record's rollout_logprobs);
    # benchmarks/rollout_logprobs.py measures what it costs.
    want_logprobs: bool = True
    # The weights' version the engines sample with (rl-stage: updates applied so far).
    policy_version: int = 0

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_response_tokens < 1:
            raise ValueError(f"max_response_tokens must be >= 1, got {self.max_response_tokens}")


class Trajectory:
    """One rollout of one question: the token layout plus the stop rules."""

    def __init__(
        self, item: dict[str, Any], prompt_ids: list[int], tokenizer: Any, config: AgentConfig
    ):
        self.item = item  # needs "id", "sample", "question"; "answer" when known
        self.config = config
        self.tokenizer = tokenizer
        self.stop_id = tokenizer.convert_tokens_to_ids(P.IM_END)
        self.layout = P.TrajectoryLayout(list(prompt_ids))
        self.num_turns = 0
        self.model_text = ""  # decoded model turns only (tool outputs never count as answers)
        self.tool_calls: list[ToolCallRecord] = []
        self.pending_call: P.ToolCall | None = None
        self.finish_reason: str | None = None
        self.stale_tokens = 0  # response tokens made before the run it is in (partial rollout)
        # per response token; None once an engine output came without log-probs
        self.rollout_logprobs: list[float] | None = []
        self.turn_versions: list[int] = []  # per model turn: the policy version that began it
        self._turn_ids: list[int] = []
        self._turn_version: int | None = None  # the version that began the turn in progress
        self._last_max_tokens = 0

    # -- partial rollout: a trajectory cut between requests, as JSON and back ---------------------

    def state(self) -> dict[str, Any]:
        """What `from_state` needs to go on with this trajectory: it must be cut between requests
        (no tool call pending), as `driver.run_rollout`'s `stop_when` leaves it."""
        if self.pending_call is not None or self.done:
            raise RuntimeError("only a trajectory waiting for its next generate request is cut")
        return {
            "item": self.item,
            "prompt_ids": self.layout.prompt_ids,
            "response_ids": self.layout.response_ids,
            "loss_mask": self.layout.loss_mask,
            "num_turns": self.num_turns,
            "model_text": self.model_text,
            "tool_calls": self.tool_calls,
            "turn_ids": self._turn_ids,
            "stale_tokens": self.stale_tokens,
            "rollout_logprobs": self.rollout_logprobs,
            "turn_versions": self.turn_versions,
            "turn_version": self._turn_version,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], tokenizer: Any, config: AgentConfig) -> Trajectory:
        traj = cls(state["item"], state["prompt_ids"], tokenizer, config)
        traj.layout.response_ids = list(state["response_ids"])
        traj.layout.loss_mask = list(state["loss_mask"])
        traj.num_turns = int(state["num_turns"])
        traj.model_text = str(state["model_text"])
        traj.tool_calls = list(state["tool_calls"])
        traj._turn_ids = list(state["turn_ids"])
        traj.stale_tokens = int(state["stale_tokens"])
        # NOTE: a carry saved before log-probs were recorded has none (its tokens get no correction)
        logprobs = state.get("rollout_logprobs")
        traj.rollout_logprobs = None if logprobs is None else [float(x) for x in logprobs]
        traj.turn_versions = [int(v) for v in state.get("turn_versions", [])]
        traj._turn_version = state.get("turn_version")
        return traj

    # -- what the engine needs --------------------------------------------------------------------

    @property
    def context_ids(self) -> list[int]:
        return self.layout.all_ids

    @property
    def num_tokens(self) -> int:
        return len(self.layout.prompt_ids) + len(self.layout.response_ids)

    @property
    def remaining_tokens(self) -> int:
        return self.config.max_response_tokens - len(self.layout.response_ids)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def sampling_spec(self, max_tokens: int | None = None) -> Any:
        from rstar2cli.engines.base import SamplingSpec

        cap = (
            self.remaining_tokens if max_tokens is None else min(max_tokens, self.remaining_tokens)
        )
        self._last_max_tokens = cap
        seed = (
            None
            if self.config.seed is None
            else sample_seed(
                self.config.seed,
                self.item.get("id", ""),
                int(self.item.get("sample", 0)),
                self.num_turns,
            )
        )
        return SamplingSpec(
            max_tokens=cap,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            seed=seed,
            stop_token_ids=[self.stop_id],
            want_logprobs=self.config.want_logprobs,
        )

    # -- events -----------------------------------------------------------------------------------

    def on_generated(self, out: Any) -> str:
        """Take one engine output (`GenOutput`); return Next.GENERATE, TOOL or DONE."""
        if out.finish_reason in ("error", "abort"):
            return self.finish("engine_error")
        ids = list(out.token_ids)[: max(self.remaining_tokens, 0)]
        if self._turn_version is None:  # the first request of a model turn
            self._turn_version = self.config.policy_version
        self._add_logprobs(out.logprobs, len(ids))
        self.layout.add_model_tokens(ids)
        self._turn_ids += ids
        ended = bool(ids) and ids[-1] == self.stop_id
        if not ended and out.finish_reason == "length":
            if self.remaining_tokens <= 0 or len(ids) < self._last_max_tokens:
                return self.finish("budget")  # budget spent, or the engine's context limit
            return Next.GENERATE  # cut by the scheduler's step: continue the same turn
        return self._end_turn()

    def _add_logprobs(self, logprobs: list[float] | None, num_tokens: int) -> None:
        if self.rollout_logprobs is None:
            return
        if logprobs is None or len(logprobs) < num_tokens:
            self.rollout_logprobs = None  # not asked for, or an engine that gives none
            return
        self.rollout_logprobs += [float(x) for x in logprobs[:num_tokens]]

    def tool_job(self) -> Job | None:
        """The sandbox job for the pending call; None for a malformed call (answered locally)."""
        call = self.pending_call
        if call is None or call.error is not None:
            return None
        return Job(code=call.code, stdin=call.stdin, timeout_s=self.config.tool_timeout_s)

    def on_tool_result(self, result: JobResult | None) -> str:
        """Append the tool-response chunk for the pending call; None means a parse error."""
        call = self.pending_call
        if call is None:
            raise RuntimeError("no tool call is pending")
        self.pending_call = None
        if result is None:
            status, stdout, stderr, duration_s = "parse_error", "", call.error or "", 0.0
        else:
            status, stdout, stderr, duration_s = (
                result.status,
                result.stdout,
                result.stderr,
                result.duration_s,
            )
        self.tool_calls.append(
            {"status": status, "duration_s": duration_s, "code": call.code or call.raw}
        )
        text = P.format_tool_output(
            status=status,
            stdout=stdout,
            stderr=stderr,
            max_chars=self.config.max_tool_output_chars,
            side=self.config.tool_truncate_side,
        )
        chunk = P.render_tool_response(text, self.config.template)
        ids = self.tokenizer.encode(chunk, add_special_tokens=False)
        if len(ids) >= self.remaining_tokens:
            return self.finish("budget")  # NOTE: no room for the answer and one more token
        self.layout.add_tool_chunk(ids)
        if self.rollout_logprobs is not None:
            self.rollout_logprobs += [0.0] * len(ids)  # NOTE: tool output is not sampled
        return Next.GENERATE

    def _count_turn(self) -> None:
        self.num_turns += 1
        version = self._turn_version
        self.turn_versions.append(self.config.policy_version if version is None else version)
        self._turn_version = None

    def _end_turn(self) -> str:
        self._count_turn()
        turn_text = self.tokenizer.decode(self._turn_ids, skip_special_tokens=False)
        self._turn_ids = []
        self.model_text += turn_text
        calls = P.parse_tool_calls(turn_text, max_calls=1)
        if not calls:
            return self.finish("answer" if self.num_answer_tags else "no_answer")
        if self.num_turns >= self.config.max_turns:
            return self.finish("max_turns")
        if self.remaining_tokens <= 0:
            return self.finish("budget")
        self.pending_call = calls[0]
        return Next.TOOL

    def finish(self, reason: str) -> str:
        if self._turn_ids:  # a turn cut short (budget) still counts, and its text is kept
            self._count_turn()
            self.model_text += self.tokenizer.decode(self._turn_ids, skip_special_tokens=False)
            self._turn_ids = []
        self.finish_reason = reason
        self.pending_call = None
        return Next.DONE

    # -- output -----------------------------------------------------------------------------------

    @property
    def num_answer_tags(self) -> int:
        """`<answer>` tags the model wrote itself, outside its tool calls."""
        return P.count_answer_tags(P.answer_region(self.model_text))

    def record(self) -> TrajectoryRecord:
        """The trajectory record (`rstar2cli.records`); "reward" is added by whoever grades it
        (`rstar2cli.rollout.jobs`). Only a finished trajectory has one.

        `text` is the whole response (tool outputs included), for reading; `model_text` is only
        what the model wrote (loss mask 1), the only text an answer is ever taken from.
        """
        if self.finish_reason is None:
            raise RuntimeError("a trajectory has a record only once it is done")
        text = self.tokenizer.decode(self.layout.response_ids, skip_special_tokens=False)
        record: TrajectoryRecord = {
            "id": self.item["id"],
            "sample": self.item.get("sample", 0),
            "question": self.item["question"],
            "answer": self.item.get("answer"),
            "prompt_ids": self.layout.prompt_ids,
            "response_ids": self.layout.response_ids,
            "loss_mask": self.layout.loss_mask,
            "text": text,
            "model_text": self.model_text,
            "tool_calls": self.tool_calls,
            "num_turns": self.num_turns,
            "num_answer_tags": self.num_answer_tags,
            "finish_reason": self.finish_reason,
            "extracted": P.extract_answer(P.answer_region(self.model_text)),
            "rollout_logprobs": self.rollout_logprobs,
            "turn_versions": self.turn_versions,
        }
        if "group" in self.item:  # partial rollout: its prompt instance, its tokens made earlier
            record["group"] = self.item["group"]
            record["stale_tokens"] = self.stale_tokens
        return record


def prompt_ids_for(question: str, tokenizer: Any, template: str = "paper") -> list[int]:
    return tokenizer.encode(P.render_prompt(question, template), add_special_tokens=False)


def common_prefix(seqs: list[list[int]]) -> int:
    """How many leading tokens every one of `seqs` has in common (0 for none)."""
    if not seqs:
        return 0
    n = 0
    while all(len(s) > n and s[n] == seqs[0][n] for s in seqs):
        n += 1
    return n


def shared_prompt_prefix(tokenizer: Any, template: str = "paper") -> int:
    """Tokens every rendered prompt starts with (the template's system prompt and the user
    turn's opening), probed with questions that differ in their first character."""
    return common_prefix([prompt_ids_for(q, tokenizer, template) for q in ("0", "A", "?")])


def longest_prompt_tokens(questions: Iterable[str], tokenizer: Any, template: str = "paper") -> int:
    """Tokens of the longest rendered prompt: engines size `max_model_len` from it."""
    return max(len(prompt_ids_for(q, tokenizer, template)) for q in set(questions))


async def run_trajectory(
    traj: Trajectory, engine: Any, tools: ToolBatcher, request_id: str
) -> TrajectoryRecord:
    """Drive one trajectory to the end on one engine (no scheduler); returns its record."""
    step = 0
    nxt = Next.GENERATE
    while nxt != Next.DONE:
        if nxt == Next.GENERATE:
            try:
                out = await engine.generate(
                    f"{request_id}-{step}", traj.context_ids, traj.sampling_spec()
                )
            except UserError:  # the engine died or refused: no later request can succeed
                raise
            except Exception:  # a failed request ends this trajectory only
                traj.finish("engine_error")
                break
            step += 1
            nxt = traj.on_generated(out)
        else:
            job = traj.tool_job()
            nxt = traj.on_tool_result(await tools.run(job) if job is not None else None)
    return traj.record()
