"""What `rstar2 check-model` checks: can a model folder be trained and served with the protocol.

The agent loop never renders history through a chat template: it tokenizes the protocol's prompt
(`protocol.render_prompt`), appends the model's sampled ids, then each tool-response chunk
(`protocol.render_tool_response`) tokenized on its own. A model trained that way sees the same
context at serving time only when its own chat template, fed the same conversation, produces
those tokens. `check_model_dir` runs these checks on one folder, each a `Check` row:
- config: config.json loads (`AutoConfig`);
- tokenizer: the tokenizer loads (`AutoTokenizer`);
- system prompt: the template renders the protocol's system and user turns as the protocol does;
- tool turn: the template renders an assistant turn with a tool call and its tool response as the
  protocol appends them (as a `tool` message, or a `user` message holding `<tool_response>`);
- append-only: over two tool rounds, the template's rendering after an assistant and a tool turn
  begins, token for token, with its rendering before them followed by the model's own turn;
- stop token: `<|im_end|>` is one token and the template ends an assistant turn with it;
- context: the model's positions hold the recipe's budget (`Budget`).

What it does not do: load weights or generate (a template is checked, not the model's skill), or
print (the command does). Tested in tests/cli/test_check_model.py on the tiny model, SmolLM2 and
a folder whose template drops earlier reasoning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar2cli import protocol as P
from rstar2cli.errors import first_line

OK, NOTE, PROBLEM = "ok", "note", "problem"
QUESTION = "What is 6 times 7?"
# Two tool rounds: the model's text after the assistant prefix, and what the tool printed.
ROUNDS = (
    ("I will compute it.\n" + P.format_tool_call("print(6 * 7)"), "42"),
    ("Let me check it another way.\n" + P.format_tool_call("print(7 * 6)"), "42"),
)


@dataclass(frozen=True)
class Check:
    """One row of the report; `status` is OK, NOTE (worth knowing, not a problem) or PROBLEM."""

    name: str
    status: str
    detail: str


@dataclass(frozen=True)
class Budget:
    """The longest sequence a recipe asks of the model, and where that number comes from."""

    source: str
    need_tokens: int
    what: str
    max_prompt_tokens: int | None = None


def check_model_dir(model_dir: Path, *, template: str, budget: Budget | None) -> list[Check]:
    """Every check on `model_dir`, in report order. Nothing raises: a failure is a row."""
    checks, config = _load_config(model_dir)
    tokenizer_check, tokenizer = _load_tokenizer(model_dir)
    checks.append(tokenizer_check)
    if tokenizer is not None:
        checks += _template_checks(tokenizer, template)
    checks.append(_context_check(config, tokenizer, template=template, budget=budget))
    return checks


def _load_config(model_dir: Path) -> tuple[list[Check], Any]:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(model_dir))
    except Exception as exc:  # a missing file, bad JSON or an unknown model_type
        return [Check("config", PROBLEM, f"config.json does not load: {first_line(exc)}")], None
    return [Check("config", OK, f"{config.model_type}, {_positions(config)} positions")], config


def _positions(config: Any) -> int | None:
    text = getattr(config, "text_config", None) or config
    value = getattr(text, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def _load_tokenizer(model_dir: Path) -> tuple[Check, Any]:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:  # missing files, or a tokenizer class this transformers lacks
        return Check("tokenizer", PROBLEM, f"the tokenizer does not load: {first_line(exc)}"), None
    return Check("tokenizer", OK, f"{type(tokenizer).__name__}, {len(tokenizer)} tokens"), tokenizer


# ---------------------------------------------------------------------------------------------
# The chat template against the protocol


def _template_checks(tokenizer: Any, template: str) -> list[Check]:
    if not getattr(tokenizer, "chat_template", None):
        what = "the tokenizer has no chat template, so no server can render the protocol's turns"
        return [Check("system prompt", PROBLEM, what)]
    tool_check, tool_message = _tool_turn_check(tokenizer, template)
    return [
        _system_prompt_check(tokenizer, template),
        tool_check,
        _append_only_check(tokenizer, template, tool_message),
        _stop_check(tokenizer, template),
    ]


def _opening(template: str) -> list[dict[str, str]]:
    user = P.USER_TEMPLATE.format(question=QUESTION)
    if template == "release":
        user += P.RELEASE_USER_SUFFIX
    return [
        {"role": "system", "content": P.system_text(template)},
        {"role": "user", "content": user},
    ]


def _tool_messages(output: str) -> dict[str, dict[str, str]]:
    """The two ways a template may take a tool response, by the name the report gives them."""
    wrapped = f"{P.TOOL_RESPONSE_OPEN}\n{output}\n{P.TOOL_RESPONSE_CLOSE}"
    return {
        "a tool message": {"role": "tool", "content": output},
        "a user message holding <tool_response>": {"role": "user", "content": wrapped},
    }


def _conversation(template: str, num_rounds: int, tool_message: str) -> list[dict[str, str]]:
    messages = _opening(template)
    for text, output in ROUNDS[:num_rounds]:
        messages.append({"role": "assistant", "content": P.assistant_prefix(template) + text})
        messages.append(_tool_messages(output)[tool_message])
    return messages


def render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The template's text for `messages` with the generation prompt (jinja errors propagate)."""
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def _protocol_text(template: str, num_rounds: int) -> str:
    """What the agent loop's context holds after `num_rounds` tool rounds, without the last
    assistant prefix (a template's generation prompt stops before it)."""
    text = P.render_prompt(QUESTION, template)
    for turn, output in ROUNDS[:num_rounds]:
        text += turn + P.IM_END + P.render_tool_response(output, template)
    prefix = P.assistant_prefix(template)
    return text[: len(text) - len(prefix)]


def _mismatch(got: Sequence[Any], want: Sequence[Any]) -> int:
    """The first index where two sequences differ (the shorter one's length if one is a prefix)."""
    pairs = zip(got, want, strict=False)
    return next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(got), len(want)))


def _first_difference(got: str, want: str) -> str:
    at = _mismatch(got, want)
    return (
        f"at character {at}: the template has {got[at : at + 30]!r}, "
        f"the protocol {want[at : at + 30]!r}"
    )


def _system_prompt_check(tokenizer: Any, template: str) -> Check:
    name = "system prompt"
    try:
        got = render(tokenizer, _opening(template))
    except Exception as exc:  # a template that refuses a system turn raises from jinja
        return Check(name, PROBLEM, f"the template fails on a system turn: {first_line(exc)}")
    want = _protocol_text(template, num_rounds=0)
    if got != want:
        return Check(
            name,
            PROBLEM,
            "the template renders the protocol's prompt differently "
            + _first_difference(got, want),
        )
    return Check(name, OK, f"renders the protocol's {template} prompt exactly")


def _tool_turn_check(tokenizer: Any, template: str) -> tuple[Check, str]:
    """The row, and the tool-message form the append-only check should use."""
    name, want, failures = "tool turn", _protocol_text(template, num_rounds=1), []
    for form in _tool_messages("42"):
        try:
            got = render(tokenizer, _conversation(template, 1, form))
        except Exception as exc:
            failures.append(f"as {form}: {first_line(exc)}")
            continue
        if got == want:
            return Check(name, OK, f"renders the protocol's tool response as {form}"), form
        failures.append(f"as {form}, {_first_difference(got, want)}")
    detail = "the template renders no tool turn as the protocol appends it; " + "; ".join(failures)
    return Check(name, PROBLEM, detail), next(iter(_tool_messages("42")))


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _append_only_check(tokenizer: Any, template: str, tool_message: str) -> Check:
    name, prefix = "append-only", P.assistant_prefix(template)
    try:
        served = [
            _ids(tokenizer, render(tokenizer, _conversation(template, n, tool_message)) + prefix)
            for n in range(len(ROUNDS) + 1)
        ]
    except Exception as exc:
        return Check(name, PROBLEM, f"the template fails on a tool conversation: {first_line(exc)}")
    for n, (turn, _) in enumerate(ROUNDS):
        expected = served[n] + _ids(tokenizer, turn) + _ids(tokenizer, P.IM_END)
        after = served[n + 1][: len(expected)]
        if after != expected:
            at = _mismatch(after, expected)
            shown = tokenizer.decode(served[n + 1][at : at + 8])
            want = tokenizer.decode(expected[at : at + 8])
            return Check(
                name,
                PROBLEM,
                f"after tool round {n + 1} the template re-renders the context: token {at} is "
                f"{shown!r} where the model's appended tokens have {want!r}, so a model trained "
                "on appended tokens is served another context",
            )
    return Check(
        name,
        OK,
        f"{len(ROUNDS)} tool rounds: each rendering extends the one before, token for token",
    )


def _stop_check(tokenizer: Any, template: str) -> Check:
    name, stop_ids = "stop token", _ids(tokenizer, P.IM_END)
    if len(stop_ids) != 1:
        return Check(
            name,
            PROBLEM,
            f"{P.IM_END} is {len(stop_ids)} tokens here; the engines stop a turn on its one id",
        )
    turn = P.assistant_prefix(template) + ROUNDS[0][0]
    try:
        text = render(tokenizer, [*_opening(template), {"role": "assistant", "content": turn}])
    except Exception as exc:
        return Check(name, PROBLEM, f"the template fails on an assistant turn: {first_line(exc)}")
    if turn + P.IM_END not in text:
        return Check(name, PROBLEM, f"the template does not end an assistant turn with {P.IM_END}")
    eos = _eos_ids(tokenizer)
    if stop_ids[0] not in eos:
        return Check(
            name,
            NOTE,
            f"{P.IM_END} (id {stop_ids[0]}) ends a turn; the tokenizer's end-of-sequence ids are "
            f"{sorted(eos)}: rstar2's engines stop on {P.IM_END} anyway, other servers may not",
        )
    return Check(name, OK, f"{P.IM_END} (id {stop_ids[0]}) ends a turn and is end-of-sequence")


def _eos_ids(tokenizer: Any) -> set[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return {eos} if isinstance(eos, int) else set()


# ---------------------------------------------------------------------------------------------
# Context length


def _context_check(config: Any, tokenizer: Any, *, template: str, budget: Budget | None) -> Check:
    name = "context"
    positions = _positions(config) if config is not None else None
    if budget is None:
        return Check(name, NOTE, f"{positions} positions; no recipe given, nothing to compare")
    if positions is None:
        return Check(
            name,
            NOTE,
            f"the config gives no max_position_embeddings; {budget.source} needs "
            f"{budget.need_tokens}",
        )
    prompt_note = ""
    if tokenizer is not None and budget.max_prompt_tokens is not None:
        prompt = len(_ids(tokenizer, P.render_prompt("", template)))
        if prompt >= budget.max_prompt_tokens:
            return Check(
                name,
                PROBLEM,
                f"the protocol's prompt alone takes {prompt} tokens, and {budget.source} allows "
                f"prompts of {budget.max_prompt_tokens}",
            )
        prompt_note = f"; the protocol's prompt takes {prompt} of its {budget.max_prompt_tokens}"
    if budget.need_tokens > positions:
        return Check(
            name,
            PROBLEM,
            f"{budget.source} needs {budget.need_tokens} tokens ({budget.what}), and the model "
            f"has {positions} positions (max_position_embeddings)",
        )
    used = f"{budget.need_tokens} of {positions} positions ({budget.what}, {budget.source})"
    return Check(name, OK, used + prompt_note)
