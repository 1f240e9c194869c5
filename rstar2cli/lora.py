"""LoRA adapters on a trainer's model, and the weights that leave it (merged, under HF names).

- `LoraConfig`: the `train.lora` section of the SFT and RL recipes (off by default).
- `add_adapters`: PEFT's LoRA layers injected into a transformers causal LM in place (the model
  keeps its class, so `ScoringLM`, gradient checkpointing and `save_pretrained` work as before);
  every base parameter is frozen, the adapters alone train, and the model's state_dict holds
  the adapters alone (what a checkpoint saves).
- `adapters_off` / `BaseOnly`: the adapted layers compute the base model's output (the KL
  reference of an RL step: the base with the adapter off, no second copy of the model).
- `weight_sources`: the weights an engine or an HF folder needs, per module, under the names and
  shapes of the model without adapters. An adapted layer's weight is merged on the fly from its
  frozen base W and its factors: W + (alpha / rank) B @ A, in float32, then cast back. A model
  without adapters gets its parameters as they are. `rstar2cli.train_utils.weight_buckets` and
  `rstar2cli.cluster.weight_sync` gather (ZeRO-3) and read these.
- `save_engine_checkpoint` / `load_engine_checkpoint`: the trainers' DeepSpeed checkpoints; with
  adapters the module state holds the factors alone (`adapter_state`), and a loaded one must hold
  exactly those (`check_adapter_state`). Without adapters: DeepSpeed's checkpoint as it is.
- `save_adapter` / `write_adapter_folder`: a PEFT adapter folder (adapter_config.json,
  adapter_model.safetensors with PEFT's key names), what `peft.PeftModel.from_pretrained` and
  vLLM's LoRA loader read; train_utils.save_hf writes it beside the merged final/.

What it does not do: build the DeepSpeed engine (train_utils.py), decide when to save, or load
adapters into vLLM: engines get merged weights, since vLLM-CPU decodes through its LoRA kernels
several times slower, which costs more than the cheaper adapter load saves
(benchmarks/lora_push.py). Kept free of torch/peft imports at module level.
Tested in tests/unit/test_lora.py (merge, names, gradients, adapter folder against PEFT) and
tests/gpu/smoke.py's train_lora stage (an RL update under ZeRO-3, checkpoint and resume).
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from rstar2cli.errors import UserError
from rstar2cli.recipe import RecipeModel

# the linear layers of a Llama / Qwen decoder layer (attention and MLP); not the embedding or
# the output layer, which PEFT's "all-linear" also leaves out
DEFAULT_TARGET_MODULES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
ADAPTER_FILE = "adapter_model.safetensors"
# PEFT's saved adapters name tensors as its PeftModel wrapper does, without the adapter's name
PEFT_KEY_PREFIX = "base_model.model."
_ADAPTER_NAME = "default"


class LoraConfig(RecipeModel):
    """Low-rank adapters in place of whole-weight training (off by default, as in the paper)."""

    enabled: bool = Field(
        False,
        description="Train LoRA adapters on the frozen base instead of every weight; engines and "
        "final/ get merged weights, checkpoints hold the adapter and its optimizer state.",
    )
    rank: int = Field(16, ge=1, le=1024, description="Rank r of each adapter's B @ A.")
    alpha: int = Field(
        32, ge=1, le=4096, description="Scale numerator: the update is (alpha / rank) B @ A."
    )
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout on an adapter's input while training (SFT only: RL needs 0.0, so the "
        "old-log-prob pass and the training pass score the same policy).",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TARGET_MODULES),
        min_length=1,
        description="Names (last part) of the linear layers that get adapters; the default is "
        "every attention and MLP projection of a Llama/Qwen decoder layer.",
    )

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def add_adapters(lm: Any, cfg: LoraConfig) -> Any:
    """Inject LoRA layers into `lm` in place (A random, B zero: the model's output is unchanged)
    and freeze everything else. Returns `lm`."""
    import peft

    peft_cfg = _peft_config(cfg)
    try:
        peft.inject_adapter_in_model(peft_cfg, lm, adapter_name=_ADAPTER_NAME)
    except ValueError as exc:  # no layer matched the targets
        raise UserError(
            f"train.lora.target_modules {cfg.target_modules} match no layer of the model "
            f"({str(exc).splitlines()[0][:200]})"
        ) from None
    for name, p in lm.named_parameters():
        p.requires_grad_(".lora_" in name)
    lm.register_state_dict_post_hook(_adapter_only_state)
    return lm


def _adapter_only_state(module: Any, state_dict: dict[str, Any], prefix: str, _: Any) -> None:
    """NOTE: an adapted model's state (what a checkpoint holds) is its adapter: the frozen base,
    tied aliases included (DeepSpeed's exclude_frozen_parameters misses the output layer tied to
    the embedding), comes from the model folder again on resume."""
    for name, p in module.named_parameters(remove_duplicate=False):
        if not p.requires_grad:
            state_dict.pop(prefix + name, None)


def _peft_config(cfg: LoraConfig) -> Any:
    import peft

    return peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
    )


def lora_layers(lm: Any) -> list[tuple[str, Any]]:
    """(module name, layer) of every adapted layer, in module order."""
    from peft.tuners.lora import LoraLayer

    return [(n, m) for n, m in lm.named_modules() if isinstance(m, LoraLayer)]


def has_adapters(lm: Any) -> bool:
    return bool(lora_layers(lm))


@contextmanager
def adapters_off(lm: Any) -> Iterator[None]:
    """The adapted layers compute their base layer's output inside the block.

    NOTE: PEFT's own switch (`enable_adapters(False)`) also flips requires_grad of the factors,
    which DeepSpeed's optimizer and hooks were built around; this block only reads the model (no
    grad), so it sets the flag PEFT's forward reads and leaves requires_grad alone."""
    layers = [m for _, m in lora_layers(lm)]
    before = [m._disable_adapters for m in layers]
    try:
        for m in layers:
            m._disable_adapters = True
        yield
    finally:
        for m, was in zip(layers, before, strict=True):
            m._disable_adapters = was


class BaseOnly:
    """A trainer's engine called with its adapters off: the base model it adapts, the KL
    reference of a LoRA RL run (verl's ref-in-actor), with no second copy of the weights."""

    def __init__(self, engine: Any):
        self.engine = engine

    def __call__(self, **inputs: Any) -> Any:
        with adapters_off(self.engine.module):
            return self.engine(**inputs)


# ---------------------------------------------------------------------------------------------
# The weights an engine needs


@dataclass(frozen=True)
class WeightSource:
    """One tensor as the model without adapters names it, and what makes it.

    `params`: (p,) for a plain parameter, or (W, A, B) for an adapted layer's weight (its frozen
    base and its factors); `scale`: alpha / rank for the latter. `shared`: the same tensor appears
    under another name too (tied embeddings)."""

    name: str
    params: tuple[Any, ...]
    scale: float = 0.0
    shared: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        p = self.params[0]
        return tuple(int(d) for d in getattr(p, "ds_shape", p.shape))  # ZeRO-3: the full shape

    @property
    def numel(self) -> int:
        p = self.params[0]
        return int(getattr(p, "ds_numel", p.numel()))

    def full(self) -> Any:
        """The tensor (inside a ZeRO-3 gather of `params`): the parameter, or the merged weight
        W + scale * B @ A computed in float32 and cast to W's dtype."""
        if len(self.params) == 1:
            return self.params[0]
        base, a, b = self.params
        delta = b.detach().float() @ a.detach().float()  # [out, r] @ [r, in] -> [out, in]
        return (base.detach().float() + self.scale * delta).to(base.dtype)


def weight_sources(lm: Any) -> list[list[WeightSource]]:
    """Per module that owns weights (module order, as `named_modules`): its tensors under the
    names of the model without adapters. An adapted layer is one module: its merged weight (and
    its base bias); a tied parameter appears under each of its names, flagged `shared`."""
    layers = dict(lora_layers(lm))
    counts = Counter(id(p) for m in lm.modules() for p in m.parameters(recurse=False))
    out: list[list[WeightSource]] = []
    for prefix, module in lm.named_modules():
        if any(prefix.startswith(f"{name}.") for name in layers):
            continue  # inside an adapted layer: its base layer and factors, merged below
        if prefix in layers:
            out.append(_merged(prefix, module))
            continue
        group = [
            WeightSource(
                name=f"{prefix}.{n}" if prefix else n, params=(p,), shared=counts[id(p)] > 1
            )
            for n, p in module.named_parameters(recurse=False)
        ]
        if group:
            out.append(group)
    return out


def _merged(prefix: str, layer: Any) -> list[WeightSource]:
    base = layer.get_base_layer()
    a = layer.lora_A[_ADAPTER_NAME].weight  # [r, in]
    b = layer.lora_B[_ADAPTER_NAME].weight  # [out, r]
    group = [
        WeightSource(
            name=f"{prefix}.weight",
            params=(base.weight, a, b),
            scale=float(layer.scaling[_ADAPTER_NAME]),
        )
    ]
    if getattr(base, "bias", None) is not None:
        group.append(WeightSource(name=f"{prefix}.bias", params=(base.bias,)))
    return group


def unique_sources(lm: Any) -> list[WeightSource]:
    """Every tensor once (a tied one under its first name), in module order: what a weight push
    sends (the order of `named_parameters` for a model without adapters)."""
    seen: set[int] = set()
    out = []
    for group in weight_sources(lm):
        for src in group:
            if id(src.params[0]) not in seen:
                seen.add(id(src.params[0]))
                out.append(src)
    return out


# ---------------------------------------------------------------------------------------------
# Checkpoints and the adapter folder


def adapter_state(lm: Any) -> list[tuple[str, Any]]:
    """(parameter name in `lm`, parameter) of every adapter factor: what a checkpoint holds."""
    return [(n, p) for n, p in lm.named_parameters() if p.requires_grad]


def check_adapter_state(keys: list[str], expected: list[str], where: str) -> None:
    """A checkpoint's module state (its parameter `keys`, buffers left out) must hold exactly
    the adapter factors: a whole-weight checkpoint, or one of other targets, would otherwise
    load nothing, silently. One-line UserError naming what differs."""
    got, want = set(keys), set(expected)
    if got != want:
        missing, extra = sorted(want - got), sorted(got - want)
        raise UserError(
            f"{where} is not a checkpoint of this LoRA setup: {len(missing)} adapter tensors "
            f"missing (e.g. {missing[:1]}), {len(extra)} unexpected (e.g. {extra[:1]}); set "
            "train.lora as that run had it, or start from a model folder (its final/)"
        )


def peft_state(named: list[tuple[str, Any]], prefix: str) -> dict[str, Any]:
    """Adapter factors (names in the trainer's module, under `prefix`) -> PEFT's saved key names:
    `base_model.model.<layer>.lora_A.weight` (the adapter's own name dropped)."""
    out = {}
    for name, tensor in named:
        key = name.removeprefix(prefix).replace(f".{_ADAPTER_NAME}.", ".")
        out[PEFT_KEY_PREFIX + key] = tensor
    return out


def write_adapter_folder(
    state: dict[str, Any], peft_config: Any, base_model: str, out_dir: Path
) -> Path:
    """A PEFT adapter folder written atomically: adapter_config.json (`peft_config`, a
    `peft.LoraConfig`) and the factors (PEFT key names, `peft_state`) in
    adapter_model.safetensors."""
    import copy

    from safetensors.torch import save_file

    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    peft_cfg = copy.copy(peft_config)
    peft_cfg.base_model_name_or_path = base_model
    peft_cfg.task_type = "CAUSAL_LM"
    peft_cfg.save_pretrained(str(tmp))
    tensors = {k: v.detach().contiguous() for k, v in state.items()}
    save_file(tensors, str(tmp / ADAPTER_FILE), metadata={"format": "pt"})
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return out_dir


def save_adapter(lm: Any, out_dir: Path, zero3: bool, rank: int) -> None:
    """Collective: the adapter factors gathered (ZeRO-3) and written by rank 0 in PEFT's format."""
    import deepspeed

    named = adapter_state(lm)
    with deepspeed.zero.GatheredParameters([p for _, p in named], enabled=zero3):
        tensors = [(n, p.detach().to("cpu", copy=True)) for n, p in named] if rank == 0 else []
    if rank == 0:
        write_adapter_folder(
            state=peft_state(tensors, prefix=""),
            peft_config=lm.peft_config["default"],  # PEFT keeps it on the model it adapted
            base_model=_absolute(str(lm.name_or_path)),
            out_dir=out_dir,
        )


def _absolute(path: str) -> str:
    """A local folder as an absolute path (a later stage may run elsewhere); a hub id as it is."""
    return str(Path(path).resolve()) if Path(path).is_dir() else path


def save_engine_checkpoint(
    engine: Any, ckpt_dir: Path, tag: str, client_state: dict[str, Any]
) -> None:
    """Collective: DeepSpeed's checkpoint ckpt_dir/<tag> (+ `latest`). With LoRA adapters the
    frozen base stays out: the module state holds the adapter factors, beside their optimizer
    state (the base is the run's model folder, read again on resume).
    NOTE: `latest` is written here, atomically, after every rank saved: DeepSpeed writes it in
    place, so a kill at that moment left an empty `latest` that no resume could read."""
    from rstar2cli.fileio import atomic_path

    engine.save_checkpoint(
        str(ckpt_dir),
        tag=tag,
        client_state=client_state,
        save_latest=False,
        exclude_frozen_parameters=has_adapters(engine.module),
    )
    if engine.global_rank == 0:
        with atomic_path(Path(ckpt_dir) / "latest") as tmp:
            tmp.write_text(tag)


def load_engine_checkpoint(
    engine: Any,
    ckpt_dir: Path,
    module_only: bool = False,
    with_scheduler: bool = True,
) -> dict[str, Any] | None:
    """Collective: load the newest checkpoint of ckpt_dir (returns its client state). With LoRA
    adapters its module state must hold exactly the adapter factors, without them no factor at
    all (one-line UserError else: DeepSpeed would load nothing, or fail on missing keys)."""
    adapted = has_adapters(engine.module)
    expected = [n for n, _ in adapter_state(engine.module)] if adapted else []

    def load_fn(src: dict[str, Any], dst: Any) -> None:
        if not adapted:
            if any(".lora_" in k for k in src):
                raise UserError(
                    f"{ckpt_dir} holds LoRA adapters and this run trains whole weights: set "
                    "train.lora as that run had it, or start from a model folder (its final/)"
                )
            dst.load_state_dict(src)
            return
        buffers = {n for n, _ in dst.named_buffers()}
        check_adapter_state([k for k in src if k not in buffers], expected, where=str(ckpt_dir))
        dst.load_state_dict(src, strict=False)

    _, client = engine.load_checkpoint(
        str(ckpt_dir),
        load_module_only=module_only,
        load_optimizer_states=not module_only,
        load_lr_scheduler_states=with_scheduler and not module_only,
        custom_load_fn=load_fn,
    )
    return client


def run_base_model(run_dir: Path) -> str | None:
    """The base model a finished LoRA run trained on (its final_adapter/ says), None for a run
    of whole weights: a LoRA run's checkpoints continue on that base, not on its merged final/."""
    config = run_dir / "final_adapter" / "adapter_config.json"
    if not config.is_file():
        return None
    import json

    return str(json.loads(config.read_text())["base_model_name_or_path"])
