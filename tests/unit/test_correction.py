"""Importance-sampling correction (rstar2cli/rl/correction.py): weights, masks and metrics on
3-4-token examples worked out by hand, the weights inside the PPO loss, and a Monte-Carlo check
that the corrected policy gradient from an engine's (perturbed) samples is the on-policy one."""

from __future__ import annotations

import math

import pytest
import torch

from rstar2cli.rl.correction import CorrectionSums, token_weights
from rstar2cli.rl.loss import ppo_clip_loss
from rstar2cli.rl.train_recipe import CorrectionConfig

# One sequence of 4 model tokens. pi_old = [0.5, 0.2, 0.9, 0.3], mu = [0.4, 0.4, 0.3, 0.3]
# rho = pi_old / mu = [1.25, 0.5, 3.0, 1.0]
OLD = torch.log(torch.tensor([0.5, 0.2, 0.9, 0.3]))
MU = torch.log(torch.tensor([0.4, 0.4, 0.3, 0.3]))
ONE_SEQ = torch.zeros(4, dtype=torch.long)
FRESH = torch.zeros(4, dtype=torch.bool)


def _weights(cfg: CorrectionConfig, **kw) -> tuple[torch.Tensor, CorrectionSums]:
    """token_weights on the 4-token example; keywords replace its parts."""
    args = {"old_logprobs": OLD, "rollout_logprobs": MU, "rows": ONE_SEQ, "stale": FRESH}
    args |= {"num_sequences": 1, "cfg": cfg}
    renamed = {"old": "old_logprobs", "mu": "rollout_logprobs"}
    return token_weights(**(args | {renamed.get(k, k): v for k, v in kw.items()}))


def test_token_tis_truncates_at_the_cap_and_reports_the_mismatch():
    # cap 2: w = min(rho, 2) = [1.25, 0.5, 2.0, 1.0]; one token of 4 truncated (rho 3.0)
    # k3 per token: rho - 1 - log rho
    #   1.25: 0.25 - 0.223144 = 0.026856; 0.5: -0.5 + 0.693147 = 0.193147
    #   3.0: 2.0 - 1.098612 = 0.901388;   1.0: 0
    # mismatch_kl = 1.121391 / 4 = 0.280348; ratio mean 5.75 / 4 = 1.4375, max 3.0
    w, sums = _weights(CorrectionConfig(token_is_cap=2.0))
    assert torch.allclose(w, torch.tensor([1.25, 0.5, 2.0, 1.0]), atol=1e-6)
    m = sums.metrics()
    assert m["mismatch_kl"] == pytest.approx(0.280348, abs=1e-5)
    assert m["is_ratio_mean"] == pytest.approx(1.4375, abs=1e-6)
    assert m["is_ratio_max"] == pytest.approx(3.0, abs=1e-6)
    assert m["truncated_token_share"] == 0.25
    assert m["masked_token_share"] == m["masked_sequence_share"] == 0.0


def test_no_correction_weighs_every_token_one_and_still_measures():
    w, sums = _weights(CorrectionConfig(token_is_cap=None))
    assert torch.equal(w, torch.ones(4))
    assert sums.metrics()["mismatch_kl"] == pytest.approx(0.280348, abs=1e-5)
    assert sums.metrics()["truncated_token_share"] == 0.0


def test_token_mask_drops_tokens_outside_the_bounds():
    # bounds [0.8, 2.0]: rho [1.25, 0.5, 3.0, 1.0] -> keep [1, 0, 0, 1]
    w, sums = _weights(CorrectionConfig(token_is_cap=None, token_mask_low=0.8, token_mask_high=2.0))
    assert torch.equal(w, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert sums.metrics()["masked_token_share"] == 0.5


def test_geometric_sequence_mask_drops_a_whole_trajectory():
    # two sequences of 2 tokens: rho [1.25, 0.8 | 2.0, 1.0]
    #   sequence 0: exp((log 1.25 + log 0.8) / 2) = exp(0) = 1.0 -> kept in [0.9, 1.1]
    #   sequence 1: exp((log 2 + 0) / 2) = sqrt(2) = 1.414 -> dropped
    # with the TIS cap 2 as well: w = [1.25, 0.8, 0, 0]
    old = torch.log(torch.tensor([0.5, 0.4, 0.6, 0.3]))
    mu = torch.log(torch.tensor([0.4, 0.5, 0.3, 0.3]))
    cfg = CorrectionConfig(token_is_cap=2.0, seq_mask_low=0.9, seq_mask_high=1.1)
    rows = torch.tensor([0, 0, 1, 1])
    w, sums = _weights(cfg, old=old, mu=mu, rows=rows, num_sequences=2)
    assert torch.allclose(w, torch.tensor([1.25, 0.8, 0.0, 0.0]), atol=1e-6)
    m = sums.metrics()
    assert m["masked_sequence_share"] == 0.5 and m["masked_token_share"] == 0.5


def test_stale_tokens_are_masked_only_when_asked():
    # engine and trainer agree (rho 1); the first two tokens came from an older policy version
    stale = torch.tensor([True, True, False, False])
    w, _ = _weights(CorrectionConfig(token_is_cap=2.0, mask_stale=True), mu=OLD, stale=stale)
    assert torch.equal(w, torch.tensor([0.0, 0.0, 1.0, 1.0]))
    w, sums = _weights(CorrectionConfig(token_is_cap=2.0), mu=OLD, stale=stale)
    assert torch.equal(w, torch.ones(4)) and sums.metrics()["mismatch_kl"] == 0.0


def test_stale_tokens_are_measured_apart_from_the_engines_own_mismatch():
    # k3 of the 4-token example per token: [0.026856, 0.193147, 0.901388, 0]; tokens 0 and 2
    # stale: stale_kl = (0.026856 + 0.901388) / 2, mismatch_kl = (0.193147 + 0) / 2
    stale = torch.tensor([True, False, True, False])
    _, sums = _weights(CorrectionConfig(token_is_cap=None), stale=stale)
    m = sums.metrics()
    assert m["stale_kl"] == pytest.approx(0.464122, abs=1e-5)
    assert m["mismatch_kl"] == pytest.approx(0.096574, abs=1e-5)
    assert m["is_ratio_mean"] == pytest.approx(1.4375, abs=1e-6)  # the ratios read every token
    assert _weights(CorrectionConfig(token_is_cap=None))[1].metrics()["stale_kl"] == 0.0


def test_tokens_without_an_engine_logprob_get_no_correction_and_no_metrics():
    # token 2 (rho 3.0) has no engine log-prob: weight 1 even under the token mask, and the
    # metrics read the other three: rho [1.25, 0.5, 1.0], mean 2.75 / 3, max 1.25
    mu = MU.clone()
    mu[2] = float("nan")
    cfg = CorrectionConfig(token_is_cap=None, token_mask_low=0.8, token_mask_high=2.0)
    w, sums = _weights(cfg, mu=mu)
    assert torch.equal(w, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    m = sums.metrics()
    assert sums.num_compared == 3
    assert m["is_ratio_mean"] == pytest.approx(2.75 / 3) and m["is_ratio_max"] == 1.25


def test_bypass_never_truncates_and_compare_false_leaves_the_metrics_out():
    # bypass: the PPO ratio already is pi / mu, so no TIS weight even if one were set
    cfg = CorrectionConfig.model_construct(**{**CorrectionConfig().model_dump(), "bypass": True})
    w, sums = _weights(cfg, compare=False)
    assert torch.equal(w, torch.ones(4))
    assert sums.num_compared == 0 and sums.num_truncated == 0 and sums.num_tokens == 4


def test_mismatch_kl_is_never_negative_for_ratios_next_to_one():
    # float32 log-probs ~1e-6 apart: rho - 1 - log rho ~ 1e-12 >= 0; in float32 arithmetic
    # these four gave -7.5e-9 (rounding noise, either sign)
    old = torch.tensor([-2.2489724, -1.8139520, -0.3298740, -0.6362708])
    mu = old + torch.tensor([1.9073486e-06, 1.3113022e-06, -8.6426735e-07, -4.7683716e-07])
    _, sums = _weights(CorrectionConfig(token_is_cap=None), old=old, mu=mu)
    assert 0.0 <= sums.metrics()["mismatch_kl"] < 1e-11


def test_sums_add_over_ranks():
    _, a = _weights(CorrectionConfig(token_is_cap=2.0))  # rho max 3.0, 1 truncated
    _, b = _weights(CorrectionConfig(token_is_cap=2.0), mu=OLD)  # rho all 1
    a.add(b)
    m = a.metrics()
    assert a.num_tokens == 8 and m["truncated_token_share"] == 1 / 8
    assert m["is_ratio_max"] == pytest.approx(3.0) and m["mismatch_kl"] == pytest.approx(
        1.121391 / 8, abs=1e-5
    )


def test_weights_scale_the_clip_terms_of_the_loss():
    # A = +1, logp = old (ratio 1): per-token clip term -1, weighted [1.25, 0.5, 2.0, 1.0]
    # loss = -(1.25 + 0.5 + 2.0 + 1.0) / 4 = -1.1875; d loss / d logp_t = -w_t / 4
    logp = torch.zeros(1, 4, requires_grad=True)
    weights = torch.tensor([[1.25, 0.5, 2.0, 1.0]])
    loss, _ = ppo_clip_loss(
        logp, torch.zeros(1, 4), torch.tensor([1.0]), torch.ones(1, 4), token_weights=weights
    )
    assert loss.item() == pytest.approx(-1.1875)
    loss.backward()
    assert torch.allclose(logp.grad, -weights / 4)


# -- Monte-Carlo: a categorical policy over 4 tokens, one token per "trajectory" ----------------

THETA = torch.tensor([0.5, -0.2, 0.1, 0.8])  # the trainer's logits
ADVANTAGE = torch.tensor([1.0, -0.5, 0.3, -1.0])  # per token
NUM_SAMPLES = 200_000
# NOTE: the estimates' sampling noise is about 1e-3 per component at 200k samples; the
# uncorrected estimates are off by 0.06-0.08 (large perturbation) and 0.02-0.03 (small one).
TOLERANCE = 5e-3


def _exact_gradient() -> torch.Tensor:
    """d/d theta of E_{x ~ pi}[A(x)]: what an on-policy estimate converges to."""
    theta = THETA.clone().requires_grad_()
    (torch.softmax(theta, 0) * ADVANTAGE).sum().backward()
    assert theta.grad is not None
    return theta.grad


def _estimate(perturbation: torch.Tensor, cfg: CorrectionConfig | None) -> torch.Tensor:
    """Minus the loss gradient from NUM_SAMPLES tokens drawn from mu = softmax(THETA +
    perturbation), pi_old = pi (decoupled) or mu (bypass); cfg None: no weights at all."""
    gen = torch.Generator().manual_seed(0)
    mu_logp = torch.log_softmax(THETA + perturbation, 0)  # [4]
    tokens = torch.multinomial(mu_logp.exp(), NUM_SAMPLES, replacement=True, generator=gen)  # [N]
    theta = THETA.clone().requires_grad_()
    logp = torch.log_softmax(theta, 0)[tokens]  # [N]
    engine_lp = mu_logp[tokens]  # [N]
    bypass = cfg is not None and cfg.bypass
    old = engine_lp if bypass else logp.detach()  # [N]
    weights = None
    if cfg is not None:
        weights, _ = token_weights(
            old_logprobs=logp.detach(),
            rollout_logprobs=engine_lp,
            rows=torch.arange(NUM_SAMPLES),
            stale=torch.zeros(NUM_SAMPLES, dtype=torch.bool),
            cfg=cfg,
            num_sequences=NUM_SAMPLES,
        )
        weights = weights[None]
    loss, _ = ppo_clip_loss(
        logp[None],
        old[None],
        ADVANTAGE[tokens][None],
        torch.ones(1, NUM_SAMPLES),
        token_weights=weights,
    )
    loss.backward()
    assert theta.grad is not None
    return -theta.grad


def test_monte_carlo_token_tis_recovers_the_on_policy_gradient():
    # mu differs from pi by rho = pi / mu = [0.62, 1.38, 1.02, 1.52]: all under the cap 2, so
    # min(rho, 2) = rho and E_mu[rho A grad log pi] = E_pi[A grad log pi] exactly.
    exact = _exact_gradient()
    perturbation = torch.tensor([0.5, -0.3, 0.0, -0.4])
    on_policy = _estimate(torch.zeros(4), None)
    corrected = _estimate(perturbation, CorrectionConfig(token_is_cap=2.0))
    uncorrected = _estimate(perturbation, None)
    assert (on_policy - exact).abs().max() < TOLERANCE
    assert (corrected - exact).abs().max() < TOLERANCE
    assert (uncorrected - exact).abs().max() > 10 * TOLERANCE


def test_monte_carlo_bypass_recovers_the_on_policy_gradient_inside_the_clip():
    # bypass: the PPO ratio pi / mu = [0.82, 1.12, 1.00, 1.15] stays inside [0.8, 1.28], where
    # the clip term's gradient is ratio * A * grad log pi: unbiased as well.
    exact = _exact_gradient()
    perturbation = torch.tensor([0.2, -0.1, 0.0, -0.15])
    ratios = torch.exp(torch.log_softmax(THETA, 0) - torch.log_softmax(THETA + perturbation, 0))
    assert bool(((ratios > 0.8) & (ratios < 1.28)).all())
    bypass = CorrectionConfig(token_is_cap=None, bypass=True)
    assert (_estimate(perturbation, bypass) - exact).abs().max() < TOLERANCE
    assert (_estimate(perturbation, None) - exact).abs().max() > 4 * TOLERANCE


def test_recipe_section_checks():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="token_is_cap to null with bypass"):
        CorrectionConfig(bypass=True)
    with pytest.raises(ValidationError, match="seq_mask_low"):
        CorrectionConfig(seq_mask_low=1.01, seq_mask_high=0.99)
    with pytest.raises(ValidationError, match="extra"):
        CorrectionConfig(tis_cap=2.0)  # type: ignore[call-arg]
    assert CorrectionConfig().token_is_cap == 2.0 and not CorrectionConfig().bypass
    assert not CorrectionConfig(token_is_cap=None, mask_stale=True).reads_ratios
    assert math.isfinite(CorrectionSums().metrics()["mismatch_kl"])
