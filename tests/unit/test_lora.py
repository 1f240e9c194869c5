"""LoRA on the tiny model, without DeepSpeed: the recipe section, gradients reaching only the
adapter factors, the merged weights the engines get (base + (alpha / rank) B @ A under the plain
model's names), the adapters-off base, the adapter folder PEFT loads, the checkpoint key check,
and the one-GPU fit of Qwen3-14B with and without LoRA."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from rstar2cli import lora
from rstar2cli.errors import UserError
from rstar2cli.recipe import load_recipe
from rstar2cli.rl.stage_recipe import RlRecipe
from rstar2cli.sft.coldstart_recipe import SftRecipe

REPO = Path(__file__).resolve().parents[2]
RANK, ALPHA = 4, 8  # scale 2.0


def _adapted(model_dir: Path, seed: int = 1):
    """The tiny model with adapters whose B is not zero (as after some training)."""
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora.add_adapters(lm, lora.LoraConfig(enabled=True, rank=RANK, alpha=ALPHA))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in lora.lora_layers(lm):
            b = layer.lora_B["default"].weight
            b.copy_(torch.randn(b.shape, generator=g) * 0.05)
    return lm


def _plain(model_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _logits(lm, ids):
    import torch

    with torch.no_grad():
        return lm(input_ids=ids).logits


def test_lora_is_off_in_every_recipe_and_its_fields_have_bounds(tmp_path):
    for path in sorted((REPO / "recipes").rglob("*.yaml")):
        schema = SftRecipe if "sft" in path.name else RlRecipe
        assert load_recipe(path, schema).train.lora.enabled is False, path
    for name, field in lora.LoraConfig.model_fields.items():
        assert field.description, name
    recipe = tmp_path / "rl.yaml"
    recipe.write_text((REPO / "recipes/tiny/rl.yaml").read_text())
    with pytest.raises(UserError) as err:
        load_recipe(
            recipe,
            RlRecipe,
            sets=["train.lora.enabled=true", "train.lora.rank=0", "train.lora.target_modules=[]"],
        )
    assert "train.lora.rank" in str(err.value) and "train.lora.target_modules" in str(err.value)
    # RL: a dropout would make the training pass score another policy than the old-log-prob pass
    with pytest.raises(UserError, match="dropout .* must be 0.0 in RL"):
        load_recipe(recipe, RlRecipe, sets=["train.lora.enabled=true", "train.lora.dropout=0.1"])
    sft = load_recipe(
        REPO / "recipes/tiny/sft.yaml",
        SftRecipe,
        sets=["train.lora.enabled=true", "train.lora.dropout=0.1"],
    )
    assert sft.train.lora.dropout == 0.1


def test_gradients_reach_only_the_adapter_factors(tiny_model_dir):
    import torch

    from rstar2cli.lm_scoring import ScoringLM

    lm = _adapted(tiny_model_dir)
    lm.train()
    ids = torch.randint(
        0, lm.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)
    )
    rows = torch.tensor([0, 0, 1, 1])
    cols = torch.tensor([3, 4, 5, 6])
    logp, _ = ScoringLM(lm)(ids, rows, cols, ids[rows, cols + 1])
    logp.sum().backward()
    named = dict(lm.named_parameters())
    trained = {n for n, p in named.items() if p.requires_grad}
    assert trained == {n for n in named if ".lora_A." in n or ".lora_B." in n}
    assert all(named[n].grad is None for n in named if n not in trained)  # the base: no gradient
    # every factor gets one (A's is non-zero because B is; B's always)
    assert all(named[n].grad is not None and named[n].grad.abs().sum() > 0 for n in trained)
    # 7 projections x 2 layers, each A [4, in] and B [out, 4]
    assert len(trained) == 2 * 7 * 2


def test_merged_weights_are_base_plus_scaled_ba_under_the_plain_names(tiny_model_dir):
    import torch

    lm, plain = _adapted(tiny_model_dir), _plain(tiny_model_dir)
    sources = lora.unique_sources(lm)
    assert [(s.name, s.shape) for s in sources] == [
        (n, tuple(p.shape)) for n, p in plain.named_parameters()
    ]
    base = dict(plain.named_parameters())
    layers = dict(lora.lora_layers(lm))
    merged = {s.name: s.full() for s in sources}
    for prefix, layer in layers.items():
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        want = base[f"{prefix}.weight"] + (ALPHA / RANK) * (b @ a)
        torch.testing.assert_close(merged[f"{prefix}.weight"], want, rtol=1e-6, atol=1e-6)
        assert not torch.equal(merged[f"{prefix}.weight"], base[f"{prefix}.weight"])
    for name in set(merged) - {f"{p}.weight" for p in layers}:
        assert torch.equal(merged[name], base[name])  # not adapted: the base as it is
    # the plain model holding the merged weights computes what the adapted model computes
    plain.load_state_dict(merged, strict=False)
    ids = torch.arange(3, 23)[None]
    torch.testing.assert_close(_logits(plain, ids), _logits(lm, ids), rtol=1e-4, atol=1e-5)


def test_adapters_off_is_the_base_model(tiny_model_dir):
    import torch

    lm, plain = _adapted(tiny_model_dir), _plain(tiny_model_dir)
    ids = torch.arange(3, 23)[None]
    assert not torch.allclose(_logits(lm, ids), _logits(plain, ids))
    with lora.adapters_off(lm):
        torch.testing.assert_close(_logits(lm, ids), _logits(plain, ids), rtol=0, atol=1e-6)
    assert all(p.requires_grad for n, p in lm.named_parameters() if ".lora_" in n)
    assert not torch.allclose(_logits(lm, ids), _logits(plain, ids))  # back on after the block


def test_the_merged_push_sends_base_plus_ba(tiny_model_dir):
    """send_module through a one-member gloo group: the checksum of what went on the wire is the
    one of the plain model holding base + scale * B @ A, bucket by bucket."""
    import torch

    from rstar2cli.cluster import weight_sync as ws

    lm, plain = _adapted(tiny_model_dir), _plain(tiny_model_dir)
    with torch.no_grad():
        for prefix, layer in lora.lora_layers(lm):
            a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
            plain.get_submodule(prefix).weight += (ALPHA / RANK) * (b @ a)
    plan = ws.module_plan(lm, "float32", max_bucket_bytes=2**16)
    assert plan == ws.module_plan(plain, "float32", max_bucket_bytes=2**16)
    assert len(plan.buckets) > 1
    params = dict(plain.named_parameters())
    scratch = ws.empty_buffer(ws._largest(plan), "float32", "cpu")
    want = ws.combine(
        [
            ws.checksum(ws.pack([params[s.name] for s in b], b, scratch).clone())
            for b in plan.buckets
        ]
    )
    group = ws.open_group(ws.GroupAddress("127.0.0.1", ws.free_port(), 1, "gloo"), 0, timeout_s=30)
    sent = ws.send_module(module=lm, group=group, plan=plan, zero3=False, device="cpu")
    # NOTE: the same float32 operations (W + scale * (B @ A)) on both sides: the same bytes
    assert sent == want


def test_final_folder_is_merged_and_the_adapter_beside_it_loads_in_peft(tiny_model_dir, tmp_path):
    """train_utils.save_hf (no ZeRO) of an adapted model: final/ loads in transformers as the
    adapted model, final_adapter/ in PEFT on the base as the same model."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rstar2cli.train_utils import save_hf

    lm = _adapted(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    final = save_hf(lm=lm, tokenizer=tok, out_dir=tmp_path / "final", zero3=False, rank=0)
    adapter = tmp_path / "final_adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["task_type"]) == (RANK, ALPHA, "CAUSAL_LM")
    assert config["base_model_name_or_path"] == str(tiny_model_dir)
    merged = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    assert [n for n, _ in merged.named_parameters()] == [
        n for n, _ in _plain(tiny_model_dir).named_parameters()
    ]
    on_base = PeftModel.from_pretrained(_plain(tiny_model_dir), adapter)
    ids = torch.arange(3, 23)[None]
    want = _logits(lm, ids)
    torch.testing.assert_close(_logits(merged, ids), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(_logits(on_base, ids), want, rtol=1e-4, atol=1e-5)


def test_a_checkpoint_must_hold_exactly_this_adapter(tiny_model_dir):
    lm = _adapted(tiny_model_dir)
    expected = [n for n, _ in lora.adapter_state(lm)]
    lora.check_adapter_state(expected, expected, where="ckpt")
    whole = [n for n, _ in _plain(tiny_model_dir).named_parameters()]
    with pytest.raises(UserError, match="not a checkpoint of this LoRA setup: 28 adapter tensors"):
        lora.check_adapter_state(whole, expected, where="ckpt")
    with pytest.raises(UserError, match="target_modules .* match no layer"):
        lora.add_adapters(_plain(tiny_model_dir), lora.LoraConfig(target_modules=["no_such"]))


# -- the one-GPU fit -----------------------------------------------------------------------

QWEN3_14B = {"hidden": 5120, "layers": 40, "q": 5120, "kv": 1024, "mlp": 17408, "vocab": 151936}
H100_BYTES = 80 * 10**9


def _qwen3_14b_shapes() -> dict[str, list[int]]:
    d = QWEN3_14B
    h = d["hidden"]
    shapes = {"model.embed_tokens.weight": [d["vocab"], h], "lm_head.weight": [d["vocab"], h]}
    shapes["model.norm.weight"] = [h]
    for i in range(d["layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": [d["q"], h],
            p + "self_attn.k_proj.weight": [d["kv"], h],
            p + "self_attn.v_proj.weight": [d["kv"], h],
            p + "self_attn.o_proj.weight": [h, d["q"]],
            p + "self_attn.q_norm.weight": [128],
            p + "self_attn.k_norm.weight": [128],
            p + "mlp.gate_proj.weight": [d["mlp"], h],
            p + "mlp.up_proj.weight": [d["mlp"], h],
            p + "mlp.down_proj.weight": [h, d["mlp"]],
            p + "input_layernorm.weight": [h],
            p + "post_attention_layernorm.weight": [h],
        }
    return shapes


def _header_only_folder(folder: Path, shapes: dict[str, list[int]]) -> Path:
    """A safetensors file holding only its header (the fit check reads nothing else)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2
        for d in shape:
            size *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return folder


def test_qwen3_14b_with_lora_fits_one_80gb_gpu_where_whole_weights_are_refused(tmp_path):
    from rstar2cli.cluster import gpu_fit
    from rstar2cli.rl.stage_setup import shared_gpu_fit

    model = _header_only_folder(tmp_path / "qwen3-14b", _qwen3_14b_shapes())
    shapes = gpu_fit.tensor_shapes(model)
    assert gpu_fit.model_numel(model) == 14_768_307_200
    # per layer r x (in + out): q 10240, k 6144, v 6144, o 10240, gate/up/down 22528 each
    assert gpu_fit.adapter_numel(shapes, 16, list(lora.DEFAULT_TARGET_MODULES)) == 16 * 40 * 100_352
    recipe = load_recipe(REPO / "recipes/stage1_8k.yaml", RlRecipe)
    whole = recipe.model_copy(deep=True)
    with pytest.raises(UserError) as err:
        shared_gpu_fit(whole, model=str(model), memory_fraction=0.5, device_bytes=H100_BYTES)
    # 18 B x 14.77e9 = 265.8e9 B; the engine's half of 74.5 GiB
    assert "\n" not in str(err.value)
    assert "weights, gradients and optimizer (247.6 GiB)" in str(err.value)
    assert "train LoRA adapters (train.lora.enabled)" in str(err.value)
    recipe.train.lora = lora.LoraConfig(enabled=True, rank=16)
    line = shared_gpu_fit(recipe, model=str(model), memory_fraction=0.5, device_bytes=H100_BYTES)
    # 2 B x 14.77e9 base + 18 B x 64.2e6 adapter = 30.69e9 B = 28.6 GiB, beside 37.3 GiB
    assert line == (
        "one GPU for trainer and engine: the trainer's bf16 base and adapter state (28.6 GiB) "
        "and the engine's share (0.50 x 74.5 GiB = 37.3 GiB) fit the GPU's 74.5 GiB"
    )
    # ZeRO-3 over 4 ranks divides the base too; the adapter state is small at any stage
    assert gpu_fit.trainer_resident_bytes(1000, 3, world=4, trainable_numel=10) == (
        2 * 1010 // 4 + 40 // 4 + 120 // 4
    )


def test_init_from_a_lora_stage_continues_on_its_base_not_its_merged_final(tmp_path):
    from rstar2cli.commands.rl_stage import _resolve_init

    run = tmp_path / "stage1"
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text("{}")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest").write_text("step10")
    assert _resolve_init(run, reset_optimizer=False) == (str(run / "final"), run / "checkpoints")
    (run / "final_adapter").mkdir()
    config = {"base_model_name_or_path": "/models/base", "r": 16}
    (run / "final_adapter" / "adapter_config.json").write_text(json.dumps(config))
    assert _resolve_init(run, reset_optimizer=True) == ("/models/base", run / "checkpoints")
