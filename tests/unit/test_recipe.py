"""Recipe loading: overrides, every problem listed at once."""

import pytest
import yaml
from pydantic import Field

from rstar2cli.errors import UserError
from rstar2cli.recipe import (
    RecipeModel,
    check_resume,
    dump_recipe,
    field_changes,
    load_recipe,
    parse_sets,
)


class Optim(RecipeModel):
    lr: float = Field(1.0e-6, gt=0, description="learning rate")
    warmup_steps: int = Field(0, ge=0, description="warm-up steps")


class Demo(RecipeModel):
    seed: int = Field(0, description="seed")
    optim: Optim = Field(default_factory=Optim)


def test_parse_sets_nests_and_types():
    assert parse_sets(["optim.lr=2.0e-6", "seed=3", "name=abc"]) == {
        "optim": {"lr": 2.0e-6},
        "seed": 3,
        "name": "abc",
    }
    with pytest.raises(UserError):
        parse_sets(["novalue"])


def test_load_applies_overrides_and_dumps(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("seed: 1\noptim:\n  lr: 1.0e-5\n")
    r = load_recipe(p, Demo, ["optim.warmup_steps=20"])
    assert (r.seed, r.optim.lr, r.optim.warmup_steps) == (1, 1.0e-5, 20)
    dump_recipe(r, tmp_path / "resolved.yaml")
    assert yaml.safe_load((tmp_path / "resolved.yaml").read_text())["optim"]["warmup_steps"] == 20


def test_every_problem_is_listed(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("seed: abc\ntypo_key: 1\noptim:\n  lr: -1.0\n")
    with pytest.raises(UserError) as e:
        load_recipe(p, Demo)
    msg = str(e.value)
    assert "3 problem(s)" in msg
    assert "seed" in msg and "typo_key" in msg and "optim.lr" in msg


def test_missing_and_non_mapping_recipes(tmp_path):
    with pytest.raises(UserError, match="recipe not found"):
        load_recipe(tmp_path / "none.yaml", Demo)
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(UserError, match="mapping"):
        load_recipe(tmp_path / "list.yaml", Demo)


def test_resuming_with_another_recipe_names_each_field_that_differs(tmp_path):
    """A run's folder keeps its resolved recipe; resumed with a recipe that differs (a default
    changed since counts), the refusal names each differing field with both values."""
    run = Demo(seed=1)
    dump_recipe(run, tmp_path / "recipe.yaml")
    check_resume(tmp_path, Demo(seed=2))  # not started (no checkpoints or metrics): no refusal
    (tmp_path / "checkpoints").mkdir()
    check_resume(tmp_path, Demo(seed=1))  # the same recipe resumes
    with pytest.raises(UserError) as e:
        check_resume(tmp_path, Demo(seed=1, optim=Optim(warmup_steps=5)))
    assert "optim.warmup_steps: 0 in the run, 5 now" in str(e.value)
    assert "seed" not in str(e.value)
    assert field_changes({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}, "d": 4}) == [
        ("a.c", 2, 3),
        ("d", None, 4),
    ]


class Source(RecipeModel):
    path: str = Field(description="where")
    weight: float = Field(1.0, description="how much")


class Mix(RecipeModel):
    sources: list[Source] = Field(description="what")


def test_an_unknown_key_names_its_file_line_and_the_nearest_key(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("seed: 1\noptim:\n  lr: 1.0e-5\n  warmup_step: 3\n")
    with pytest.raises(UserError) as e:
        load_recipe(p, Demo)
    assert "  - optim.warmup_step: unknown key (line 4); did you mean optim.warmup_steps?" in str(
        e.value
    )
    p.write_text("sources:\n  - path: a.jsonl\n    wieght: 2.0\n")
    with pytest.raises(UserError) as e:
        load_recipe(p, Mix)
    assert "sources.0.wieght: unknown key (line 3); did you mean sources.0.weight?" in str(e.value)


def test_an_unknown_key_from_set_names_the_set(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("seed: 1\n")
    with pytest.raises(UserError) as e:
        load_recipe(p, Demo, ["optim.lrr=2.0e-6", "sede=3", "zzz.q=1"])
    msg = str(e.value)
    assert "optim.lrr: unknown key (from --set optim.lrr=2.0e-6); did you mean optim.lr?" in msg
    assert "sede: unknown key (from --set sede=3); did you mean seed?" in msg
    assert "zzz: unknown key (from --set zzz.q=1)\n" in msg + "\n"  # nothing near: no guess
    # a --set that overrides a file's key is where a bad value came from
    with pytest.raises(
        UserError, match=r"seed: Input should be a valid integer.*\(from --set seed=x\)"
    ):
        load_recipe(p, Demo, ["seed=x"])


def test_a_resumed_rl_run_may_change_where_and_in_what_memory_it_runs_only(tmp_path):
    """After an out-of-memory kill, the run resumes with a smaller micro-batch or gradient
    checkpointing (the same gradients), and with another sandbox daemon; any other change is
    still refused."""
    from rstar2cli.recipe import resume_changes_line
    from rstar2cli.rl.stage_recipe import RlRecipe

    path = tmp_path / "rl.yaml"
    path.write_text(
        "model: m\ndata:\n  train: t.parquet\ntrain:\n  gradient_checkpointing: false\n"
    )
    dump_recipe(load_recipe(path, RlRecipe), tmp_path / "recipe.yaml")
    (tmp_path / "checkpoints").mkdir()
    smaller = ["train.max_tokens_per_micro_batch=10240", "train.gradient_checkpointing=true"]
    smaller.append("sandbox.urls=[http://127.0.0.1:8200]")
    changed = check_resume(tmp_path, load_recipe(path, RlRecipe, smaller))
    assert [k for k, _, _ in changed] == [
        "sandbox.urls",
        "train.gradient_checkpointing",
        "train.max_tokens_per_micro_batch",
    ]
    line = resume_changes_line(changed)
    assert "train.max_tokens_per_micro_batch 20480 -> 10240" in line
    assert "train.gradient_checkpointing False -> True" in line
    with pytest.raises(UserError, match=r"train.lr: 1e-06 in the run, 2e-06 now"):
        check_resume(tmp_path, load_recipe(path, RlRecipe, [*smaller, "train.lr=2e-6"]))
