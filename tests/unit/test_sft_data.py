"""SFT data: converters, rendering with the protocol core, assistant-only masks, rejects, packing."""

from __future__ import annotations

import json
import random

import pytest

from rstar2cli import protocol as P
from rstar2cli.sft.coldstart_recipe import DataConfig
from rstar2cli.sft.convert import ConvertError, convert_record
from rstar2cli.sft.data import build_examples, render_chat, tokenize_chat
from rstar2cli.sft.synthetic_transcripts import (
    expression_of,
    make_transcript,
    make_transcripts,
    run_code,
)

WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def tok():
    from rstar2cli.data.tiny import build_tokenizer

    return build_tokenizer()


def _trainable_text(segments) -> str:
    return "".join(s.text for s in segments if s.trainable)


def _masked_text(segments) -> str:
    return "".join(s.text for s in segments if not s.trainable)


def _call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def test_openai_tool_calls_render_in_protocol_format():
    record = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ],
        "tools": [{"type": "function", "function": WEATHER}],
    }
    segs = render_chat(convert_record(record), "paper")
    assert [s.trainable for s in segs] == [False, True, False, True]
    assert segs[0].text.startswith("<|im_start|>system\nBe brief.\n# Tools")
    assert '"name": "get_weather"' in segs[0].text
    assert segs[0].text.endswith(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<reason>"
    )
    assert segs[1].text == _call("get_weather", {"city": "Paris"}) + "<|im_end|>"
    assert segs[2].text == P.render_tool_response("sunny", "paper")
    assert segs[3].text == "It is sunny.<|im_end|>"


def test_glaive_chat_with_quoted_arguments():
    record = {
        "system": "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -\n"
        + json.dumps(WEATHER, indent=4),
        "chat": 'USER: Weather in Rome?\n\n\nASSISTANT: <functioncall> {"name": "get_weather", '
        '"arguments": \'{"city": "Rome"}\'} <|endoftext|>\n\n\nFUNCTION RESPONSE: {"temp": 21}\n\n\n'
        "ASSISTANT: It is 21 degrees in Rome. <|endoftext|>\n\n\nUSER: Thanks!\n\n\nASSISTANT: You are welcome. <|endoftext|>",
    }
    chat = convert_record(record)
    assert [m.role for m in chat.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    segs = render_chat(chat)
    assert _trainable_text(segs) == (
        _call("get_weather", {"city": "Rome"})
        + "<|im_end|>"
        + "It is 21 degrees in Rome.<|im_end|>"
        + "You are welcome.<|im_end|>"
    )
    # a user turn after an assistant turn starts on a new line, as in the Qwen format
    assert segs[4].text == "\n<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n<reason>"


def test_toolace_python_call_syntax_and_sharegpt_function_call():
    toolace = {
        "system": "You are an expert in composing functions. Here is a list of functions in JSON format "
        f"that you can invoke:\n{json.dumps([WEATHER])}.\nShould you decide to call...",
        "conversations": [
            {"from": "user", "value": "Weather in Oslo and Bergen?"},
            {
                "from": "assistant",
                "value": '[get_weather(city="Oslo"), get_weather(city="Bergen")]',
            },
            {"from": "tool", "value": '[{"name": "get_weather", "results": "rain"}]'},
            {"from": "assistant", "value": "Rain in both."},
        ],
    }
    chat = convert_record(toolace, "toolace")
    assert [c.arguments for c in chat.messages[2].calls] == [{"city": "Oslo"}, {"city": "Bergen"}]
    assert _trainable_text(render_chat(chat)).startswith(
        _call("get_weather", {"city": "Oslo"})
        + "\n"
        + _call("get_weather", {"city": "Bergen"})
        + "<|im_end|>"
    )
    sharegpt = {
        "tools": json.dumps([WEATHER]),
        "conversations": [
            {"from": "human", "value": "Weather in Lima?"},
            {
                "from": "function_call",
                "value": '{"name": "get_weather", "arguments": {"city": "Lima"}}',
            },
            {"from": "observation", "value": "fog"},
            {"from": "gpt", "value": "Foggy."},
        ],
    }
    segs = render_chat(convert_record(sharegpt))
    assert (
        _trainable_text(segs)
        == _call("get_weather", {"city": "Lima"}) + "<|im_end|>Foggy.<|im_end|>"
    )


def test_apigen_and_instruction():
    apigen = {
        "query": "Weather in Kyiv?",
        "tools": json.dumps([WEATHER]),
        "answers": json.dumps([{"name": "get_weather", "arguments": {"city": "Kyiv"}}]),
    }
    segs = render_chat(convert_record(apigen))
    assert _trainable_text(segs) == _call("get_weather", {"city": "Kyiv"}) + "<|im_end|>"
    alpaca = {"instruction": "Translate to French.", "input": "cat", "output": "chat"}
    segs = render_chat(convert_record(alpaca))
    assert (
        segs[0].text
        == "<|im_start|>user\nTranslate to French.\n\ncat<|im_end|>\n<|im_start|>assistant\n<reason>"
    )
    assert _trainable_text(segs) == "chat<|im_end|>"
    release = render_chat(convert_record(alpaca), "release")
    assert release[0].text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"foo": 1}, "unknown record schema"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "does not start with a user turn"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "launch", "arguments": "{}"}}],
                    },
                    {"role": "tool", "content": "ok"},
                    {"role": "assistant", "content": "done"},
                ],
                "tools": [WEATHER],
            },
            "not in the tool list",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "get_weather", "arguments": "{bad"}}],
                    },
                ],
                "tools": [WEATHER],
            },
            "not valid JSON",
        ),
        (
            {"chat": "USER: hi\n\n\nASSISTANT: <functioncall> {oops} <|endoftext|>"},
            "not valid JSON",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url"}]},
                    {"role": "assistant", "content": "x"},
                ]
            },
            "non-text",
        ),
    ],
)
def test_bad_records_are_rejected_with_a_reason(record, reason):
    with pytest.raises(ConvertError, match=reason):
        convert_record(record)


def test_mask_covers_exactly_the_assistant_tokens(tok):
    record = {
        "messages": [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "Again."},
            {"role": "assistant", "content": "hi again"},
        ]
    }
    ex = tokenize_chat(convert_record(record), tok, "paper", 512, "x")
    assert len(ex.input_ids) == len(ex.loss_mask)
    target_text = tok.decode([t for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m])
    assert target_text == "hi<|im_end|>hi again<|im_end|>"
    assert tok.decode(ex.input_ids) == "".join(s.text for s in render_chat(convert_record(record)))
    assert ex.loss_mask[0] == 0


@pytest.mark.parametrize("template", ["paper", "release"])
def test_synthetic_transcript_matches_the_rl_layout(tok, template):
    row = {"question": "Compute 37*41+5.", "answer": "1522"}
    chat = make_transcript(row, random.Random(0), with_error=False, template=template)
    segs = render_chat(chat, template)
    assert segs[0].text == P.render_prompt(row["question"], template)  # byte-identical prompt
    calls = P.parse_tool_calls(segs[1].text)
    assert (
        calls[0].error is None
        and calls[0].name == P.TOOL_NAME
        and calls[0].code == "print(37*41+5)"
    )
    assert segs[1].text.endswith(P.format_tool_call("print(37*41+5)") + P.IM_END)
    assert segs[2].text == P.render_tool_response(
        P.format_tool_output("ok", "1522\n", ""), template
    )
    assert P.extract_answer(segs[3].text, strict=True) == "1522"
    ex = tokenize_chat(chat, tok, template, 2048, "x")
    prompt_ids = tok(P.render_prompt(row["question"], template), add_special_tokens=False)[
        "input_ids"
    ]
    assert ex.input_ids[: len(prompt_ids)] == prompt_ids and not any(
        ex.loss_mask[: len(prompt_ids)]
    )


def test_error_transcripts_carry_the_real_traceback_then_a_correct_call():
    rows = [
        {"question": f"Compute {a}*{a + 3}+7.", "answer": str(a * (a + 3) + 7)}
        for a in range(11, 51)
    ]
    chats = make_transcripts(rows, error_fraction=0.5, seed=1)
    errored = [
        (row, c)
        for row, c in zip(rows, chats, strict=True)
        if sum(m.role == "tool" for m in c.messages) == 2
    ]
    assert 10 <= len(errored) <= 30
    kinds = set()
    for row, chat in errored:
        first, second = [m.content for m in chat.messages if m.role == "tool"]
        kinds.add(
            "NameError"
            if "NameError" in first
            else "SyntaxError"
            if "SyntaxError" in first
            else "?"
        )
        assert second == row["answer"]  # the corrected call prints the answer
        assert P.extract_answer(chat.messages[-1].content, strict=True) == row["answer"]
    assert kinds == {"NameError", "SyntaxError"}
    assert (
        run_code("print(reslt)")[0] == "error"
        and 'File "main.py", line 1' in run_code("print(reslt)")[2]
    )
    assert run_code("print(6*7)") == ("ok", "42\n", "")


def test_build_examples_writes_rejects_for_bad_rows(tmp_path, tok):
    path = tmp_path / "mix.jsonl"
    lines = [
        json.dumps({"instruction": "Hi", "output": "Hello"}),
        "not json",
        json.dumps({"messages": [{"role": "user", "content": "x"}]}),
        json.dumps({"instruction": "long " * 300, "output": "y"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    arith = tmp_path / "arith.jsonl"
    arith.write_text(
        json.dumps({"question": "Compute 12*13+1.", "answer": "157"})
        + "\n"
        + json.dumps({"question": "Compute 12*13+1.", "answer": "999"})
        + "\n"
    )
    cfg = DataConfig(
        sources=[{"path": str(path)}, {"path": str(arith), "format": "arith"}], max_seq_len=600
    )
    examples, rejects = build_examples(cfg, tok, seed=0)
    assert len(examples) == 2
    reasons = [r["reason"] for r in rejects]
    assert len(reasons) == 4
    for expected in (
        "invalid JSON",
        "no assistant turn",
        "too long",
        "differs from the reference answer",
    ):
        assert sum(expected in r for r in reasons) == 1, (expected, reasons)
    assert all({"source", "index", "reason", "record"} <= r.keys() for r in rejects)


def test_packed_loss_equals_unpacked_loss(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rstar2cli.lm_scoring import ScoringLM
    from rstar2cli.sft.packing import collate, forward_loss_sum

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = ScoringLM(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32))
    rows = [
        {"question": f"Compute {a}*{a + 2}-{a % 7 + 1}.", "answer": str(a * (a + 2) - (a % 7 + 1))}
        for a in range(20, 26)
    ]
    chats = make_transcripts(rows, error_fraction=0.5, seed=0)
    examples = [tokenize_chat(c, tok, "paper", 2048, str(i)) for i, c in enumerate(chats)]
    packed = collate(examples, 2048, tok.pad_token_id, packing=True)
    unpacked = collate(examples, 2048, tok.pad_token_id, packing=False)
    assert packed.input_ids.shape[0] < unpacked.input_ids.shape[0] == len(examples)
    assert packed.num_targets == unpacked.num_targets == sum(e.num_targets for e in examples)
    with torch.no_grad():
        loss_packed = forward_loss_sum(model, packed) / packed.num_targets
        loss_unpacked = forward_loss_sum(model, unpacked) / unpacked.num_targets
        # the same packed rows with positions running on (no restarts) attend across examples
        leaky = type(packed)(
            packed.input_ids,
            torch.arange(packed.input_ids.shape[1]).expand_as(packed.input_ids),
            packed.labels,
            packed.num_targets,
            packed.num_tokens,
        )
        loss_leaky = forward_loss_sum(model, leaky) / packed.num_targets
    assert torch.allclose(loss_packed, loss_unpacked, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(loss_leaky, loss_unpacked, rtol=1e-4, atol=1e-4)


def test_direct_transcripts_answer_without_the_tool_and_leave_the_others_unchanged():
    rows = [
        {"question": f"Compute {a}*{a + 3}+7.", "answer": str(a * (a + 3) + 7)}
        for a in range(11, 71)
    ]
    before = make_transcripts(rows, error_fraction=0.3, seed=2)
    assert make_transcripts(rows, error_fraction=0.3, seed=2, direct_fraction=0.0) == before
    mixed = make_transcripts(rows, error_fraction=0.3, seed=2, direct_fraction=0.5)
    direct = [
        (r, c)
        for r, c in zip(rows, mixed, strict=True)
        if not c.messages[-1].calls and len(c.messages) == 3
    ]
    assert 15 <= len(direct) <= 45
    for row, chat in direct:
        last = chat.messages[-1]
        assert last.role == "assistant" and not any(m.role == "tool" for m in chat.messages)
        assert P.extract_answer(last.content, strict=True) == row["answer"]
        assert expression_of(row["question"]) in last.content
    with_tool = [c for c in mixed if any(m.role == "tool" for m in c.messages)]
    assert len(with_tool) == len(rows) - len(direct)
