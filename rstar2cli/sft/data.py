"""SFT examples: chat records -> token ids + a loss mask on assistant tokens only.

A `Chat` (from `rstar2cli.sft.convert` or `rstar2cli.sft.synthetic_transcripts`) is rendered with
the protocol core into segments of text, each trainable (assistant tokens, mask 1) or not (system,
user and tool-result text, mask 0). The layout is the one the agent loop produces at RL time:
- a user turn ends with the generation prompt `<|im_start|>assistant\\n<reason>` (paper template);
- an assistant turn is its text, its tool calls (`protocol.format_tool_call` for the Python tool,
  the same `<tool_call>\\n{json}\\n</tool_call>` shape for others) and `<|im_end|>`, all trainable;
- tool results are exactly `protocol.render_tool_response(text)` and masked.
Each segment is tokenized on its own and the ids are concatenated, as the agent loop appends ids
(it never re-renders history), so the trained ids are the ids the model sees in rollouts.

Sources are local jsonl/json/parquet files or HF dataset ids (`datasets.load_dataset`). Records
that do not convert, are longer than `max_seq_len` or have no trainable token become rejects
`{"source", "index", "reason", "record"}`. It does not pack or batch (`rstar2cli.sft.packing`).
Tested in tests/unit/test_sft_data.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar2cli import protocol as P
from rstar2cli.errors import UserError
from rstar2cli.sft.coldstart_recipe import DataConfig, DataSource
from rstar2cli.sft.convert import Call, Chat, ConvertError, Message, convert_record

__all__ = [
    "Call",
    "Chat",
    "Message",
    "Segment",
    "Example",
    "render_chat",
    "tokenize_chat",
    "build_examples",
]


@dataclass
class Segment:
    text: str
    trainable: bool


@dataclass
class Example:
    id: str
    input_ids: list[int]
    loss_mask: list[int]  # NOTE: invariant len(loss_mask) == len(input_ids); 1 = target token

    @property
    def num_targets(self) -> int:
        return sum(self.loss_mask)


def format_call(call: Call) -> str:
    """One call in the protocol's `<tool_call>` shape (byte-identical to format_tool_call for ours)."""
    args = call.arguments
    if (
        call.name == P.TOOL_NAME
        and isinstance(args.get("code"), str)
        and set(args) <= {"code", "input"}
    ):
        return P.format_tool_call(args["code"], str(args.get("input") or ""))
    payload = json.dumps({"name": call.name, "arguments": args}, ensure_ascii=False)
    return f"{P.TOOL_CALL_OPEN}\n{payload}\n{P.TOOL_CALL_CLOSE}"


def assistant_text(msg: Message) -> str:
    calls = "\n".join(format_call(c) for c in msg.calls)
    if not calls:
        return msg.content
    return f"{msg.content.rstrip()}\n{calls}" if msg.content.strip() else calls


def _system_block(chat: Chat) -> str:
    parts = [m.content for m in chat.messages if m.role == "system" and m.content.strip()]
    if chat.tools:
        schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in chat.tools)
        parts.append(P.TOOLS_BLOCK.format(schema=schemas))
    return f"{P.IM_START}system\n{chr(10).join(parts)}{P.IM_END}\n" if parts else ""


def render_chat(chat: Chat, template: str = "paper") -> list[Segment]:
    """Segments of a chat; messages after the last assistant turn train nothing and are dropped."""
    msgs = [m for m in chat.messages if m.role != "system"]
    last = max((i for i, m in enumerate(msgs) if m.role == "assistant"), default=-1)
    msgs = msgs[: last + 1]
    segments: list[Segment] = []
    masked, after_assistant, header_open = _system_block(chat), False, False
    sep = lambda: "\n" if after_assistant else ""  # noqa: E731 - Qwen format: `<|im_end|>\n`
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if m.role == "tool":
            group = [m.content]
            while i + 1 < len(msgs) and msgs[i + 1].role == "tool":
                i += 1
                group.append(msgs[i].content)
            if i + 1 >= len(msgs) or msgs[i + 1].role != "assistant":
                raise ConvertError("a tool result is not followed by an assistant turn")
            masked += P.render_tool_response("\n".join(group), template)
            header_open, after_assistant = True, False
        elif m.role == "user":
            masked += f"{sep()}{P.IM_START}user\n{m.content}{P.IM_END}\n"
            after_assistant = False
        else:
            if not header_open:
                masked += f"{sep()}{P.IM_START}assistant\n{P.assistant_prefix(template)}"
            segments += [Segment(masked, False), Segment(assistant_text(m) + P.IM_END, True)]
            masked, after_assistant, header_open = "", True, False
        i += 1
    return segments


def tokenize_segments(segments: list[Segment], tokenizer: Any) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    mask: list[int] = []
    for seg in segments:
        seg_ids = tokenizer(seg.text, add_special_tokens=False)["input_ids"]
        ids += seg_ids
        mask += [int(seg.trainable)] * len(seg_ids)
    return ids, mask


def tokenize_chat(
    chat: Chat, tokenizer: Any, template: str, max_seq_len: int, ex_id: str
) -> Example:
    ids, mask = tokenize_segments(render_chat(chat, template), tokenizer)
    if len(ids) > max_seq_len:
        raise ConvertError(f"too long: {len(ids)} tokens > max_seq_len {max_seq_len}")
    if not any(mask):
        raise ConvertError("no trainable tokens")
    return Example(ex_id, ids, mask)


# ---------------------------------------------------------------------------------------------
# Sources


def load_records(source: DataSource) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """Records of a local file (with its bad jsonl lines) or of a HF dataset split."""
    from rstar2cli.fileio import RECORD_SUFFIXES, read_records

    path = Path(source.path)
    if path.exists() or path.suffix.lower() in RECORD_SUFFIXES:
        records, bad = read_records(path)
    else:
        from rstar2cli.data.loading import load_hub_dataset

        records, bad = load_hub_dataset(source.path, source.config, source.split, "SFT data"), []
    if source.max_records is not None:
        records = records[: source.max_records]
    return records, bad


def _source_chats(source: DataSource, records: list[dict], cfg: DataConfig, seed: int):
    """Yield (index, chat or ConvertError) for the records of one source."""
    if source.format in ("arith", "words"):
        from rstar2cli.sft.synthetic_transcripts import make_transcripts

        yield from enumerate(
            make_transcripts(
                rows=records,
                error_fraction=cfg.error_fraction,
                seed=seed,
                template=cfg.template,
                direct_fraction=cfg.direct_fraction,
                kind=source.format,
            )
        )
        return
    for i, rec in enumerate(records):
        try:
            yield i, convert_record(rec, source.format)
        except ConvertError as exc:
            yield i, exc


def build_examples(cfg: DataConfig, tokenizer: Any, seed: int) -> tuple[list[Example], list[dict]]:
    """All examples of the recipe's sources, in source order, and the rejects with reasons."""
    examples: list[Example] = []
    rejects: list[dict] = []
    for source in cfg.sources:
        records, bad = load_records(source)
        rejects += [
            {"source": source.path, "index": n, "reason": why, "record": None} for n, why in bad
        ]
        for i, item in _source_chats(source, records, cfg, seed):
            try:
                if isinstance(item, ConvertError):
                    raise item
                examples.append(
                    tokenize_chat(
                        chat=item,
                        tokenizer=tokenizer,
                        template=cfg.template,
                        max_seq_len=cfg.max_seq_len,
                        ex_id=f"{source.path}#{i}",
                    )
                )
            except ConvertError as exc:
                rejects.append(
                    {
                        "source": source.path,
                        "index": i,
                        "reason": str(exc),
                        "record": _jsonable(records[i]),
                    }
                )
    return examples, rejects


def check_sources(cfg: DataConfig, seed: int) -> None:
    """Pre-flight, before a run writes anything: at least one record of the sources converts to a
    chat. Empty, garbage or field-less data fails here with one line (`build_examples` later also
    rejects over-long examples, which needs the tokenizer)."""
    num_read, first_reason = 0, ""
    for source in cfg.sources:
        records, bad = load_records(source)
        num_read += len(records) + len(bad)
        if bad and not first_reason:
            first_reason = f"{source.path} line {bad[0][0]}: {bad[0][1]}"
        for i, item in _source_chats(source, records, cfg, seed):
            if not isinstance(item, ConvertError):
                return
            first_reason = first_reason or f"{source.path}#{i}: {item}"
    paths = ", ".join(s.path for s in cfg.sources)
    why = f"; first reject: {' '.join(first_reason.split())}" if first_reason else ""
    raise UserError(f"no usable SFT examples in {paths} ({num_read} records read{why})")


def _jsonable(record: Any) -> Any:
    return json.loads(json.dumps(record, ensure_ascii=False, default=str))
