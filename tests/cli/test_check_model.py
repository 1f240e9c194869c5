"""`rstar2 check-model` on the tiny model, on SmolLM2 and on a template that is not append-only.

Only config.json and the tokenizer are read: the folders here need no weights. The broken folder
is the tiny model's tokenizer with a template that, like some reasoning models' own, drops an
assistant turn's reasoning once a later assistant turn follows it: each rendering looks right on
its own (system prompt and tool turn pass), and only the append-only check sees the context change.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2cli.cli import app

REPO = Path(__file__).resolve().parents[2]
SMOLLM2_DIR = REPO / "models" / "smollm2-135m-instruct"

# ChatML, except that an assistant turn with a tool call loses its reasoning (the text between
# <reason> and <tool_call>) unless it is the conversation's last assistant turn.
DROPS_EARLIER_REASONING = (
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for m in messages %}{% if m['role'] == 'assistant' %}{% set ns.last = loop.index0 %}"
    "{% endif %}{% endfor -%}"
    "{%- for m in messages -%}"
    "{%- set content = m['content'] -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 != ns.last and '<tool_call>' in content -%}"
    "{%- set content = '<reason><tool_call>' + content.split('<tool_call>', 1)[1] -%}"
    "{%- endif -%}"
    "<|im_start|>{{ m['role'] }}\n{{ content }}<|im_end|>\n"
    "{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)


def _check(*args: str):
    return CliRunner().invoke(app, ["check-model", *args])


def _table(output: str) -> dict[str, tuple[str, str]]:
    """check name -> (status, detail), read from the printed table (a detail may wrap)."""
    rows: dict[str, tuple[str, str]] = {}
    name = ""
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) != 3 or cells == ["check", "status", "detail"]:
            continue
        if cells[0]:
            name = cells[0]
            rows[name] = (cells[1], cells[2])
        elif name:
            rows[name] = (rows[name][0], f"{rows[name][1]} {cells[2]}")
    return rows


def _rows(output: str) -> dict[str, str]:
    return {name: status for name, (status, _) in _table(output).items()}


def test_the_tiny_model_passes_against_its_recipe(tiny_model_dir):
    result = _check(str(tiny_model_dir), "--recipe", str(REPO / "recipes" / "tiny" / "rl.yaml"))
    assert result.exit_code == 0, result.output
    assert _rows(result.stdout) == dict.fromkeys(
        [
            "config",
            "tokenizer",
            "system prompt",
            "tool turn",
            "append-only",
            "stop token",
            "context",
        ],
        "ok",
    )


def test_a_budget_beyond_the_context_is_one_problem_line(tiny_model_dir):
    result = _check(str(tiny_model_dir))  # the default recipe: the paper's 2048 + 12288 tokens
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("problem: context: "), result.stderr
    assert "needs 14336 tokens" in lines[0] and "4096 positions" in lines[0]


def test_smollm2_renders_the_protocol_and_fits_its_sft_recipe():
    if not (SMOLLM2_DIR / "config.json").is_file():
        if os.environ.get("CI"):
            pytest.fail("SmolLM2 not built: `make test` runs `make smollm2` first")
        pytest.skip("SmolLM2 not built: run `make smollm2`")
    recipe = REPO / "recipes" / "pretrained" / "sft.yaml"  # an SFT recipe: data.max_seq_len
    result = _check(str(SMOLLM2_DIR), "--recipe", str(recipe))
    assert result.exit_code == 0, result.output
    table = _table(result.stdout)
    assert {status for status, _ in table.values()} == {"ok"} and len(table) == 7
    # its ChatML has no tool role: the protocol's tool response is a user turn
    assert table["tool turn"][1].endswith("as a user message holding <tool_response>")
    assert table["context"][1].startswith("1024 of 8192 positions (data.max_seq_len 1024,")


def test_a_template_that_drops_earlier_reasoning_is_not_append_only(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    broken = tmp_path / "broken"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = DROPS_EARLIER_REASONING
    tokenizer.save_pretrained(broken)
    shutil.copy(tiny_model_dir / "config.json", broken / "config.json")

    result = _check(str(broken), "--recipe", str(REPO / "recipes" / "tiny" / "rl.yaml"))
    assert result.exit_code == 2, result.output
    rows = _rows(result.stdout)
    assert rows["system prompt"] == rows["tool turn"] == rows["stop token"] == "ok"
    assert rows["append-only"] == "problem"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("problem: append-only: after tool round 2")
