"""Token-level PPO clip loss with asymmetric clip, optional KL / entropy terms, metrics."""

from __future__ import annotations

import math

import pytest
import torch

from rstar2cli.rl.loss import ppo_clip_loss, token_entropy, token_logprobs

# One sequence of 4 tokens; the last is masked out (a tool-response token).
# ratios exp(logp - old) = [1.5, 0.5, 1.1, (anything)]
MASK = torch.tensor([[1, 1, 1, 0]])
OLD = torch.zeros(1, 4)


def _logprobs(last: float = 0.0) -> torch.Tensor:
    values = [math.log(1.5), math.log(0.5), math.log(1.1), last]
    return torch.tensor([values], requires_grad=True)


def test_positive_advantage_clips_high_at_1_28():
    # A = +1. per token: -min(r, clip(r, 0.8, 1.28))
    #   r 1.5 -> -min(1.5, 1.28) = -1.28 (clipped high)
    #   r 0.5 -> -min(0.5, 0.8) = -0.5 (no clip for A > 0 on the low side)
    #   r 1.1 -> -1.1
    # loss = -(1.28 + 0.5 + 1.1) / 3 = -0.96
    logp = _logprobs()
    loss, metrics = ppo_clip_loss(logp, OLD, torch.tensor([1.0]), MASK)
    assert loss.item() == pytest.approx(-0.96, abs=1e-6)
    assert metrics.num_tokens == 3
    assert metrics.clip_frac_high == pytest.approx(1 / 3)
    assert metrics.clip_frac_low == 0.0
    loss.backward()
    # d/dlogp of -r/3 is -r/3 where unclipped; 0 where clipped and at the masked token.
    expected_grad = torch.tensor([[0.0, -0.5 / 3, -1.1 / 3, 0.0]])
    assert torch.allclose(logp.grad, expected_grad, atol=1e-6)


def test_negative_advantage_clips_low_at_0_8():
    # A = -1. per token: -min(-r, -clip(r, 0.8, 1.28)) = max(r, clip(r))
    #   r 1.5 -> max(1.5, 1.28) = 1.5 (no clip for A < 0 on the high side)
    #   r 0.5 -> max(0.5, 0.8) = 0.8 (clipped low)
    #   r 1.1 -> 1.1
    # loss = (1.5 + 0.8 + 1.1) / 3 = 3.4 / 3
    loss, metrics = ppo_clip_loss(_logprobs(), OLD, torch.tensor([-1.0]), MASK)
    assert loss.item() == pytest.approx(3.4 / 3, abs=1e-6)
    assert metrics.clip_frac_low == pytest.approx(1 / 3)
    assert metrics.clip_frac_high == 0.0


def test_dual_clip_bounds_a_negative_advantage_at_large_ratios():
    # A = -1, clip_ratio_c 3. ratios [5.0, 2.0, 0.5]:
    #   no dual clip: max(r, clip(r)) = [5.0, 2.0, 0.8]; the first token pulls with gradient r/3
    #   dual clip: min(that, 3 x |A|) = [3.0, 2.0, 0.8]: the first is a constant, no gradient;
    #   the second (r 2 < 3) keeps its gradient 2/3; the third is clipped low as before.
    def run(clip_ratio_c):
        logp = torch.tensor([[math.log(5.0), math.log(2.0), math.log(0.5)]], requires_grad=True)
        loss, _ = ppo_clip_loss(
            logp,
            torch.zeros(1, 3),
            torch.tensor([-1.0]),
            torch.ones(1, 3),
            clip_ratio_c=clip_ratio_c,
        )
        loss.backward()
        return loss.item(), logp.grad

    loss, grad = run(3.0)
    assert loss == pytest.approx((3.0 + 2.0 + 0.8) / 3, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[0.0, 2.0 / 3, 0.0]]), atol=1e-6)
    loss_off, grad_off = run(None)
    assert loss_off == pytest.approx((5.0 + 2.0 + 0.8) / 3, abs=1e-6)
    assert torch.allclose(grad_off, torch.tensor([[5.0 / 3, 2.0 / 3, 0.0]]), atol=1e-6)
    # a positive advantage is never dual-clipped: A = +1, r = 5 -> -1.28, as without it
    logp = torch.tensor([[math.log(5.0)]], requires_grad=True)
    pos, _ = ppo_clip_loss(
        logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), clip_ratio_c=3.0
    )
    assert pos.item() == pytest.approx(-1.28, abs=1e-6)


def test_approx_kl_metric_is_k3_of_old_vs_new():
    # k3 per token: (r - 1) - log r
    #   1.5: 0.5 - 0.405465 = 0.094535; 0.5: -0.5 + 0.693147 = 0.193147; 1.1: 0.1 - 0.095310
    # mean over 3 tokens = (0.094535 + 0.193147 + 0.004690) / 3 = 0.097457
    _, metrics = ppo_clip_loss(_logprobs(), OLD, torch.tensor([1.0]), MASK)
    assert metrics.approx_kl == pytest.approx(0.097457, abs=1e-5)


def test_average_is_over_all_tokens_not_per_sequence():
    # ratios all 1, so each token's loss is -A. Sequence 0: A = +1 on 3 tokens; sequence 1:
    # A = -1 on 1 token. Token mean = (-3 + 1) / 4 = -0.5 (a per-sequence mean would give 0).
    logp = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    loss, metrics = ppo_clip_loss(logp, torch.zeros(2, 4), torch.tensor([1.0, -1.0]), mask)
    assert loss.item() == pytest.approx(-0.5)
    assert metrics.num_tokens == 4


def test_token_level_advantages_are_accepted():
    # [B, T] advantages: tokens with A = [2, -1, 0, 5], ratios 1 -> loss = -(2 - 1 + 0) / 3
    adv = torch.tensor([[2.0, -1.0, 0.0, 5.0]])
    loss, _ = ppo_clip_loss(torch.zeros(1, 4), OLD, adv, MASK)
    assert loss.item() == pytest.approx(-1 / 3)


def test_garbage_at_masked_positions_gives_no_nan():
    # Padding log-probs of +1e4 would overflow exp() to inf; inf * 0 must not leak a NaN.
    logp = _logprobs(last=1.0e4)
    loss, metrics = ppo_clip_loss(logp, OLD, torch.tensor([1.0]), MASK)
    loss.backward()
    assert loss.item() == pytest.approx(-0.96, abs=1e-6)
    assert torch.isfinite(logp.grad).all() and math.isfinite(metrics.approx_kl)


def test_micro_batches_sum_to_the_batch_loss_with_num_batch_tokens():
    # Whole batch: 4 tokens (3 + 1) -> -0.5 as above. Split in two micro-batches, each divided
    # by the batch's 4 tokens: -3/4 + 1/4 = -0.5.
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    adv = torch.tensor([1.0, -1.0])
    parts = [
        ppo_clip_loss(
            torch.zeros(1, 4),
            torch.zeros(1, 4),
            adv[i : i + 1],
            mask[i : i + 1],
            num_batch_tokens=4,
        )[0]
        for i in range(2)
    ]
    assert parts[0].item() == pytest.approx(-0.75)
    assert sum(parts).item() == pytest.approx(-0.5)


def test_empty_mask_gives_zero_loss():
    loss, metrics = ppo_clip_loss(_logprobs(), OLD, torch.tensor([1.0]), torch.zeros(1, 4))
    assert loss.item() == 0.0 and metrics.num_tokens == 0


def test_kl_term_off_by_default_and_k3_when_on():
    # logp = log 0.5 on one token, ref = log 0.25, old = logp (ratio 1, A = 0 -> clip term 0)
    # d = ref - logp = log 0.5: k3 = e^d - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]])
    mask = torch.ones(1, 1)
    loss, metrics = ppo_clip_loss(logp, logp.detach(), torch.zeros(1), mask)
    assert loss.item() == 0.0 and metrics.kl_ref is None
    loss, metrics = ppo_clip_loss(
        logp, logp.detach(), torch.zeros(1), mask, ref_logprobs=ref, kl_coef=0.1
    )
    assert metrics.kl_ref == pytest.approx(0.193147, abs=1e-6)
    assert loss.item() == pytest.approx(0.1 * 0.193147, abs=1e-6)
    with pytest.raises(ValueError, match="ref_logprobs"):
        ppo_clip_loss(logp, logp.detach(), torch.zeros(1), mask, kl_coef=0.1)


def test_entropy_metric_and_optional_bonus():
    # entropy [0.5, 1.0, 1.5, (masked 9.9)] -> mean 1.0
    entropy = torch.tensor([[0.5, 1.0, 1.5, 9.9]])
    base, _ = ppo_clip_loss(_logprobs(), OLD, torch.tensor([1.0]), MASK)
    loss, metrics = ppo_clip_loss(_logprobs(), OLD, torch.tensor([1.0]), MASK, entropy=entropy)
    assert metrics.entropy == pytest.approx(1.0)
    assert loss.item() == pytest.approx(base.item())  # coefficient 0 by default
    loss, _ = ppo_clip_loss(
        _logprobs(), OLD, torch.tensor([1.0]), MASK, entropy=entropy, entropy_coef=0.1
    )
    assert loss.item() == pytest.approx(-0.96 - 0.1 * 1.0, abs=1e-6)


def test_token_logprobs_and_entropy():
    # Uniform logits over 4 tokens: log p = -log 4, entropy = log 4.
    # Logits [0, log 3, 0, 0] -> p = [1/6, 1/2, 1/6, 1/6]: log p[1] = log 0.5;
    # entropy = -(3 * 1/6 * log(1/6) + 1/2 * log(1/2)) = 0.5 log 6 + 0.5 log 2 = 1.242453
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), 0.0, 0.0]]])  # [1, 2, 4]
    targets = torch.tensor([[2, 1]])
    assert torch.allclose(
        token_logprobs(logits, targets), torch.tensor([[-math.log(4), math.log(0.5)]])
    )
    assert torch.allclose(token_entropy(logits), torch.tensor([[math.log(4), 1.242453]]), atol=1e-5)


def test_chunked_logprobs_equal_the_full_logits_values_and_gradients():
    from rstar2cli.lm_scoring import chunked_logprobs

    # 7 positions in chunks of 3 (3 + 3 + 1), a 5-word vocabulary: the same numbers as one
    # full [7, 5] log-softmax, and the same gradients for the hidden states and the head.
    torch.manual_seed(0)
    head = torch.nn.Linear(4, 5, bias=False)
    hidden = torch.randn(7, 4, requires_grad=True)
    targets = torch.tensor([0, 4, 2, 2, 1, 3, 0])
    weights = torch.randn(7)  # a stand-in for the per-token loss weights
    logp, entropy = chunked_logprobs(
        hidden, head, targets, with_entropy=True, entropy_grad=True, chunk_tokens=3
    )
    ((logp * weights).sum() + entropy.sum()).backward()
    got = (hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None

    logits = head(hidden)[None]  # [1, 7, 5]
    full_logp = token_logprobs(logits, targets[None])[0]  # [7]
    full_entropy = token_entropy(logits)[0]  # [7]
    ((full_logp * weights).sum() + full_entropy.sum()).backward()
    assert torch.allclose(logp, full_logp, atol=1e-6)
    assert torch.allclose(entropy, full_entropy, atol=1e-6)
    assert torch.allclose(got[0], hidden.grad, atol=1e-6)
    assert torch.allclose(got[1], head.weight.grad, atol=1e-6)


def test_chunked_entropy_metric_adds_no_gradient():
    from rstar2cli.lm_scoring import chunked_logprobs

    torch.manual_seed(1)
    head = torch.nn.Linear(4, 5, bias=False)
    hidden = torch.randn(6, 4, requires_grad=True)
    targets = torch.tensor([1, 2, 3, 4, 0, 1])
    logp, entropy = chunked_logprobs(hidden, head, targets, with_entropy=True, chunk_tokens=4)
    assert entropy is not None and not entropy.requires_grad and logp.requires_grad
    no_entropy, none = chunked_logprobs(hidden, head, targets, chunk_tokens=4)
    assert none is None and torch.equal(logp, no_entropy)


def test_scoring_lm_matches_the_models_own_logits(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rstar2cli.lm_scoring import ScoringLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.tensor([[5, 9, 12, 40, 41, 7], [3, 8, 2, 2, 0, 0]])  # [2, 6]
    attn = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    rows, cols = torch.tensor([0, 0, 1, 1]), torch.tensor([2, 4, 0, 2])
    targets = ids[rows, cols + 1]  # position t predicts token t + 1
    with torch.no_grad():
        logp, entropy = ScoringLM(model)(
            ids, rows, cols, targets, attention_mask=attn, with_entropy=True
        )
        logits = model(input_ids=ids, attention_mask=attn).logits[rows, cols][None]  # [1, 4, V]
    assert torch.allclose(logp, token_logprobs(logits, targets[None])[0], atol=1e-5)
    assert torch.allclose(entropy, token_entropy(logits)[0], atol=1e-5)


def test_scoring_lm_scores_at_the_rollout_temperature(tiny_model_dir):
    """A rollout sampled at T: the trainer's log-probs are those of logits / T (as vLLM's
    processed log-probs and verl's trainer), entropy too."""
    from transformers import AutoModelForCausalLM

    from rstar2cli.lm_scoring import ScoringLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = torch.tensor([[5, 9, 12, 40, 41, 7]])  # [1, 6]
    rows, cols = torch.zeros(5, dtype=torch.long), torch.arange(5)
    targets = ids[rows, cols + 1]
    with torch.no_grad():
        logp, entropy = ScoringLM(model)(
            ids, rows, cols, targets, with_entropy=True, temperature=0.6
        )
        plain, _ = ScoringLM(model)(ids, rows, cols, targets)
        logits = model(input_ids=ids).logits[rows, cols][None] / 0.6  # [1, 5, V]
    assert torch.allclose(logp, token_logprobs(logits, targets[None])[0], atol=1e-5)
    assert torch.allclose(entropy, token_entropy(logits)[0], atol=1e-5)
    assert (logp - plain).abs().max() > 1e-2  # T matters for this model


def _tiny_wrapper(kind: str):
    """A 1-layer model of a family whose CausalLM wrapper processes its logits, with a large
    output layer so that the processing changes the log-probs a lot."""
    from transformers import AutoModelForCausalLM, CohereConfig, Gemma2Config, GraniteConfig

    shape = dict(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    config = {
        "gemma2": lambda: Gemma2Config(**shape, head_dim=8, final_logit_softcapping=2.0),
        "cohere": lambda: CohereConfig(**shape, logit_scale=0.25),
        "granite": lambda: GraniteConfig(**shape, logits_scaling=4.0),
    }[kind]()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(200.0)
    return model


@pytest.mark.parametrize("kind", ["gemma2", "cohere", "granite"])
def test_scoring_lm_applies_the_wrappers_logit_processing(kind):
    """Gemma2's soft-capping, Cohere's and Granite's scaling: the trainer's log-probs are those
    of the logits the wrapper returns (what an engine samples from), not the output layer's."""
    from rstar2cli.lm_scoring import ScoringLM

    model = _tiny_wrapper(kind)
    ids = torch.tensor([[5, 9, 12, 40, 41, 7]])
    rows, cols = torch.zeros(5, dtype=torch.long), torch.arange(5)
    targets = ids[rows, cols + 1]
    with torch.no_grad():
        logp, _ = ScoringLM(model)(ids, rows, cols, targets)
        logits = model(input_ids=ids).logits[rows, cols][None]  # [1, 5, V], the wrapper's
        raw = model.get_output_embeddings()(model.get_decoder()(input_ids=ids)[0])[rows, cols]
    assert torch.allclose(logp, token_logprobs(logits, targets[None])[0], atol=1e-4)
    unprocessed = token_logprobs(raw[None], targets[None])[0]
    assert (unprocessed - logp).abs().max() > 0.1  # what scoring the output layer alone gives


def test_the_rl_models_dropout_is_off_so_train_and_eval_passes_agree(tiny_model_dir):
    """A model whose config asks for dropout (attention_dropout: a probability each attention
    module copies at build time; GPT-2: nn.Dropout modules): after `without_dropout`, a pass in
    train mode (the training pass) equals one in eval mode (the old-log-prob pass)."""
    from transformers import AutoModelForCausalLM, GPT2Config

    from rstar2cli.train_utils import without_dropout

    qwen = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attention_dropout=0.5
    )
    torch.manual_seed(0)
    gpt2 = AutoModelForCausalLM.from_config(
        GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.5, embd_pdrop=0.5)
    )
    ids = torch.tensor([[5, 9, 12, 40, 41, 7]])
    for model in (qwen, gpt2):
        with torch.no_grad():
            noisy = [model.train()(input_ids=ids).logits for _ in range(2)]
            assert not torch.allclose(noisy[0], noisy[1])  # dropout on, as configured
            without_dropout(model)
            train = model.train()(input_ids=ids).logits
            evaluated = model.eval()(input_ids=ids).logits
        assert torch.equal(train, evaluated)


def _two_mini_batch_update(eps_high: float) -> tuple[torch.Tensor, list[float]]:
    """The trainer's order on a one-position, three-word policy: old log-probs once, before the
    first step; then one SGD step (lr 1) per mini-batch. Each mini-batch holds word 0, A = +1."""
    logits = torch.zeros(3, requires_grad=True)
    old = torch.log_softmax(logits.detach(), -1)[0].reshape(1, 1)  # log 1/3, before any step
    clip_high = []
    for _ in range(2):
        logp = torch.log_softmax(logits, -1)[0].reshape(1, 1)
        loss, metrics = ppo_clip_loss(
            logp, old, torch.tensor([1.0]), torch.ones(1, 1), eps_high=eps_high
        )
        logits.grad = None
        loss.backward()
        with torch.no_grad():
            logits -= logits.grad
        clip_high.append(metrics.clip_frac_high)
    return logits.detach(), clip_high


def test_clip_high_bounds_the_second_mini_batch_update():
    # Mini-batch 1: ratio 1, loss -r, d(-r)/dz = -(onehot(0) - p) = -(2/3, -1/3, -1/3);
    #   one SGD step: z = (2/3, -1/3, -1/3), p0 = e / (e + 2) = 0.576117, ratio 1.728352.
    # Mini-batch 2 (old log-probs still from before step 1): ratio 1.728352 > 1 + 0.28, A > 0:
    #   per token -min(r, 1.28) = -1.28, a constant: zero gradient, z stays where it was.
    logits, clip_high = _two_mini_batch_update(eps_high=0.28)
    assert torch.allclose(logits, torch.tensor([2 / 3, -1 / 3, -1 / 3]), atol=1e-6)
    assert clip_high == [0.0, 1.0]
    p0 = torch.softmax(logits, -1)[0].item()
    assert p0 == pytest.approx(math.e / (math.e + 2), abs=1e-6)
    assert p0 / (1 / 3) == pytest.approx(1.728352, abs=1e-5)
    # Without the clip (eps_high 10) the second step pushes on: -r (onehot(0) - p) with
    #   r = 1.728352, p = (0.576117, 0.211942, 0.211942): z0 += 1.728352 x 0.423883 = 0.732618
    free, free_high = _two_mini_batch_update(eps_high=10.0)
    assert free_high == [0.0, 0.0]
    assert free[0].item() == pytest.approx(2 / 3 + 0.732618, abs=1e-5)
