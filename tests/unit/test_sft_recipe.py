"""SFT recipes: every shipped one validates; a bad one is refused with every problem listed."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rstar2cli.errors import UserError
from rstar2cli.recipe import load_recipe
from rstar2cli.sft.coldstart_recipe import SftRecipe, check_world_size, gradient_accumulation_steps
from rstar2cli.sft.train import batch_indices, cosine_factor

REPO = Path(__file__).resolve().parents[2]
SFT_RECIPES = sorted(p for p in (REPO / "recipes").rglob("*.yaml") if "sft" in p.stem)


def test_sft_recipes_are_found():
    names = {str(p.relative_to(REPO / "recipes")) for p in SFT_RECIPES}
    assert {"sft_coldstart.yaml", "tiny/sft.yaml"} <= names


@pytest.mark.parametrize("path", SFT_RECIPES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_sft_recipe_validates_and_opens_with_a_comment(path):
    recipe = load_recipe(path, SftRecipe)
    assert path.read_text().startswith("#")
    assert recipe.train.global_batch_size % recipe.train.micro_batch_size == 0


def test_paper_values():
    r = load_recipe(REPO / "recipes" / "sft_coldstart.yaml", SftRecipe)
    t = r.train
    assert (t.num_epochs, t.lr, t.warmup_ratio, t.global_batch_size) == (3.0, 5.0e-6, 0.04, 128)
    assert t.min_lr_ratio == 0.0  # cosine to zero
    check_world_size(r, 64)  # the paper's 64 GPUs fit the batch arithmetic
    assert gradient_accumulation_steps(r, 64) == 1


def test_bad_recipe_lists_every_problem(tmp_path):
    bad = {
        "model": "tiny",
        "typo_key": 1,
        "data": {"sources": [{"path": "x.jsonl", "format": "sharegpt"}], "max_seq_len": "long"},
        "train": {"global_batch_size": 100, "micro_batch_size": 3},
        "checkpoint": {"every_steps": 0},
    }
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(UserError) as err:
        load_recipe(path, SftRecipe)
    msg = str(err.value)
    assert "5 problem(s)" in msg
    for where in (
        "typo_key",
        "data.sources.0.format",
        "data.max_seq_len",
        "train",
        "checkpoint.every_steps",
    ):
        assert f"- {where}" in msg, (where, msg)
    assert "not a multiple of micro_batch_size" in msg


def test_world_size_arithmetic_is_checked_at_launch():
    r = SftRecipe.model_validate(
        {
            "data": {"sources": [{"path": "a.jsonl"}]},
            "train": {"global_batch_size": 16, "micro_batch_size": 4},
        }
    )
    check_world_size(r, 2)
    with pytest.raises(UserError, match="micro_batch_size x ranks"):
        check_world_size(r, 3)


def test_cli_refuses_a_bad_recipe_before_any_work(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "data:\n  sources: []\ntrain:\n  global_batch_size: 10\n  micro_batch_size: 4\n"
        "checkpoint:\n  every_steps: 0\nextra: 1\n"
    )
    out = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rstar2cli.cli",
            "sft-coldstart",
            "--recipe",
            str(path),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert (
        "4 problem(s)" in r.stderr
        and "data.sources" in r.stderr
        and "checkpoint.every_steps" in r.stderr
    )
    assert "extra" in r.stderr and "not a multiple" in r.stderr
    assert not out.exists()  # nothing was written


def test_schedule_and_data_order():
    factors = [cosine_factor(s, 100, 4, 0.1) for s in range(100)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]  # linear warm-up over 4 steps
    assert factors[4] == 1.0 and all(
        a >= b for a, b in zip(factors[4:], factors[5:], strict=False)
    )  # cosine down
    assert abs(factors[-1] - (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 95 / 96)))) < 1e-12
    # each epoch is a permutation; the order depends only on (seed, step)
    first_epoch = [i for s in range(5) for i in batch_indices(s, 10, 2, seed=3)]
    assert sorted(first_epoch) == list(range(10))
    assert batch_indices(7, 10, 2, seed=3) == batch_indices(7, 10, 2, seed=3)
    assert batch_indices(0, 10, 2, seed=3) != batch_indices(0, 10, 2, seed=4)
