"""TRL's GRPOTrainer speaking the project's protocol: prompts, chat template, tool, reward.

GRPOTrainer (trl 1.16) runs a multi-turn tool loop of its own (`_tool_call_loop`): it parses each
model turn with the tokenizer's `response_template` (transformers' response parser), calls the
tool named in each call with its JSON arguments, renders the result as a `tool` message through
the chat template, appends those ids to the turn's ids (no re-tokenisation of the history) and
generates the next turn. What it needs, and what this module gives it:
- `chat_template`: jinja in which a system and a user turn render exactly as
  `rstar2cli.protocol.render_prompt` (the tool block is in the system text, not taken from
  `tools=`), the generation prompt ends with the assistant prefix (`<reason>`), a `tool` message
  renders as the protocol's `<tool_response>` user turn, and rendering only appends, which TRL
  checks (`supports_tool_calling`, `is_chat_template_prefix_preserving`). The chunk TRL appends
  after a calling turn is then byte for byte `protocol.render_tool_response`.
- `RESPONSE_TEMPLATE`: the protocol's `<tool_call>` JSON (`{"name": .., "arguments": {..}}`).
- `make_tool`: the protocol's one tool, `execute_python_code_with_standard_io(code, input)`, run
  by the in-process sandbox pool and answered with `protocol.format_tool_output`.
- `make_reward`: the project's grader on the model's own text (tool output left out, tool calls
  cut out), 0 for a trajectory cut by the budget or by the turn limit, as rl-stage grades.

Where TRL's loop differs from rl-stage's (rstar2cli/agent/loop.py): a malformed tool call (bad
JSON) ends the trajectory there (TRL reads the turn as plain text), where rl-stage answers it with
the parse error and lets the model go on; arguments that do not fit the tool's signature (a
string, a misnamed key) get TRL's `{'error': ...}` where rl-stage gives its own parse error (or
ignores an extra key); TRL runs every call of a turn, rl-stage the first.

What it does not do: import TRL, or train. Tested in tests/unit/test_peer_trl.py.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from rstar2cli import protocol as P
from rstar2cli.reward.grader import Grader

# transformers' response parser: after the last `<|im_start|>assistant\n`, `<tool_call>` blocks
# (JSON) become tool_calls, the rest up to `<|im_end|>` is the content.
RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": f"{P.IM_START}assistant\n",
    "fields": {
        "tool_calls": {
            "open": P.TOOL_CALL_OPEN,
            "close_pattern": re.escape(P.TOOL_CALL_CLOSE) + r"\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": re.escape(P.IM_END) + r"\s*", "content": "text"},
    },
}


def _jinja_text(text: str) -> str:
    """`text` as a jinja string literal (single quotes)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def chat_template(template: str = "paper") -> str:
    """Jinja that renders conversations in the protocol's format (see the module docstring)."""
    prefix = P.assistant_prefix(template)
    im_end = _jinja_text(f"{P.IM_END}\n")
    tool_open = _jinja_text(f"{P.IM_START}user\n{P.TOOL_RESPONSE_OPEN}\n")
    tool_close = _jinja_text(f"\n{P.TOOL_RESPONSE_CLOSE}{P.IM_END}\n")
    call_open, call_close = (
        _jinja_text(f"{P.TOOL_CALL_OPEN}\n"),
        _jinja_text(f"\n{P.TOOL_CALL_CLOSE}"),
    )
    assistant = _jinja_text(f"{P.IM_START}assistant\n{prefix}")
    return (
        "{%- for m in messages -%}"
        "{%- if m.role == 'tool' -%}"
        f"{{{{- {tool_open} + m.content + {tool_close} -}}}}"
        "{%- elif m.role == 'assistant' -%}"
        f"{{{{- {assistant} + (m.content or '') -}}}}"
        "{%- for call in m.tool_calls or [] -%}"
        f"{{{{- {call_open} -}}}}"
        "{{- {'name': call.function.name, 'arguments': call.function.arguments} | tojson -}}"
        f"{{{{- {call_close} -}}}}"
        "{%- endfor -%}"
        f"{{{{- {im_end} -}}}}"
        "{%- else -%}"
        f"{{{{- {_jinja_text(P.IM_START)} + m.role + '\\n' + m.content + {im_end} -}}}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        f"{{%- if add_generation_prompt -%}}{{{{- {assistant} -}}}}{{%- endif -%}}"
    )


def prompt_messages(question: str, template: str = "paper") -> list[dict[str, str]]:
    """The system and user turns `protocol.render_prompt` renders, as chat messages."""
    user = P.USER_TEMPLATE.format(question=question)
    if template == "release":
        user += P.RELEASE_USER_SUFFIX
    return [
        {"role": "system", "content": P.system_text(template)},
        {"role": "user", "content": user},
    ]


def make_tool(
    run: Callable[[Any], Awaitable[Any]], timeout_s: float, max_chars: int | None
) -> Callable[..., Awaitable[str]]:
    """The protocol's tool as TRL calls it (by its name, with the call's JSON arguments); `run`
    executes one `sandboxd.wire.Job` (e.g. `sandboxd.pool.LocalSandbox().run`)."""
    from sandboxd.wire import Job

    async def execute_python_code_with_standard_io(code: str, input: str = "") -> str:
        """Run a Python 3 program and return what it prints.

        Args:
            code: The Python program to run.
            input: Text fed to the program's stdin.
        """
        result = await run(Job(code=code, stdin=input or "", timeout_s=timeout_s))
        return P.format_tool_output(
            status=result.status, stdout=result.stdout, stderr=result.stderr, max_chars=max_chars
        )

    return execute_python_code_with_standard_io


def model_text(completion: list[dict[str, Any]]) -> str:
    """What the model wrote in a TRL completion (its messages): the assistant turns' content,
    the tool messages left out (the parser has already taken the tool calls out)."""
    return "".join(str(m.get("content") or "") for m in completion if m["role"] == "assistant")


def finish_reason(
    completion: list[dict[str, Any]], completion_ids: list[int], eos_token_id: int
) -> str | None:
    """rl-stage's truncation reasons for a TRL completion: "max_turns" when the last turn still
    calls a tool (TRL stopped the loop), "budget" when the last token is not the end of a turn,
    else None (finished)."""
    last = completion[-1] if completion else {}
    if last.get("role") == "assistant" and last.get("tool_calls"):
        return "max_turns"
    if not completion_ids or completion_ids[-1] != eos_token_id:
        return "budget"
    return None


def grade(
    grader: Grader,
    completions: list[list[dict[str, Any]]],
    completion_ids: list[list[int]],
    answers: list[str],
    eos_token_id: int,
) -> list[float]:
    """Binary rewards of TRL completions from the project's grader (strict, truncated -> 0)."""
    texts = [P.answer_region(model_text(c)) for c in completions]
    reasons = [
        finish_reason(completion=c, completion_ids=ids, eos_token_id=eos_token_id)
        for c, ids in zip(completions, completion_ids, strict=True)
    ]
    results = grader.grade_batch(list(zip(texts, answers, strict=True)), reasons)
    return [1.0 if r.correct else 0.0 for r in results]


def make_reward(
    grader: Grader, eos_token_id: int, on_batch: Callable[[list[list[int]]], None]
) -> Callable[..., list[float]]:
    """A GRPOTrainer reward function over `grade`; `on_batch` hears each batch's completion ids
    (tool output included), for the token counts."""

    def rstar2_grader(
        prompts: list[Any],
        completions: list[list[dict[str, Any]]],
        completion_ids: list[list[int]],
        answer: list[str],
        **_: Any,
    ) -> list[float]:
        on_batch(completion_ids)
        return grade(
            grader=grader,
            completions=completions,
            completion_ids=completion_ids,
            answers=[str(a) for a in answer],
            eos_token_id=eos_token_id,
        )

    return rstar2_grader
