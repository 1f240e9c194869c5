"""benchmarks/words_pipeline.py: its commands parse against the real CLI, and its report."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import typer

from benchmarks.words_pipeline import SANDBOX, Settings, plan, report, table_lines
from rstar2cli.cli import app


def test_every_planned_command_parses_with_the_real_cli(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    gsm8k = tmp_path / "gsm8k.jsonl"
    gsm8k.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    stages = plan(Settings(out=tmp_path / "out", model=model, gsm8k=gsm8k))
    assert [s.name for s in stages] == [
        "prepare-data",
        "eval-base-gsm8k",
        "eval-base-words",
        "sft-coldstart",
        "eval-sft-gsm8k",
        "eval-sft-words",
        "rl-stage",
        "eval-rl-gsm8k",
        "eval-rl-words",
    ]
    _parse_with_the_real_cli(stages)
    evals = [s for s in stages if s.name.startswith("eval-")]
    for stage in evals:  # the same budget for every checkpoint
        tail = stage.argv[stage.argv.index("--samples") :]
        assert tail[:10] == ["--samples", "4", "--temperature", "0.6", "--max-turns", "3"] + [
            "--max-response-tokens",
            "512",
            "--seed",
            "0",
        ]


def test_a_second_sft_cycle_continues_from_the_first_on_new_numbers(tmp_path):
    out = tmp_path / "out"
    stages = plan(Settings(out=out, model=tmp_path, gsm8k=tmp_path, sft_cycles=2))
    by_name = {s.name: s for s in stages}
    assert [s.name for s in stages][3:7] == [
        "sft-coldstart",
        "prepare-data-c2",
        "sft-coldstart-c2",
        "eval-sft-gsm8k",
    ]
    again = by_name["prepare-data-c2"].argv
    assert again[again.index("--seed") + 1] == "1"  # seed + 1: the same templates, new numbers
    second = by_name["sft-coldstart-c2"].argv
    assert f"model={out / 'sft' / 'final'}" in second
    assert "train.seed=1" in second
    assert any(str(out / "data" / "words-c2.parquet") in a for a in second)
    sft_model = out / "sft-c2" / "final"
    assert by_name["eval-sft-gsm8k"].argv[by_name["eval-sft-gsm8k"].argv.index("--model") + 1] == (
        str(sft_model)
    )
    rl = by_name["rl-stage"].argv
    assert rl[rl.index("--init-from") + 1] == str(sft_model)
    assert f"data.train={out / 'data' / 'words.parquet'}" in rl  # RL keeps the first draw
    _parse_with_the_real_cli(stages)


def _parse_with_the_real_cli(stages) -> None:
    group = typer.main.get_command(app)
    for stage in stages:
        argv = ["http://127.0.0.1:1" if a == SANDBOX else a for a in stage.argv]
        with group.make_context("rstar2", list(argv), resilient_parsing=False) as ctx:
            command = group.get_command(ctx, argv[0])
            assert command is not None, argv[0]
            sub = command.make_context(argv[0], argv[1:], parent=ctx)  # raises on a bad option
            assert sub.params, stage.name


def _summary(avg: float, calls: float) -> dict:
    return {
        "num_problems": 2,
        "num_trajectories": 8,
        "avg_at_n": avg,
        "pass_at_k": {"pass@1": avg, "pass@4": min(1.0, 2 * avg)},
        "tool_calls_per_trajectory": calls,
        "tool_error_rate": 0.25,
        "mean_response_tokens": 120.0,
    }


def test_report_reads_the_eval_summaries_and_the_rl_steps(tmp_path, capsys):
    out = tmp_path / "run"
    for name, bench in (("gsm8k", "gsm8k"), ("words", "words.test")):
        folder = out / "eval" / name
        folder.mkdir(parents=True)
        labels = {
            label: {"settings": {}, "benchmarks": {bench: _summary(avg, calls)}}
            for label, avg, calls in (("base", 0.0, 0.0), ("sft", 0.25, 1.0), ("rl", 0.375, 1.1))
        }
        (folder / "summary.json").write_text(json.dumps({"labels": labels}))
    rows = [
        {"label": "rl", "id": "words.test-0", "correct": True},
        {"label": "rl", "id": "words.test-1", "correct": False},
        {"label": "rl", "id": "words.test-1", "correct": True},
    ]
    (out / "eval" / "words" / "results.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    (out / "data").mkdir()
    metas = [json.dumps({"held_out": kind}) for kind in ("template", "phrasing")]
    pq.write_table(pa.table({"meta": metas}), out / "data" / "words.test.parquet")
    (out / "rl").mkdir()
    steps = [{"step": 1, "reward": 0.2, "tool_calls_per_rollout": 1.0, "tool_error_share_all": 0.3}]
    steps.append({"step": 2, "reward": 0.4, "eval_accuracy": 0.5, "tool_calls_per_rollout": 1.1})
    (out / "rl" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))

    doc = report(Settings(out=out, model=tmp_path, gsm8k=tmp_path))
    assert doc["results"]["gsm8k"]["rl"]["avg_at_n"] == 0.375
    assert doc["results"]["words"]["sft"]["pass_at_n"] == 0.5  # the largest k, not pass@1
    assert doc["words_by_held_out_kind"] == {"rl": {"new phrasings": 0.5, "new templates": 1.0}}
    assert [r["step"] for r in doc["rl_steps"]] == [1, 2]
    assert (out / "words_rl_steps.png").stat().st_size > 0
    assert json.loads((out / "words_pipeline.json").read_text()) == doc
    lines = table_lines(doc["results"], samples=4)
    assert len(lines) == 2 + 6
    assert "| gsm8k (2 x 4) | rl | 37.5% | 75.0% | 1.10 | 25.0% | 120 |" in lines
    assert "| words (2 x 4) | base | 0.0% |" in capsys.readouterr().out
    assert not Path(out / "timings.json").exists() and doc["timings_s"] == {}
