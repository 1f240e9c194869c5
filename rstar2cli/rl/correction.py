"""Correcting the policy update for what the engine actually sampled (recipe section `correction`).

The engine samples with its own kernels and precision (bf16 weights, another sampler), and under
partial rollout with weights one or more updates old, so the tokens come from a behaviour policy
mu that is not the trainer's pi_old. Per model token t of trajectory i (tool-output tokens never
count), with mu_t the engine's probability of the token it drew (the record's
`rollout_logprobs`), pi_old_t the trainer's before the update and pi_t under the weights trained:

    rho_t = pi_old_t / mu_t                       importance ratio, behaviour -> trainer

Decoupled mode (`bypass: false`, the default): the PPO ratio stays r_t = pi_t / pi_old_t,
clipped as in loss.py, and each token's clip term is multiplied by a constant (no gradient)

    c_t = w_t * m_t * M_i * s_t
    w_t = min(rho_t, token_is_cap)                token-level truncated IS (TIS); 1 when unset
    m_t = 1[token_mask_low <= rho_t <= token_mask_high]      token mask; 1 when unset
    g_i = exp(mean over i's tokens of log rho_t)  geometric mean of the sequence's ratios
    M_i = 1[seq_mask_low <= g_i <= seq_mask_high]            sequence mask; 1 when unset
    s_t = 0 if the token was sampled under an older policy version than the trainer's
          (partial rollout, the first `stale_tokens` of the response) and mask_stale, else 1

Bypass mode (`bypass: true`): pi_old := mu, so r_t = pi_t / mu_t and the clip bounds the ratio
against the engine itself; the trainer's old-log-prob pass is skipped. w_t is then 1 (the PPO
ratio already is the importance ratio: a TIS weight would count it twice, so the recipe refuses
token_is_cap with bypass), and the masks read rho_t = pi_t / mu_t with pi_t detached: on the
first mini-batch of a step that is exactly pi_old_t (no optimizer step yet), on later ones it
includes the step's own updates.

The loss stays loss.py's token mean over all model tokens of the mini-batch: a masked token adds
0 to the sum but still counts in the denominator (the masks shrink the step, they do not
re-weight the tokens left). The KL and entropy terms are not weighted.

Metrics (every step, whatever the setting; tokens without an engine log-prob are left out):
    mismatch_kl   mean of rho_t - 1 - log rho_t over the tokens sampled under the trainer's
                  policy version: the k3 estimate of KL(mu || pi_old) from the engine's samples
                  (>= 0; 0 when engine and trainer agree). In bypass mode it is taken on the
                  first mini-batch only, from the training pass's log-probs, which there equal
                  pi_old's (no trainer pass computes pi_old for the others).
    stale_kl      the same over the stale tokens (partial rollout): the engine's mismatch plus
                  the policy's lag, what mask_stale or the ratio correction has to absorb
    is_ratio_mean, is_ratio_max    of rho_t, before truncation
    truncated_token_share          tokens with rho_t > token_is_cap
    masked_token_share             tokens with m_t * M_i * s_t = 0
    masked_sequence_share          sequences with M_i = 0
The trainer scores at the rollout's temperature (logits / T) without top-p, so rho_t compares
like with like only when the rollout samples at top_p 1.0 (the recipe refuses a correction
otherwise). With bypass and A < 0 the ratio pi / mu has no upper bound: `train.clip_ratio_c`
(dual clip, rl/loss.py) bounds each such token's term.

Does not: compute log-probs, run models or decide defaults (train_recipe.CorrectionConfig).
Tested in tests/unit/test_correction.py (3-4-token examples and a Monte-Carlo check of the
corrected policy gradient on a categorical policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rstar2cli.rl.train_recipe import CorrectionConfig

METRIC_KEYS = (
    "mismatch_kl",
    "stale_kl",
    "is_ratio_mean",
    "is_ratio_max",
    "truncated_token_share",
    "masked_token_share",
    "masked_sequence_share",
)


@dataclass
class CorrectionSums:
    """Additive per-rank sums behind the correction metrics (the driver adds ranks)."""

    num_tokens: int = 0  # model tokens the weights were computed for
    num_compared: int = 0  # of those, with an engine log-prob, in the mismatch metrics
    kl: float = 0.0  # over the compared tokens of the trainer's version
    num_fresh_compared: int = 0
    stale_kl: float = 0.0  # over the compared stale tokens
    ratio: float = 0.0
    ratio_max: float = 0.0
    num_truncated: int = 0
    num_masked_tokens: int = 0
    num_sequences: int = 0
    num_masked_sequences: int = 0

    def add(self, other: CorrectionSums) -> None:
        for name in self.__dataclass_fields__:
            if name == "ratio_max":
                self.ratio_max = max(self.ratio_max, other.ratio_max)
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))

    def metrics(self) -> dict[str, float]:
        compared, tokens = max(self.num_compared, 1), max(self.num_tokens, 1)
        return {
            "mismatch_kl": self.kl / max(self.num_fresh_compared, 1),
            "stale_kl": self.stale_kl / max(self.num_compared - self.num_fresh_compared, 1),
            "is_ratio_mean": self.ratio / compared if self.num_compared else 1.0,
            "is_ratio_max": self.ratio_max if self.num_compared else 1.0,
            "truncated_token_share": self.num_truncated / tokens,
            "masked_token_share": self.num_masked_tokens / tokens,
            "masked_sequence_share": self.num_masked_sequences / max(self.num_sequences, 1),
        }


def token_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    rows: torch.Tensor,
    stale: torch.Tensor,
    cfg: CorrectionConfig,
    num_sequences: int,
    compare: bool = True,
) -> tuple[torch.Tensor, CorrectionSums]:
    """The constant c_t of every model token, and this call's metric sums.

    old_logprobs: [N] pi_old (bypass: the current log-probs); rollout_logprobs: [N] mu, NaN where
    the engine gave none (such a token gets weight 1 and is left out of every mask but the stale
    one); rows: [N] each token's sequence, 0..num_sequences-1; stale: [N] bool. `compare`:
    whether this call's tokens count in the mismatch metrics.
    """
    with torch.no_grad():
        known = ~torch.isnan(rollout_logprobs)  # [N]
        log_rho = torch.where(known, old_logprobs.float() - rollout_logprobs, 0.0)  # [N]
        rho = torch.exp(log_rho)  # [N], 1 where unknown
        weights = torch.ones_like(rho)  # [N]
        if cfg.token_is_cap is not None and not cfg.bypass:
            weights = torch.clamp(rho, max=cfg.token_is_cap)
        keep = _token_keep(rho, known, cfg) & ~(stale & cfg.mask_stale)  # [N]
        seq_keep = _sequence_keep(
            log_rho=log_rho, known=known, rows=rows, num_sequences=num_sequences, cfg=cfg
        )  # [S]
        keep = keep & seq_keep[rows]
        sums = CorrectionSums(
            num_tokens=int(rho.numel()),
            num_masked_tokens=int((~keep).sum()),
            num_sequences=num_sequences,
            num_masked_sequences=int((~seq_keep).sum()),
        )
        if cfg.token_is_cap is not None and not cfg.bypass:
            sums.num_truncated = int((rho > cfg.token_is_cap).sum())
        if compare and bool(known.any()):
            _add_mismatch(sums, rho[known], log_rho[known], stale[known])
        return weights * keep, sums


def _token_keep(rho: torch.Tensor, known: torch.Tensor, cfg: Any) -> torch.Tensor:
    keep = torch.ones_like(rho, dtype=torch.bool)  # [N]
    if cfg.token_mask_low is not None:
        keep &= ~known | (rho >= cfg.token_mask_low)
    if cfg.token_mask_high is not None:
        keep &= ~known | (rho <= cfg.token_mask_high)
    return keep


def _sequence_keep(
    log_rho: torch.Tensor, known: torch.Tensor, rows: torch.Tensor, num_sequences: int, cfg: Any
) -> torch.Tensor:
    """M_i per sequence ([S] bool): its geometric-mean ratio inside the bounds."""
    keep = torch.ones(num_sequences, dtype=torch.bool, device=log_rho.device)  # [S]
    if cfg.seq_mask_low is None and cfg.seq_mask_high is None:
        return keep
    total = torch.zeros(num_sequences, device=log_rho.device).index_add(0, rows, log_rho)  # [S]
    count = torch.zeros(num_sequences, device=log_rho.device).index_add(0, rows, known.float())
    geo = torch.exp(total / count.clamp(min=1.0))  # [S], 1 for a sequence with nothing known
    if cfg.seq_mask_low is not None:
        keep &= geo >= cfg.seq_mask_low
    if cfg.seq_mask_high is not None:
        keep &= geo <= cfg.seq_mask_high
    return keep


def _add_mismatch(
    sums: CorrectionSums, rho: torch.Tensor, log_rho: torch.Tensor, stale: torch.Tensor
) -> None:
    # NOTE: float64 and expm1: rho - 1 - log rho for rho near 1 in float32 cancels to rounding
    # noise, negative as often as not (a float32 engine and trainer agree to ~1e-9)
    log_rho = log_rho.double()  # [M]
    k3 = torch.expm1(log_rho) - log_rho  # [M], k3 of KL(mu || pi_old) per token
    sums.num_compared = int(rho.numel())
    sums.num_fresh_compared = int((~stale).sum())
    sums.kl = float(k3[~stale].sum())
    sums.stale_kl = float(k3[stale].sum())
    sums.ratio = float(rho.double().sum())
    sums.ratio_max = float(rho.max())
