"""The shared rollout options: each one field of `RolloutArgs`, shown by every rolling-out command
with its default and recorded in its settings (the budget: test_preflight.py; the resume checks:
test_resume.py)."""

from __future__ import annotations

import dataclasses

import pytest

from rstar2cli import options as O

# The defaults each command shows, written out rather than read from the code: a changed default
# is a changed protocol (and a resumed run refusing its earlier samples).
SHARED_DEFAULTS = {
    "engines": 1,
    "engine": "vllm",
    "sandbox": None,
    "sandbox_token_file": None,
    "ray_address": None,
    "scheduler": "kv",
    "kv_mode": "incremental",
    "kv_overcommit": 1.1,
    "admission": "predicted",
    "tail_kv_fraction": None,
    "kv_cache_tokens": None,
    "tensor_parallel_size": 1,
    "speculative": None,
    "max_response_tokens": None,  # left out: the command's budget, fitted to the model
    "top_p": 1.0,
    "seed": 0,
    "template": "paper",
    "max_tool_output_chars": 256,
    "tool_timeout_s": 10.0,
}
# command: (samples, max_turns, temperature, the budget --max-response-tokens' help names)
PROTOCOLS = {
    "rollout": (1, 10, 1.0, 8192),
    "filter-hard": (8, 10, 1.0, 12288),
    "eval": (16, 30, 0.6, 30000),
}


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_every_field_is_an_option_of_the_command_with_its_default(name):
    import typer.main
    from typer.testing import CliRunner

    from rstar2cli.cli import app

    samples, max_turns, temperature, budget = PROTOCOLS[name]
    expected = {
        **SHARED_DEFAULTS,
        "samples": samples,
        "max_turns": max_turns,
        "temperature": temperature,
    }
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    params = {p.name: p for p in command.params}
    fields = [f.name for f in dataclasses.fields(O.RolloutArgs)]
    assert set(expected) == set(fields)
    shown = " ".join(
        CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "400"}).output.split()
    )
    for field in fields:
        assert params[field].default == expected[field], (name, field)
        for flag in params[field].opts:
            assert f" {flag} " in shown, (name, flag)
    assert params["samples"].opts == ["--samples", "-n"]
    assert f"(default: {budget}, clipped to the model's context" in shown


def test_each_field_lands_in_the_settings_it_belongs_to():
    names = [f.name for f in dataclasses.fields(O.RolloutArgs)]
    groups = (O.RUN_FIELDS, O.SAMPLE_FIELDS, O.UNRECORDED_FIELDS)
    assert sorted(n for group in groups for n in group) == sorted(names)  # each in exactly one
    args = O.RolloutArgs(**{n: f"<{n}>" for n in names})  # a value that says whose it is
    assert args.run_settings() == {n: f"<{n}>" for n in O.RUN_FIELDS}
    assert args.sample_settings("m") == {"model": "m", **{n: f"<{n}>" for n in O.SAMPLE_FIELDS}}
    assert "sandbox_token_file" in O.UNRECORDED_FIELDS  # a path here, never in a stats file


def test_the_command_line_reaches_the_command_as_one_rolloutargs():
    import typer
    from typer.testing import CliRunner

    seen = []

    @O.rollout_options(
        samples=3, samples_help="why", max_turns=4, max_response_tokens=5, temperature=0.5
    )
    def probe(tag: str = typer.Option("t", "--tag"), *, args: O.RolloutArgs) -> None:
        seen.append((tag, args))

    app = typer.Typer()
    app.command("probe")(probe)
    app.command("other")(lambda: None)
    runner = CliRunner()
    assert runner.invoke(app, ["probe"]).exit_code == 0
    # left out: the command's defaults; no --sandbox is [], no --max-response-tokens is 0
    assert seen.pop() == (
        "t",
        O.RolloutArgs(samples=3, max_turns=4, temperature=0.5, sandbox=[], max_response_tokens=0),
    )
    given = ["probe", "--tag", "x", "--sandbox", "http://a", "--sandbox", "http://b"]
    given += ["--max-response-tokens", "7", "-n", "2", "--seed", "9", "--kv-cache-tokens", "64"]
    result = runner.invoke(app, given)
    assert result.exit_code == 0, result.output
    tag, args = seen.pop()
    assert tag == "x" and args.sandbox == ["http://a", "http://b"]
    assert (args.max_response_tokens, args.samples, args.seed) == (7, 2, 9)
    assert args.kv_cache_tokens == 64 and args.max_turns == 4


def test_speculation_on_local_cpu_engines_is_refused_above_temperature_0():
    import torch

    from rstar2cli.errors import UserError

    if torch.cuda.is_available():
        pytest.skip("engines here would run on a GPU, where speculation samples right")
    spec = dict(samples=1, max_turns=2, sandbox=[], max_response_tokens=0, speculative="ngram:4")
    with pytest.raises(UserError, match="samples wrong tokens at temperature 0.6"):
        O.RolloutArgs(**spec, temperature=0.6).check_local_speculation()
    O.RolloutArgs(**spec, temperature=0.0).check_local_speculation()  # greedy: exact
    with pytest.raises(UserError, match="on a CPU engine"):  # a local Ray instance: this CPU
        O.RolloutArgs(**spec, temperature=0.6, ray_address="local").check_local_speculation()
    # a Ray cluster's nodes may have GPUs: there the engine refuses at its first request instead
    O.RolloutArgs(**spec, temperature=0.6, ray_address="10.0.0.1:6379").check_local_speculation()
    O.RolloutArgs(**{**spec, "speculative": None}, temperature=0.6).check_local_speculation()
