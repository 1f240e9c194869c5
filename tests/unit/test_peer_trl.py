"""The pure parts of benchmarks/peer_trl.py: the knobs both sides share, TRL speaking the
project's protocol (chat template, tool-call parsing, tool, reward through the real grader and
sandbox), and the step/median/ratio arithmetic. TRL's own checks run when the `peer` extra is
installed; the rest needs only the project."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.peer.report import (
    METRICS,
    StepRow,
    advantage,
    compare,
    ours_rows,
    summarise,
    table,
    trl_rows,
)
from benchmarks.peer.settings import (
    PRETRAINED_RECIPE,
    Knobs,
    grpo_args,
    recipe_knobs,
    stage_sets,
    yaml_float,
)
from benchmarks.peer.trl_agent import (
    chat_template,
    finish_reason,
    grade,
    make_tool,
    model_text,
    prompt_messages,
)
from rstar2cli import protocol as P
from rstar2cli.recipe import load_recipe
from rstar2cli.rl.stage_recipe import RlRecipe

KNOBS = Knobs(
    num_steps=3,
    num_prompts_per_step=2,
    num_samples_per_prompt=4,
    max_response_tokens=128,
    temperature=1.0,
    lr=3.0e-6,
)
EOS = 2  # SmolLM2's <|im_end|>; any id works, the adapter only compares


def _recipe(train: Path, test: Path, model: str = "models/any") -> RlRecipe:
    recipe = load_recipe(PRETRAINED_RECIPE, RlRecipe, stage_sets(KNOBS, train=train, test=test))
    recipe.model = model
    return recipe


# -- the knobs -------------------------------------------------------------------------------------


def test_yaml_float_keeps_a_dot_so_yaml_reads_a_float():
    assert yaml_float(1e-5) == "1.0e-05"
    assert yaml_float(3.0e-6) == "3.0e-06"
    assert yaml_float(0.6) == "0.6"
    assert yaml_float(1.0) == "1.0"


def test_knobs_need_an_even_number_of_samples_of_at_least_four():
    replace(KNOBS, num_samples_per_prompt=4).check()
    for n in (2, 5):
        with pytest.raises(ValueError, match="samples per prompt"):
            replace(KNOBS, num_samples_per_prompt=n).check()


def test_stage_sets_give_the_knobs_back_through_rl_stage_s_recipe(tmp_path):
    recipe = _recipe(tmp_path / "train.parquet", tmp_path / "test.parquet")
    assert recipe_knobs(recipe) == KNOBS
    assert recipe.roc.group_size == 2  # RoC keeps n/2 (paper: 2G drawn, G kept)
    assert recipe.data.train == str(tmp_path / "train.parquet")
    assert recipe.checkpoint.every_steps == KNOBS.num_steps


def test_grpo_args_are_the_same_run(tmp_path):
    recipe = _recipe(tmp_path / "train.parquet", tmp_path / "test.parquet")
    args = grpo_args(recipe, output_dir=str(tmp_path / "trl"))
    assert args["max_steps"] == 3 and args["num_generations"] == 4
    # one optimizer step per RL step: 2 prompts x 4 samples accumulate into it
    assert args["per_device_train_batch_size"] * args["gradient_accumulation_steps"] == 8
    assert args["max_completion_length"] == 128  # tool output counts on both sides
    assert args["max_tool_calling_iterations"] == 2  # 3 turns: 2 tool rounds
    assert (args["temperature"], args["top_p"], args["learning_rate"]) == (1.0, 1.0, 3.0e-6)
    assert (args["epsilon"], args["epsilon_high"], args["beta"]) == (0.2, 0.28, 0.0)
    # rl-stage's warmup 1 is a constant rate from the first step
    assert (args["lr_scheduler_type"], args["warmup_steps"]) == ("constant", 0)
    assert (args["weight_decay"], args["max_grad_norm"]) == (0.0, 1.0)
    assert args["bf16"] is False and args["gradient_checkpointing"] is False
    assert args["shuffle_dataset"] is False  # the rows come in rl-stage's step order
    # KV cache of rl-stage's 16,384 tokens in 256-token pages
    assert args["transformers_continuous_batching_config"] == {"num_blocks": 64}
    trl = pytest.importorskip("trl", reason="the peer extra is not installed")
    config = trl.GRPOConfig(**args)
    assert config.generation_batch_size == 8
    assert config.steps_per_generation == config.gradient_accumulation_steps


# -- TRL speaking the protocol ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    from rstar2cli.data.tiny import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = chat_template("paper")
    return tok


def test_chat_template_renders_the_protocol_s_prompt_and_tool_response(tokenizer):
    question = "What is 12 * 7 + 3?"
    text = tokenizer.apply_chat_template(
        prompt_messages(question), tokenize=False, add_generation_prompt=True
    )
    assert text == P.render_prompt(question)
    call = {"type": "function", "function": {"name": P.TOOL_NAME, "arguments": {"code": "x"}}}
    turn = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    tool = {"role": "tool", "name": P.TOOL_NAME, "content": "87"}
    before = tokenizer.apply_chat_template(turn, tokenize=False)
    after = tokenizer.apply_chat_template([*turn, tool], tokenize=False, add_generation_prompt=True)
    # what TRL appends after a calling turn: everything past that turn's <|im_end|>
    cut = before.rindex(P.IM_END) + len(P.IM_END)
    assert after[:cut] == before[:cut]
    assert after[cut:] == P.render_tool_response("87")
    assert P.format_tool_call("x") in before


def test_trl_accepts_the_template_and_parses_the_protocol_s_tool_call(tokenizer):
    pytest.importorskip("trl", reason="the peer extra is not installed")
    from trl.chat_template_utils import (
        is_chat_template_prefix_preserving,
        parse_response,
        supports_tool_calling,
    )

    from benchmarks.peer.trl_agent import RESPONSE_TEMPLATE

    tokenizer.response_template = RESPONSE_TEMPLATE
    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)
    prompt = tokenizer(P.render_prompt("What is 12 * 7 + 3?"))["input_ids"]
    code = "print(12 * 7 + 3)"
    turn = "First compute.\n" + P.format_tool_call(code) + P.IM_END
    parsed = parse_response(tokenizer, tokenizer(turn)["input_ids"], prefix=prompt)
    assert parsed["tool_calls"] == [
        {"type": "function", "function": {"name": P.TOOL_NAME, "arguments": {"code": code}}}
    ]
    assert "First compute." in parsed["content"]
    answer = "87.</reason>\n<answer>\\boxed{87}</answer>" + P.IM_END
    parsed = parse_response(tokenizer, tokenizer(answer)["input_ids"], prefix=prompt)
    assert "tool_calls" not in parsed and parsed["content"].endswith("\\boxed{87}</answer>")


def test_the_tool_runs_in_the_sandbox_and_answers_like_rl_stage():
    from sandboxd.pool import LocalSandbox

    async def calls() -> list[str]:
        sandbox = LocalSandbox(num_workers=1, timeout_s=5.0)
        tool = make_tool(run=sandbox.run, timeout_s=5.0, max_chars=40)
        try:
            return [
                await tool(code="print(6 * 7)"),
                await tool(code="print(input()[::-1])", input="abc"),
                await tool(code="1 / 0"),
                await tool(code="print('x' * 100)"),
            ]
        finally:
            await sandbox.close()

    ok, stdin, error, long = asyncio.run(calls())
    assert (ok, stdin) == ("42", "cba")
    assert error.endswith("division by zero")  # stderr comes back, cut in the middle
    assert long == P.truncate_text("x" * 100, 40)
    # TRL calls a tool by its function's name
    assert make_tool(run=LocalSandbox().run, timeout_s=1.0, max_chars=None).__name__ == P.TOOL_NAME


# -- the reward adapter, through the real grader ---------------------------------------------------


def _call(code: str) -> dict:
    return {"type": "function", "function": {"name": P.TOOL_NAME, "arguments": {"code": code}}}


ANSWER = "<reason>so 87</reason>\n<answer>\\boxed{87}</answer>"
CASES = [
    # (TRL completion messages, last token, reward rl-stage gives it)
    ([{"role": "assistant", "content": ANSWER}], EOS, 1.0),
    ([{"role": "assistant", "content": ANSWER.replace("87}", "88}")}], EOS, 0.0),
    # the answer after a tool round: the tool message is not the model's text
    (
        [
            {"role": "assistant", "content": "<reason>compute", "tool_calls": [_call("print(87)")]},
            {"role": "tool", "name": P.TOOL_NAME, "content": "87"},
            {"role": "assistant", "content": ANSWER},
        ],
        EOS,
        1.0,
    ),
    # a tool that prints an answer earns nothing (reward-hacking guard)
    (
        [
            {"role": "assistant", "content": "<reason>", "tool_calls": [_call("print(1)")]},
            {"role": "tool", "name": P.TOOL_NAME, "content": "<answer>\\boxed{87}</answer>"},
            {"role": "assistant", "content": "done"},
        ],
        EOS,
        0.0,
    ),
    # a malformed call TRL left as text: its code is cut out before the answer is read
    (
        [{"role": "assistant", "content": '<tool_call>\n{"code": "<answer>\\boxed{87}</answer>'}],
        EOS,
        0.0,
    ),
    ([{"role": "assistant", "content": ANSWER}], 99, 0.0),  # budget ran out: truncated
    # still calling the tool when the turns ran out: truncated
    ([{"role": "assistant", "content": ANSWER, "tool_calls": [_call("print(87)")]}], EOS, 0.0),
]


def test_rewards_are_rl_stage_s_on_the_model_s_own_text():
    from rstar2cli.reward.grader import Grader

    completions = [c for c, _, _ in CASES]
    ids = [[5, 6, last] for _, last, _ in CASES]
    with Grader(num_workers=1, timeout_s=5.0, strict=True, zero_truncated=True) as grader:
        rewards = grade(
            grader=grader,
            completions=completions,
            completion_ids=ids,
            answers=["87"] * len(CASES),
            eos_token_id=EOS,
        )
    assert rewards == [r for _, _, r in CASES]


def test_finish_reasons_and_model_text():
    done = [{"role": "assistant", "content": "a"}]
    assert finish_reason(completion=done, completion_ids=[1, EOS], eos_token_id=EOS) is None
    assert finish_reason(completion=done, completion_ids=[1, 3], eos_token_id=EOS) == "budget"
    assert finish_reason(completion=done, completion_ids=[], eos_token_id=EOS) == "budget"
    calling = [{"role": "assistant", "content": "", "tool_calls": [_call("1")]}]
    assert finish_reason(completion=calling, completion_ids=[EOS], eos_token_id=EOS) == "max_turns"
    tool = {"role": "tool", "name": P.TOOL_NAME, "content": "tool"}
    assert model_text([*calling, tool, *done]) == "a"


def test_trl_gets_rl_stage_s_prompts_step_by_step(tmp_path, tiny_model_dir):
    from benchmarks.peer.trl_side import step_rows
    from rstar2cli.train_utils import batch_indices

    train = tmp_path / "train.jsonl"
    problems = [
        {"id": str(i), "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(5)
    ]
    train.write_text("".join(json.dumps(p) + "\n" for p in problems), encoding="utf-8")
    recipe = _recipe(train, test=train, model=str(tiny_model_dir))
    rows = step_rows(recipe)
    assert len(rows) == KNOBS.num_steps * KNOBS.num_prompts_per_step
    for step in range(KNOBS.num_steps):  # 3 steps of 2 over 5 problems: into a second epoch
        drawn = batch_indices(step=step, num_examples=5, batch_size=2, seed=recipe.train.seed)
        got = rows[step * 2 : step * 2 + 2]
        assert [r["answer"] for r in got] == [problems[i]["answer"] for i in drawn]
        assert got[0]["prompt"] == prompt_messages(problems[drawn[0]]["question"])


# -- the arithmetic of the report ------------------------------------------------------------------


def _rows(*steps: tuple[float, float, float, float]) -> list[StepRow]:
    """(wall s, rollout s, response tokens, trained tokens) per step."""
    return [
        StepRow(
            step_s=step_s,
            rollout_s=rollout_s,
            response_tokens=tokens,
            trained_tokens=trained,
            reward=0.5,
            tool_calls_per_rollout=1.0,
        )
        for step_s, rollout_s, tokens, trained in steps
    ]


def test_summarise_uses_the_steps_after_the_first():
    s = summarise(_rows((100, 90, 1, 1), (10, 6, 100, 50), (30, 20, 300, 150), (20, 12, 200, 100)))
    assert s["step_s"] == 20  # median of 10, 30, 20; the 100 s start-up step is left out
    assert s["rollout_s"] == 12 and s["update_s"] == 8  # medians of 6/20/12 and 4/10/8
    assert s["gen_tokens_per_s"] == 600 / 60  # tokens of steps 2-4 over their 60 s
    assert s["trained_tokens_per_s"] == 300 / 60
    assert s["trained_tokens_per_step"] == 100 and s["first_step_s"] == 100
    assert summarise(_rows((7, 3, 70, 7)))["step_s"] == 7  # one step: it is all there is
    with pytest.raises(ValueError):
        summarise([])


def test_advantage_reads_the_same_way_for_every_metric():
    assert advantage(ours=10, trl=25, lower_is_better=True) == 2.5  # seconds: TRL / ours
    assert advantage(ours=30, trl=10, lower_is_better=False) == 3.0  # rates: ours / TRL
    assert advantage(ours=0, trl=5, lower_is_better=True) is None
    assert advantage(ours=5, trl=0, lower_is_better=False) is None
    ours = {"step_s": 10.0, "accuracy": 0.9, "peak_rss_mb": 3000.0, "tool_calls_per_rollout": 0.5}
    trl = {"step_s": 40.0, "accuracy": 0.6, "peak_rss_mb": 6000.0, "tool_calls_per_rollout": 0.25}
    # more or fewer tool calls is neither better nor worse: no ratio
    assert compare(ours, trl) == {"step_s": 4.0, "peak_rss_mb": 2.0, "accuracy": 1.5}
    lines = table(ours, trl).splitlines()
    assert len(lines) == 2 + 4
    assert lines[2] == f"| {METRICS[0][1]} | 10.0 | 40.0 | 4.00x |"
    assert lines[-1] == "| tool calls per rollout (training) | 0.5 | 0.25 | - |"


def test_rows_of_both_sides_in_common_units():
    ours = ours_rows(
        [
            {
                "time_step_s": 155.5,
                "time_rollout_s": 79.0,
                "time_grade_s": 0.5,
                "response_tokens": 130.875,
                "num_rollouts": 64,
                "num_train_tokens": 3052,
                "reward": 0.25,
                "tool_calls_per_rollout": 0.6875,
            }
        ]
    )
    assert ours == [
        StepRow(
            step_s=155.5,
            rollout_s=79.0,
            response_tokens=130.875 * 64,
            trained_tokens=3052,
            reward=0.25,
            tool_calls_per_rollout=0.6875,
        )
    ]
    trl = trl_rows(
        [
            {
                "time_step_s": 234.3,
                "time_generate_s": 206.4,
                "response_tokens": 548,
                "model_tokens": 548.0,
                "reward": None,
                "tool_calls_per_rollout": None,
            }
        ]
    )
    assert trl == [
        StepRow(
            step_s=234.3,
            rollout_s=206.4,
            response_tokens=548,
            trained_tokens=548.0,
            reward=0.0,
            tool_calls_per_rollout=0.0,
        )
    ]
