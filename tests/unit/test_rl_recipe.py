"""Every RL recipe validates; a bad one lists every problem at once (field and cross-field)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rstar2cli.errors import UserError
from rstar2cli.recipe import load_recipe
from rstar2cli.rl.stage_recipe import RlRecipe, kept_per_problem

REPO = Path(__file__).resolve().parents[2]
RL_RECIPES = [
    "recipes/stage1_8k.yaml",
    "recipes/stage2_12k.yaml",
    "recipes/stage3_12k_hard.yaml",
    "recipes/tiny/rl.yaml",
    "recipes/pretrained/rl.yaml",
    "recipes/pretrained/words_rl.yaml",
]


@pytest.mark.parametrize("name", RL_RECIPES)
def test_every_rl_recipe_validates_and_opens_with_a_header(name):
    path = REPO / name
    recipe = load_recipe(path, RlRecipe)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# ")  # what it reproduces, how to run it, where the numbers come from
    assert "rstar2 rl-stage --recipe " + name in text.split("\nmodel:")[0]
    # GRPO-RoC shape: 2G sampled, G kept, asymmetric clip, no KL by default.
    assert recipe.roc.enabled
    assert recipe.rollout.num_samples_per_prompt == 2 * recipe.roc.group_size
    assert (recipe.train.eps_low, recipe.train.eps_high) == (0.2, 0.28)
    assert recipe.train.kl_coef == 0.0 and recipe.train.entropy_coef == 0.0
    assert recipe.train.clip_ratio_c is None  # no dual clip, as the paper
    assert recipe.reward.strict


def test_paper_stage_values():
    s1, s2, s3 = (load_recipe(REPO / n, RlRecipe) for n in RL_RECIPES[:3])
    assert [s.train.num_steps for s in (s1, s2, s3)] == [300, 85, 125]
    assert [s.rollout.max_response_tokens for s in (s1, s2, s3)] == [8192, 12288, 12288]
    assert [s.rollout.max_turns for s in (s1, s2, s3)] == [10, 10, 15]
    assert all(
        s.rollout.num_prompts_per_step == 512 and s.roc.group_size == 16 for s in (s1, s2, s3)
    )
    assert s1.train.lr == 1.0e-6 and s1.train.warmup_steps == 20
    assert "hard" in s3.data.train and "--reset-optimizer" in (REPO / RL_RECIPES[2]).read_text()


def test_the_paper_recipes_use_two_mini_batches_as_the_trainer_says():
    """rl/trainer.py's docstring against the recipes: the paper recipes take two optimizer steps
    per RL step (the clip acts on the second); one mini-batch is not the paper's setting."""
    import rstar2cli.rl.trainer as trainer

    assert [load_recipe(REPO / n, RlRecipe).train.num_mini_batches for n in RL_RECIPES[:3]] == [
        2,
        2,
        2,
    ]
    doc = " ".join(str(trainer.__doc__).split())
    assert "the paper's setting" not in doc and "the paper recipes use two" in doc


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _tiny() -> dict:
    return yaml.safe_load((REPO / "recipes/tiny/rl.yaml").read_text())


def test_bad_recipe_lists_every_problem_at_once(tmp_path):
    data = _tiny()
    data["roc"]["mode"] = "greedy"  # not a mode
    data["train"]["lr"] = -1.0  # out of bounds
    data["train"]["warmup"] = 3  # unknown key
    data["eval"]["every_steps"] = 2
    data["data"]["eval"] = None  # eval on without a held-out file: cross-section (eval vs data)
    data["rollout"]["kv_cache_tokens"] = 100  # section check: one trajectory does not fit
    with pytest.raises(UserError) as exc:
        load_recipe(_write(tmp_path, data), RlRecipe)
    msg = str(exc.value)
    assert "5 problem(s)" in msg, msg
    for needle in (
        "roc.mode",
        "train.lr",
        "train.warmup",
        "needs data.eval",
        "cannot hold one trajectory",
    ):
        assert needle in msg, (needle, msg)


def test_cross_section_checks_are_listed_together(tmp_path):
    data = _tiny()
    data["train"]["num_mini_batches"] = 10_000  # more optimizer steps than trajectories
    data["eval"]["every_steps"] = 2
    data["data"]["eval"] = None
    data["checkpoint"]["keep_last"] = 0  # plain bound, in another section
    with pytest.raises(UserError) as exc:
        load_recipe(_write(tmp_path, data), RlRecipe)
    msg = str(exc.value)
    assert "3 problem(s)" in msg, msg
    assert "needs data.eval" in msg
    assert "num_mini_batches (10000) exceeds the most rollouts a step can train on (32)" in msg
    assert "checkpoint.keep_last" in msg


def test_admission_and_tail_engines_are_recipe_fields_with_bounds(tmp_path):
    data = _tiny()
    data["rollout"]["admission"] = "predicted"
    data["rollout"]["tail_kv_fraction"] = 0.3
    rollout = load_recipe(_write(tmp_path, data), RlRecipe).rollout
    assert (rollout.admission, rollout.tail_kv_fraction) == ("predicted", 0.3)
    data["rollout"]["admission"] = "sideways"
    data["rollout"]["tail_kv_fraction"] = 0.0
    with pytest.raises(UserError) as exc:
        load_recipe(_write(tmp_path, data), RlRecipe)
    msg = str(exc.value)
    assert "2 problem(s)" in msg and "rollout.admission" in msg, msg
    assert "rollout.tail_kv_fraction" in msg, msg


def test_a_micro_batch_must_hold_the_longest_trajectory(tmp_path):
    data = _tiny()
    data["train"]["max_tokens_per_micro_batch"] = 800  # tiny: 512 prompt + 384 response = 896
    with pytest.raises(UserError, match=r"max_tokens_per_micro_batch \(800\) cannot hold"):
        load_recipe(_write(tmp_path, data), RlRecipe)


def test_roc_must_sample_what_it_keeps(tmp_path):
    data = _tiny()
    data["rollout"]["num_samples_per_prompt"] = 2  # RoC keeps 4 of 2
    with pytest.raises(UserError, match="sample at least as many as it keeps"):
        load_recipe(_write(tmp_path, data), RlRecipe)
    data["roc"]["enabled"] = False  # plain GRPO trains on all 2: fine
    assert load_recipe(_write(tmp_path, data), RlRecipe).rollout.num_samples_per_prompt == 2


def test_roc_minimums_must_fit_the_group(tmp_path):
    data = _tiny()
    data["roc"]["min_positive"] = 3
    data["roc"]["min_negative"] = 3
    with pytest.raises(
        UserError, match=r"min_positive \+ min_negative \(3 \+ 3\) exceeds group_size \(4\)"
    ):
        load_recipe(_write(tmp_path, data), RlRecipe)


def test_plain_grpo_keeps_every_sample():
    grpo = load_recipe(
        REPO / "recipes/tiny/rl.yaml",
        RlRecipe,
        ["roc.enabled=false", "rollout.num_samples_per_prompt=4"],
    )
    assert kept_per_problem(grpo.rollout, grpo.roc) == 4
    roc = load_recipe(REPO / "recipes/tiny/rl.yaml", RlRecipe)
    assert kept_per_problem(roc.rollout, roc.roc) == roc.roc.group_size == 4


def test_colocated_needs_one_rank_per_engine_gpu_and_vllm(tmp_path):
    data = _tiny()
    data["rollout"].update(num_engines=2, tensor_parallel_size=2, colocate=True)
    data["train"]["num_trainer_ranks"] = 3
    with pytest.raises(UserError, match=r"num_engines x tensor_parallel_size = 4, not 3"):
        load_recipe(_write(tmp_path, data), RlRecipe)
    data["train"]["num_trainer_ranks"] = 4
    assert load_recipe(_write(tmp_path, data), RlRecipe).rollout.colocate
    data["rollout"]["engine"] = "hf"
    with pytest.raises(UserError, match="need engine: vllm"):
        load_recipe(_write(tmp_path, data), RlRecipe)


def test_speculative_is_a_recipe_field_checked_like_the_option(tmp_path):
    data = _tiny()
    data["rollout"]["speculative"] = "ngram:4"
    assert load_recipe(_write(tmp_path, data), RlRecipe).rollout.speculative == "ngram:4"
    for bad, message in [("eagle:4", "METHOD:TOKENS"), ("ngram:0", "1-16 draft tokens")]:
        data["rollout"]["speculative"] = bad
        with pytest.raises(UserError) as exc:
            load_recipe(_write(tmp_path, data), RlRecipe)
        assert "rollout" in str(exc.value) and message in str(exc.value), exc.value
    data["rollout"].update(speculative="ngram:4", engine="hf")
    with pytest.raises(UserError, match="speculative need engine: vllm"):
        load_recipe(_write(tmp_path, data), RlRecipe)


def test_engine_dtype_is_a_vllm_recipe_field(tmp_path):
    data = _tiny()
    assert load_recipe(_write(tmp_path, data), RlRecipe).rollout.dtype is None
    data["rollout"]["dtype"] = "bfloat16"
    assert load_recipe(_write(tmp_path, data), RlRecipe).rollout.dtype == "bfloat16"
    data["rollout"]["dtype"] = "fp8"
    with pytest.raises(UserError, match="dtype"):
        load_recipe(_write(tmp_path, data), RlRecipe)
    data["rollout"].update(dtype="bfloat16", engine="hf")
    with pytest.raises(UserError, match="dtype and speculative need engine: vllm"):
        load_recipe(_write(tmp_path, data), RlRecipe)


def test_correction_section_and_its_check_against_the_sampling_top_p(tmp_path):
    data = _tiny()
    data["correction"] = {"token_is_cap": None, "seq_mask_low": 0.99, "seq_mask_high": 1.01}
    recipe = load_recipe(_write(tmp_path, data), RlRecipe)
    assert (recipe.correction.seq_mask_low, recipe.correction.token_is_cap) == (0.99, None)
    # the trainer scores at the rollout's temperature: the ratios compare like with like
    data["rollout"]["temperature"] = 0.8
    assert load_recipe(_write(tmp_path, data), RlRecipe).rollout.temperature == 0.8
    data["rollout"]["top_p"] = 0.9  # but it scores without top-p
    with pytest.raises(UserError, match="log-probs at top_p 0.9 are no importance ratio"):
        load_recipe(_write(tmp_path, data), RlRecipe)
    # nothing that reads the ratios: any top-p
    data["correction"] = {"token_is_cap": None, "mask_stale": True}
    assert load_recipe(_write(tmp_path, data), RlRecipe).correction.mask_stale
    for bad, message in [
        ({"tis": 1}, "correction.tis: unknown key"),
        ({"bypass": True, "token_is_cap": 2.0}, "token_is_cap to null with bypass"),
    ]:
        data["correction"] = bad
        with pytest.raises(UserError, match=message):
            load_recipe(_write(tmp_path, data), RlRecipe)
