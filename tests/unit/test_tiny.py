"""Tiny-model kit: tokenizer invariants and a transformers load of the saved folder."""

from rstar2cli import protocol as P
from rstar2cli.data.tiny import build_tokenizer


def test_special_tokens_are_single_ids_and_text_roundtrips():
    tok = build_tokenizer()
    ids = [tok.convert_tokens_to_ids(t) for t in P.SPECIAL_TOKENS]
    assert len(set(ids)) == len(P.SPECIAL_TOKENS) and tok.unk_token_id not in ids
    for t in P.SPECIAL_TOKENS:
        assert tok.encode(t, add_special_tokens=False) == [tok.convert_tokens_to_ids(t)]
    text = P.render_prompt("Compute 37*41+5.") + P.format_tool_call("print(37*41+5)") + P.IM_END
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    # byte-level: any unicode survives
    odd = "∑ é 漢字 \x00\t"
    assert tok.decode(tok.encode(odd, add_special_tokens=False)) == odd


def test_tokenizer_is_deterministic_and_compact():
    a, b = build_tokenizer(), build_tokenizer()
    prompt = P.render_prompt("Compute 1+2.")
    ids = a.encode(prompt, add_special_tokens=False)
    assert ids == b.encode(prompt, add_special_tokens=False)
    # BPE merges cover the fixed protocol text: far fewer tokens than bytes
    assert len(ids) < len(prompt.encode()) / 3


def test_saved_folder_loads_in_transformers(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert tok.eos_token == P.IM_END and model.config.eos_token_id == tok.eos_token_id
    assert model.config.model_type == "qwen3"
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    ids = torch.tensor([tok.encode(P.render_prompt("Compute 1+2."), add_special_tokens=False)])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
