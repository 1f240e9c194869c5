"""The chat/tool protocol: prompt text, tool-call parsing, tool-response chunks, answer extraction.

Follows the rStar2-Agent paper (arXiv 2508.20722, section 2 and the appendix prompt): Qwen/Hermes chat format, one Python tool,
`<reason>`/`<answer>` tags, `\\boxed{}` answers. Where the paper and the public release differ the
difference is a `template` setting ("paper" or "release").

What it does not do: tokenize (callers hold the tokenizer) or run code. `TrajectoryLayout` only
appends token ids it is given: history is never re-rendered through a chat template, so the ids the
model produced are exactly the ids trained on.

Tested in tests/unit/test_protocol.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
REASON_OPEN, REASON_CLOSE = "<reason>", "</reason>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
SPECIAL_TOKENS = [
    IM_START,
    IM_END,
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
    REASON_OPEN,
    REASON_CLOSE,
    ANSWER_OPEN,
    ANSWER_CLOSE,
]
TEMPLATES = ("paper", "release")

TOOL_NAME = "execute_python_code_with_standard_io"
TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Run a Python 3 program and return what it prints. The program reads `input` as its "
            "standard input. Use print() to show results."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The Python program to run."},
                "input": {"type": "string", "description": "Text fed to the program's stdin."},
            },
            "required": ["code"],
        },
    },
}

# The user turn is the paper's wording (arXiv 2508.20722, its prompt template).
USER_TEMPLATE = (
    "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. "
    "And your final answer will be extracted automatically by the \\boxed{{}} tag.\n"
    "This is the problem:\n{question}"
)
REASON_INSTRUCTIONS = (
    "You are a helpful assistant that solves math problems. First think inside <reason> </reason> "
    "tags; while thinking you may call the Python tool to compute or check results. Then give the "
    "final answer inside <answer> </answer> tags, with the result in \\boxed{}."
)
TOOLS_BLOCK = (
    "# Tools\n\n"
    "You may call the function below to help with the problem.\n\n"
    "Function signatures are given inside <tools></tools> XML tags:\n"
    "<tools>\n{schema}\n</tools>\n\n"
    "To call it, write a JSON object with the function name and its arguments inside "
    "<tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
# Release variant: the same tool block, but the tag instructions sit in the user turn and the
# assistant turn is not pre-filled with <reason>.
RELEASE_USER_SUFFIX = (
    "\nThink step by step inside <reason> </reason> tags, using the Python tool when it helps."
)


def system_text(template: str = "paper") -> str:
    _check_template(template)
    tools = TOOLS_BLOCK.format(schema=json.dumps(TOOL_SCHEMA, ensure_ascii=False))
    if template == "paper":
        return f"{REASON_INSTRUCTIONS}\n\n{tools}"
    return tools


def assistant_prefix(template: str = "paper") -> str:
    """Text that opens every assistant turn (after `<|im_start|>assistant\\n`)."""
    _check_template(template)
    return REASON_OPEN if template == "paper" else ""


def render_prompt(question: str, template: str = "paper") -> str:
    """The whole prompt, ending with the generation prompt `<|im_start|>assistant\\n<reason>`."""
    user = USER_TEMPLATE.format(question=question)
    if template == "release":
        user += RELEASE_USER_SUFFIX
    return (
        f"{IM_START}system\n{system_text(template)}{IM_END}\n"
        f"{IM_START}user\n{user}{IM_END}\n"
        f"{IM_START}assistant\n{assistant_prefix(template)}"
    )


def _check_template(template: str) -> None:
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {', '.join(TEMPLATES)}")


# ---------------------------------------------------------------------------------------------
# Tool calls


@dataclass
class ToolCall:
    """One tool call found in a model turn. `error` set means status parse_error; it is the text
    the model gets back as the tool response."""

    name: str | None
    code: str
    stdin: str
    error: str | None
    raw: str


_CALL_RE = re.compile(
    re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S
)


def find_tool_call_blocks(turn_text: str) -> list[tuple[str, bool]]:
    """(inner text, closed) for every `<tool_call>` block; the last one may be unclosed when the
    engine stopped on `</tool_call>` (stop strings are cut from the text) or the budget ran out."""
    text = turn_text.replace(IM_END, "")
    blocks = []
    for m in _CALL_RE.finditer(text):
        closed = m.group(0).endswith(TOOL_CALL_CLOSE)
        blocks.append((m.group(1), closed))
    return blocks


def _bad_call(raw: str, error: str, name: str | None = None, code: str = "") -> ToolCall:
    """A tool call that does not run: `error` is what the model reads back."""
    return ToolCall(name=name, code=code, stdin="", error=error, raw=raw)


def parse_tool_call(inner: str, closed: bool = True) -> ToolCall:
    raw = inner.strip()
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        what = "unterminated tool call" if not closed else "invalid JSON in tool call"
        return _bad_call(raw, f"Error: {what}: {exc.msg} (line {exc.lineno} column {exc.colno})")
    if not isinstance(obj, dict):
        return _bad_call(
            raw, "Error: a tool call must be a JSON object with 'name' and 'arguments'"
        )
    name = obj.get("name")
    if name != TOOL_NAME:
        return _bad_call(
            raw,
            f"Error: unknown tool {name!r}; the only tool is {TOOL_NAME}",
            name=str(name) if name is not None else None,
        )
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError as exc:
            return _bad_call(raw, f"Error: arguments are not valid JSON: {exc.msg}", name=name)
    if not isinstance(args, dict):
        return _bad_call(
            raw, "Error: 'arguments' must be a JSON object with a 'code' field", name=name
        )
    code, stdin = args.get("code"), args.get("input", "")
    if not isinstance(code, str) or not code.strip():
        return _bad_call(raw, "Error: missing required argument 'code' (a string)", name=name)
    if stdin is None:
        stdin = ""
    if not isinstance(stdin, str):
        return _bad_call(raw, "Error: argument 'input' must be a string", name=name, code=code)
    return ToolCall(name=name, code=code, stdin=stdin, error=None, raw=raw)


def parse_tool_calls(turn_text: str, max_calls: int = 1) -> list[ToolCall]:
    """Parse the first `max_calls` tool calls of a model turn (paper: only the first one runs)."""
    return [
        parse_tool_call(inner, closed)
        for inner, closed in find_tool_call_blocks(turn_text)[:max_calls]
    ]


def format_tool_call(code: str, stdin: str = "") -> str:
    """The exact text a model should emit for a call (used to build SFT targets)."""
    args: dict[str, str] = {"code": code}
    if stdin:
        args["input"] = stdin
    payload = json.dumps({"name": TOOL_NAME, "arguments": args}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


# ---------------------------------------------------------------------------------------------
# Tool responses


def truncate_text(text: str, max_chars: int | None, side: str = "middle") -> str:
    """Cut `text` to about `max_chars` (release: 256, middle). The marker says how much went."""
    if max_chars is None or len(text) <= max_chars:
        return text
    cut = len(text) - max_chars
    marker = f"...[{cut} characters truncated]..."
    if side == "head":  # keep the end
        return marker + text[-max_chars:]
    if side == "tail":  # keep the start
        return text[:max_chars] + marker
    if side != "middle":
        raise ValueError(f"unknown truncation side {side!r}")
    head = max_chars // 2
    return text[:head] + marker + text[len(text) - (max_chars - head) :]


_STATUS_NOTES = {
    "timeout": "Execution timed out.",
    "memory": "MemoryError: the program exceeded its memory limit.",
    "output_limit": "Output limit exceeded: the output was cut.",
    "sandbox_error": "The code execution service failed; this is not a problem with the code.",
}


def format_tool_output(
    status: str, stdout: str, stderr: str, max_chars: int | None = None, side: str = "middle"
) -> str:
    """What the model reads back from one call: stdout, then stderr for failures, then a note."""
    parts = [stdout.rstrip("\n")] if stdout.strip() else []
    if status != "ok" and stderr.strip():
        parts.append(stderr.rstrip("\n"))
    if status in _STATUS_NOTES:
        parts.append(_STATUS_NOTES[status])
    text = "\n".join(parts)
    return truncate_text(text, max_chars, side)


def render_tool_response(output_text: str, template: str = "paper") -> str:
    """The masked chunk appended after a model turn that ended with a tool call and `<|im_end|>`."""
    return (
        f"\n{IM_START}user\n{TOOL_RESPONSE_OPEN}\n{output_text}\n{TOOL_RESPONSE_CLOSE}{IM_END}\n"
        f"{IM_START}assistant\n{assistant_prefix(template)}"
    )


# ---------------------------------------------------------------------------------------------
# Token layout


@dataclass
class TrajectoryLayout:
    """Response token ids and loss mask of a multi-turn trajectory, built by appending ids.

    NOTE: invariant len(response_ids) == len(loss_mask); model tokens have mask 1, tool-response
    chunks mask 0 (the paper trains on model tokens only).
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)

    def add_model_tokens(self, ids: list[int]) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))

    def add_tool_chunk(self, ids: list[int]) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids


# ---------------------------------------------------------------------------------------------
# Answers


def _boxed_spans(text: str) -> list[str]:
    """Contents of every `\\boxed{...}` / `\\fbox{...}` with balanced (nested) braces, and of the
    brace-less form `\\boxed 5`, in order. Unbalanced ones are skipped."""
    found = []
    for m in re.finditer(r"\\(?:boxed|fbox)(?:\s*\{| +([^\s${}]+))", text):
        if m.group(1) is not None:  # "\boxed 5"
            found.append(m.group(1))
            continue
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found.append(text[m.end() : i - 1])
    return found


def last_boxed(text: str) -> str | None:
    spans = _boxed_spans(text)
    return spans[-1].strip() if spans else None


def last_answer_block(text: str) -> str | None:
    """Text of the last `<answer>` block (to the end of the text if it was never closed)."""
    start = text.rfind(ANSWER_OPEN)
    if start < 0:
        return None
    body = text[start + len(ANSWER_OPEN) :]
    end = body.find(ANSWER_CLOSE)
    return body if end < 0 else body[:end]


def extract_answer(text: str, strict: bool = False) -> str | None:
    """The last `\\boxed{}` inside the last `<answer>` block; without one, the last `\\boxed{}`
    anywhere, unless `strict`."""
    block = last_answer_block(text)
    if block is not None:
        boxed = last_boxed(block)
        if boxed is not None:
            return boxed
    return None if strict else last_boxed(text)


def count_answer_tags(text: str) -> int:
    return text.count(ANSWER_OPEN)


def answer_region(model_text: str) -> str:
    """The part of the model's own text that may hold its answer: every `<tool_call>` block cut
    out (unclosed ones to the end), so a `\\boxed{}` inside tool code is never an answer.

    NOTE: reward hacking guard. Callers pass only model-authored text (loss mask 1); tool output
    never reaches here, so a tool that prints `<answer>\\boxed{42}</answer>` earns nothing.
    """
    return _CALL_RE.sub("", model_text)


@dataclass
class TrajectoryStats:
    """What GRPO-RoC needs from a finished trajectory (paper section 3.2)."""

    num_turns: int
    num_tool_calls: int
    tool_status_counts: dict[str, int]
    num_answer_tags: int

    @property
    def num_tool_errors(self) -> int:
        # NOTE: every structured status other than "ok" is an error; printed text never is.
        return sum(n for s, n in self.tool_status_counts.items() if s != "ok")


def trajectory_stats(
    response_text: str, num_turns: int, tool_statuses: list[str]
) -> TrajectoryStats:
    counts: dict[str, int] = {}
    for s in tool_statuses:
        counts[s] = counts.get(s, 0) + 1
    return TrajectoryStats(num_turns, len(tool_statuses), counts, count_answer_tags(response_text))
