"""Converters from public chat / function-calling schemas into one `Chat` form.

Schemas handled (one function each, picked by `convert_record(record, fmt)`):
- openai: `messages` with system/user/assistant/tool roles, assistant `tool_calls`
  (`{"function": {"name", "arguments"}}`, arguments as a JSON string or object), optional `tools`.
- glaive: `system` ("... functions ... -\\n{json}\\n\\n{json}") + `chat` text with `USER:`,
  `ASSISTANT: <functioncall> {...} <|endoftext|>` and `FUNCTION RESPONSE:` turns.
- toolace: `conversations` of `{"from", "value"}`; ToolACE assistant calls in Python syntax
  (`[f(a=1), g(b="x")]`) with the tool list in the system text, and ShareGPT-style
  `function_call`/`observation` turns with a `tools` field (APIGen-MT, glaive-sharegpt).
- apigen: `query` + `tools` + `answers` (xlam-function-calling), one user turn, one call turn.
- instruction: `instruction`/`input`/`output` (Alpaca) or `prompt`/`response`|`completion`.

Every converter returns a `Chat` or raises `ConvertError(reason)`; the caller writes rejects.
What it does not do: tokenize or render text (`rstar2cli.sft.data` does), or invent content.
Tested in tests/unit/test_sft_data.py.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any


class ConvertError(ValueError):
    """A record that cannot be turned into a training chat; the message is the reject reason."""


@dataclass
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass
class Message:
    role: str  # system | user | assistant | tool
    content: str = ""
    calls: list[Call] = field(default_factory=list)


@dataclass
class Chat:
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI-style function schemas


def detect_format(record: dict[str, Any]) -> str:
    if "messages" in record:
        return "openai"
    if "chat" in record:
        return "glaive"
    if "conversations" in record:
        return "toolace"
    if {"query", "answers"} <= record.keys():
        return "apigen"
    if "instruction" in record or "prompt" in record:
        return "instruction"
    raise ConvertError(f"unknown record schema (keys: {', '.join(sorted(record)[:8])})")


def convert_record(record: dict[str, Any], fmt: str = "auto") -> Chat:
    fmt = detect_format(record) if fmt == "auto" else fmt
    converters = {
        "openai": from_openai,
        "glaive": from_glaive,
        "toolace": from_toolace,
        "apigen": from_apigen,
        "instruction": from_instruction,
    }
    if fmt not in converters:
        raise ConvertError(f"no converter for format {fmt!r}")
    chat = converters[fmt](record)
    check_chat(chat)
    return chat


# ---------------------------------------------------------------------------------------------
# Shared pieces


def _as_tool(obj: Any) -> dict[str, Any]:
    """Normalise a tool description to `{"type": "function", "function": {...}}`."""
    if not isinstance(obj, dict):
        raise ConvertError("a tool description is not an object")
    fn = obj.get("function", obj) if obj.get("type") == "function" else obj
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ConvertError("a tool description has no name")
    return {"type": "function", "function": fn}


def _parse_tools(raw: Any) -> list[dict[str, Any]]:
    if raw in (None, "", []):
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConvertError(f"tools are not valid JSON: {exc.msg}") from exc
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise ConvertError("tools must be a list")
    return [_as_tool(t) for t in raw]


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            raise ConvertError(f"tool-call arguments are not valid JSON: {exc.msg}") from exc
    if not isinstance(raw, dict):
        raise ConvertError("tool-call arguments are not an object")
    return raw


def _call_from_json(obj: Any) -> Call:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ConvertError("a tool call has no name")
    return Call(obj["name"], _arguments(obj.get("arguments", obj.get("parameters", {}))))


def _text(content: Any) -> str:
    """Message content as text: a string, None, or OpenAI content parts of type text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ConvertError("non-text content part (images/audio are not supported)")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    if isinstance(content, (dict, int, float, bool)):
        return json.dumps(content, ensure_ascii=False)
    raise ConvertError(f"unsupported content type {type(content).__name__}")


def check_chat(chat: Chat) -> None:
    """Structural checks every chat must pass (the reasons become reject reasons)."""
    msgs = [m for m in chat.messages if m.role != "system"]
    if not msgs or msgs[0].role != "user":
        raise ConvertError("the conversation does not start with a user turn")
    if not any(m.role == "assistant" and (m.content.strip() or m.calls) for m in msgs):
        raise ConvertError("no assistant turn with content")
    known = {t["function"]["name"] for t in chat.tools}
    prev = None
    for m in msgs:
        if m.role not in ("user", "assistant", "tool"):
            raise ConvertError(f"unknown role {m.role!r}")
        if m.role == "tool" and (prev is None or prev.role not in ("assistant", "tool")):
            raise ConvertError("a tool result does not follow an assistant tool call")
        if m.role == "tool" and prev is not None and prev.role == "assistant" and not prev.calls:
            raise ConvertError("a tool result follows an assistant turn without a tool call")
        for call in m.calls:
            if known and call.name not in known:
                raise ConvertError(f"tool call to {call.name!r}, which is not in the tool list")
        prev = m
    if any(m.calls for m in msgs) and not chat.tools:
        raise ConvertError("tool calls without a tool list")


# ---------------------------------------------------------------------------------------------
# openai


def from_openai(record: dict[str, Any]) -> Chat:
    raw = record.get("messages")
    if not isinstance(raw, list):
        raise ConvertError("'messages' is not a list")
    messages = []
    for m in raw:
        if not isinstance(m, dict) or "role" not in m:
            raise ConvertError("a message is not an object with a role")
        role = "tool" if m["role"] in ("function", "ipython") else m["role"]
        calls = []
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", tc) if isinstance(tc, dict) else None
            calls.append(_call_from_json(fn))
        messages.append(Message(role, _text(m.get("content")), calls))
    return Chat(messages, _parse_tools(record.get("tools")))


# ---------------------------------------------------------------------------------------------
# glaive

_GLAIVE_TURN = re.compile(r"(?:^|\n+)\s*(USER|ASSISTANT|FUNCTION RESPONSE):\s?")
_GLAIVE_QUOTED_ARGS = re.compile(
    r'^\{\s*"name"\s*:\s*"([^"]+)"\s*,\s*"arguments"\s*:\s*\'(.*)\'\s*\}$', re.S
)


def _glaive_tools(system: str) -> tuple[str, list[dict[str, Any]]]:
    """Split the system text into its prose and the JSON function objects that follow it."""
    start = system.find("{")
    if start < 0:
        return system.removeprefix("SYSTEM:").strip(), []
    prose = system[:start].removeprefix("SYSTEM:").strip().rstrip("-").strip()
    decoder, tools, pos = json.JSONDecoder(), [], start
    while pos < len(system):
        while pos < len(system) and system[pos].isspace():
            pos += 1
        if pos >= len(system):
            break
        try:
            obj, pos = decoder.raw_decode(system, pos)
        except json.JSONDecodeError as exc:
            raise ConvertError(
                f"function list in the system text is not valid JSON: {exc.msg}"
            ) from exc
        tools.append(_as_tool(obj))
    return prose, tools


def _glaive_call(text: str) -> Call:
    body = text.strip()
    try:
        return _call_from_json(json.loads(body))
    except (json.JSONDecodeError, ConvertError):
        pass
    m = _GLAIVE_QUOTED_ARGS.match(body)  # Glaive writes arguments as '{...}' (not JSON)
    if not m:
        raise ConvertError("a <functioncall> is not valid JSON")
    return Call(m.group(1), _arguments(m.group(2)))


def from_glaive(record: dict[str, Any]) -> Chat:
    chat_text = record.get("chat")
    if not isinstance(chat_text, str) or not chat_text.strip():
        raise ConvertError("'chat' is empty")
    prose, tools = _glaive_tools(str(record.get("system") or ""))
    messages = [Message("system", prose)] if prose else []
    parts = _GLAIVE_TURN.split(chat_text)
    for who, body in zip(parts[1::2], parts[2::2], strict=True):
        body = body.replace("<|endoftext|>", "").strip()
        if who == "USER":
            messages.append(Message("user", body))
        elif who == "FUNCTION RESPONSE":
            messages.append(Message("tool", body))
        elif "<functioncall>" in body:
            before, after = body.split("<functioncall>", 1)
            messages.append(Message("assistant", before.strip(), [_glaive_call(after)]))
        else:
            messages.append(Message("assistant", body))
    return Chat(messages, tools)


# ---------------------------------------------------------------------------------------------
# toolace / sharegpt

_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "call",
    "observation": "tool",
    "tool": "tool",
    "function": "tool",
}


def _python_calls(text: str) -> list[Call] | None:
    """ToolACE's `[f(a=1), g(b="x")]`; None when the text is not a list of calls."""
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = ast.unparse(node.func)
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        except ValueError as exc:
            raise ConvertError(f"arguments of {name} are not literals") from exc
        calls.append(Call(name, args))
    return calls


def _list_in_text(text: str) -> list[dict[str, Any]]:
    """The first JSON list of function objects inside a system text (ToolACE puts it there)."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\[", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, list) and obj and all(isinstance(t, dict) and "name" in t for t in obj):
            return [_as_tool(t) for t in obj]
    return []


def from_toolace(record: dict[str, Any]) -> Chat:
    turns = record.get("conversations")
    if not isinstance(turns, list):
        raise ConvertError("'conversations' is not a list")
    system = str(record.get("system") or "")
    tools = _parse_tools(record.get("tools")) or _list_in_text(system)
    messages = [Message("system", system)] if system.strip() else []
    for t in turns:
        if not isinstance(t, dict):
            raise ConvertError("a conversation turn is not an object")
        who, value = str(t.get("from", t.get("role", ""))), _text(t.get("value", t.get("content")))
        role = _ROLES.get(who)
        if role is None:
            raise ConvertError(f"unknown speaker {who!r}")
        if role == "call":
            try:
                call = _call_from_json(json.loads(value))
            except json.JSONDecodeError as exc:
                raise ConvertError(f"function_call is not valid JSON: {exc.msg}") from exc
            if messages and messages[-1].role == "assistant" and not messages[-1].calls:
                messages[-1].calls.append(call)  # a thought followed by its call: one turn
            else:
                messages.append(Message("assistant", "", [call]))
            continue
        calls = _python_calls(value) if role == "assistant" and tools else None
        messages.append(Message(role, "" if calls else value, calls or []))
    return Chat(messages, tools)


# ---------------------------------------------------------------------------------------------
# apigen / instruction


def from_apigen(record: dict[str, Any]) -> Chat:
    query = record.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ConvertError("'query' is empty")
    answers = record.get("answers")
    if isinstance(answers, str):
        try:
            answers = json.loads(answers)
        except json.JSONDecodeError as exc:
            raise ConvertError(f"'answers' is not valid JSON: {exc.msg}") from exc
    if not isinstance(answers, list) or not answers:
        raise ConvertError("'answers' is not a non-empty list of calls")
    calls = [_call_from_json(a) for a in answers]
    messages = [Message("user", query), Message("assistant", "", calls)]
    return Chat(messages, _parse_tools(record.get("tools")))


def from_instruction(record: dict[str, Any]) -> Chat:
    prompt = record.get("instruction", record.get("prompt"))
    output = record.get("output", record.get("response", record.get("completion")))
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConvertError("empty instruction/prompt")
    if not isinstance(output, str) or not output.strip():
        raise ConvertError("empty output/response")
    extra = record.get("input")
    if isinstance(extra, str) and extra.strip():
        prompt = f"{prompt}\n\n{extra}"
    messages = [Message("user", prompt), Message("assistant", output)]
    if isinstance(record.get("system"), str) and record["system"].strip():
        messages.insert(0, Message("system", record["system"]))
    return Chat(messages)
