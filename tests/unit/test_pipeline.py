"""Quickstart pipeline planning and summary (the whole run is tests/integration/test_quickstart.py)."""

import subprocess
from pathlib import Path

import typer.main

from rstar2cli.cli import app
from rstar2cli.pipeline import QuickstartSettings, plan_steps, shell_script, summarize


def _steps(tmp_path):
    return plan_steps(tmp_path / "q", QuickstartSettings(recipes_dir=Path("recipes/tiny")))


def test_steps_chain_outputs_into_inputs(tmp_path):
    steps = _steps(tmp_path)
    assert [s.name for s in steps] == [
        "prepare-data",
        "sft-coldstart",
        "eval-sft",
        "rl-stage",
        "eval-rl",
    ]
    sft, rl = steps[1], steps[3]
    assert str(sft.done_marker.parent) in rl.argv  # rl starts from the SFT model
    assert str(rl.done_marker.parent) in steps[4].argv  # the second eval reads the RL model
    bound = rl.bound("http://127.0.0.1:9")
    assert "http://127.0.0.1:9" in bound and "$SANDBOX" not in bound


def test_every_step_parses_with_the_real_cli(tmp_path):
    # Each argv must be accepted by the command's own parser (no run: --help stops after parsing).
    command = typer.main.get_command(app)
    for step in _steps(tmp_path):
        ctx = command.make_context(
            "rstar2", step.bound("http://127.0.0.1:9"), resilient_parsing=False
        )
        sub = command.get_command(ctx, step.argv[0])
        assert sub is not None, step.argv[0]
        sub.make_context(step.argv[0], step.bound("http://127.0.0.1:9")[1:])


def test_shell_script_is_valid_bash(tmp_path):
    script = shell_script(_steps(tmp_path))
    path = tmp_path / "p.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert script.count("rstar2 ") >= 6 and "--sandbox $SANDBOX" in script


def _row(label, pid, correct, statuses, n_tokens=10):
    return {
        "label": label, "id": pid, "correct": correct, "reward": float(correct),
        "tool_calls": [{"status": s} for s in statuses], "num_turns": len(statuses) + 1,
        "num_answer_tags": 1, "response_ids": [0] * n_tokens,
    }  # fmt: skip


def test_summary_numbers():
    rows = [
        _row("sft", "a", True, ["ok", "error"]),  # correct, 1 of 2 calls errored
        _row("sft", "b", False, ["timeout"]),  # wrong: its error does not count
        _row("rl", "a", True, ["ok"], n_tokens=4),
        _row("rl", "b", True, ["ok"], n_tokens=6),
    ]
    s = summarize(rows, rl_steps=3, seconds=12.34)
    assert s["sft"]["accuracy"] == 0.5 and s["sft"]["tool_error_share"] == 0.5
    assert s["sft"]["tool_calls_per_trajectory"] == 1.5
    assert s["rl"]["accuracy"] == 1.0 and s["rl"]["tool_error_share"] == 0.0
    assert s["rl"]["mean_response_tokens"] == 5 and s["rl"]["steps"] == 3
    assert s["seconds"] == 12.3


def test_summary_without_rows_is_explicit():
    s = summarize([], rl_steps=0, seconds=0.0)
    assert s["sft"]["accuracy"] is None and s["rl"]["trajectories"] == 0


def test_a_pretrained_model_goes_to_the_sft_step_with_its_own_recipes(tmp_path):
    from rstar2cli.pipeline import pretrained_settings

    model = tmp_path / "smollm2"
    steps = plan_steps(tmp_path / "q", pretrained_settings(Path("recipes/pretrained"), model))
    sft = steps[1].argv
    assert sft[sft.index("--recipe") + 1] == "recipes/pretrained/sft.yaml"
    assert sft[-2:] == ["--set", f"model={model}"]  # after the data sources: it wins
    rl = steps[3].argv
    assert rl[rl.index("--recipe") + 1] == "recipes/pretrained/rl.yaml"
    evals = [s.argv for s in steps if s.name.startswith("eval-")]
    assert all(a[a.index("--limit") + 1] == "50" for a in evals)
    # the tiny default names no model: the recipe builds it
    assert not any(a.startswith("model=") for a in _steps(tmp_path)[1].argv)
