"""Token-level PPO clip loss for GRPO-RoC, plus the per-token quantities it is fed with.

loss = sum over model tokens of -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
       / number of model tokens in the batch
with ratio = exp(logp - old_logp). The clip is asymmetric (eps_low 0.2, eps_high 0.28: the
paper's "clip higher", which leaves more room to raise low-probability tokens).

Dual clip (`clip_ratio_c`, off in the paper recipes; verl's default is 3): with A < 0 the term
above grows without bound as the ratio grows (the clip only bounds it from below), so a token the
update made far likelier than pi_old (or than the engine's mu, in bypass mode) could dominate the
batch. With it, such a token's term is at most clip_ratio_c x |A|, and past that ratio it carries
no gradient. The average runs
over all model tokens of the batch (tool-response tokens have mask 0), not per sequence first, so
long trajectories weigh in proportion to their tokens.

`token_weights` (constants, [B, T]) multiply each token's clip term: the importance-sampling
weights and masks of rstar2cli/rl/correction.py; the denominator stays the model-token count.

Optional, off by default as in the paper: a KL penalty to a reference policy (k3 estimator,
exp(ref - logp) - (ref - logp) - 1, unbiased and >= 0) and an entropy bonus.

Micro-batches: pass `num_batch_tokens` (the masked-token count of the whole batch, over all
micro-batches and ranks) so that summing the micro-batch losses gives the batch average; when the
data-parallel engine also averages gradients over W ranks, pass the global count and multiply the
loss by W for the exact token mean of the global batch (the per-rank count would give a mean of
per-rank means instead; DeepSpeed's engine.backward also divides by the accumulation steps, to be
undone the same way). Without it the call's own token count is used.

`token_logprobs` and `token_entropy` work on full logits; the trainers use the chunked versions
in `rstar2cli.lm_scoring`, which are tested against these.

Does not: compute advantages, run models or step optimizers. Pure torch.
Tested in tests/unit/test_loss.py with 3-4 element tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EPS_LOW = 0.2
EPS_HIGH = 0.28


@dataclass(frozen=True)
class LossMetrics:
    """Detached per-call metrics, averaged over the masked tokens of this call."""

    num_tokens: int
    clip_frac_low: float  # A < 0 and ratio < 1 - eps_low: the clipped branch is active
    clip_frac_high: float  # A > 0 and ratio > 1 + eps_high
    approx_kl: float  # k3 estimate of KL(old || new) on the sampled tokens
    policy_loss: float  # the clip term alone, on the same normalisation as the loss
    kl_ref: float | None = None  # k3 estimate of KL(new || ref), when ref_logprobs is given
    entropy: float | None = None  # mean token entropy, when entropy is given


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of values where mask is 1; where() keeps NaN/inf at masked-out places out of the sum."""
    return torch.where(mask, values, torch.zeros_like(values)).sum()


def k3_kl(logprobs: torch.Tensor, other_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || other) from samples of pi: e^d - d - 1, d = other - logp."""
    delta = other_logprobs - logprobs  # [B, T]
    return torch.exp(delta) - delta - 1.0  # [B, T], >= 0


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    eps_low: float = EPS_LOW,
    eps_high: float = EPS_HIGH,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    num_batch_tokens: int | None = None,
    token_weights: torch.Tensor | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """Returns (scalar loss with grad through `logprobs` (and `entropy`), metrics).

    logprobs, old_logprobs, loss_mask (and ref_logprobs, entropy): [B, T];
    advantages: [B] (one per trajectory, broadcast to its tokens) or [B, T].
    """
    if kl_coef != 0.0 and ref_logprobs is None:
        raise ValueError("kl_coef is set but ref_logprobs is None")
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef is set but entropy is None")
    mask = loss_mask.bool()  # [B, T]
    per_token, ratio, log_ratio, advantages = _clip_terms(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        eps_low=eps_low,
        eps_high=eps_high,
        token_weights=token_weights,
        clip_ratio_c=clip_ratio_c,
    )
    num_tokens = int(mask.sum().item())
    denom = float(num_batch_tokens if num_batch_tokens is not None else max(num_tokens, 1))
    policy_loss = masked_sum(per_token, mask) / denom
    loss = policy_loss
    kl_ref_tokens = None
    if ref_logprobs is not None:
        kl_ref_tokens = k3_kl(logprobs, ref_logprobs)  # [B, T]
        loss = loss + kl_coef * masked_sum(kl_ref_tokens, mask) / denom
    if entropy is not None and entropy_coef != 0.0:
        loss = loss - entropy_coef * masked_sum(entropy, mask) / denom

    metrics = _metrics(
        mask=mask,
        ratio=ratio,
        log_ratio=log_ratio,
        advantages=advantages,
        eps_low=eps_low,
        eps_high=eps_high,
        num_tokens=num_tokens,
    )
    return loss, LossMetrics(
        num_tokens=num_tokens,
        policy_loss=float(policy_loss.detach()),
        kl_ref=None if kl_ref_tokens is None else _masked_mean(kl_ref_tokens, mask),
        entropy=None if entropy is None else _masked_mean(entropy, mask),
        **metrics,
    )


def _clip_terms(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    token_weights: torch.Tensor | None,
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped terms -min(r A, clip(r) A), at most -clip_ratio_c A where A < 0 (dual
    clip), times `token_weights`; the ratio r, its log and the advantages A broadcast to [B, T]."""
    if advantages.dim() == 1:
        advantages = advantages[:, None]  # [B, 1], broadcast over tokens
    advantages = advantages.expand_as(logprobs)  # [B, T]
    # NOTE: the log-ratio is zeroed outside the mask before exp(), so padding with garbage
    # log-probs cannot produce inf * 0 = NaN in the gradient.
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    unclipped = ratio * advantages  # [B, T]
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages  # [B, T]
    per_token = -torch.minimum(unclipped, clipped)  # [B, T]
    if clip_ratio_c is not None:  # dual clip: A < 0 and r > clip_ratio_c -> constant, no gradient
        capped = torch.minimum(per_token, -clip_ratio_c * advantages)  # [B, T]
        per_token = torch.where(advantages < 0, capped, per_token)  # [B, T]
    if token_weights is not None:
        per_token = per_token * token_weights.detach()  # [B, T]
    return per_token, ratio, log_ratio, advantages


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(masked_sum(values.detach().float(), mask)) / max(int(mask.sum()), 1)


def _metrics(
    mask: torch.Tensor,
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    num_tokens: int,
) -> dict[str, float]:
    with torch.no_grad():
        low = (advantages < 0) & (ratio < 1.0 - eps_low)  # [B, T]
        high = (advantages > 0) & (ratio > 1.0 + eps_high)  # [B, T]
        # k3 estimate of KL(old || new) from tokens sampled by old: (ratio - 1) - log(ratio)
        approx_kl = ratio - 1.0 - log_ratio  # [B, T]
        return {
            "clip_frac_low": _masked_mean(low.float(), mask),
            "clip_frac_high": _masked_mean(high.float(), mask),
            "approx_kl": _masked_mean(approx_kl, mask),
        }


def token_logprobs(logits: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each target token. logits: [B, T, V] (already aligned so position t
    predicts target_ids[:, t]); target_ids: [B, T]. Returns [B, T] float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [B, T, V]
    return logp.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)  # [B, T]


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at each position. logits: [B, T, V] -> [B, T]."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [B, T, V]
    return -(logp.exp() * logp).sum(-1)  # [B, T]
