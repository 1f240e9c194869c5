"""The trained model as the trainers run it: a causal LM whose forward pass returns the
log-probability (and entropy) of chosen target tokens, computed in chunks of tokens.

`ScoringLM` wraps a transformers causal LM. Its forward runs the decoder once, picks the hidden
states at the positions that predict a target (model tokens only: no prompt, padding or
tool-response positions), and hands them to `chunked_logprobs`, which applies the output layer
to `CHUNK_TOKENS` positions at a time. Under autograd each chunk is recomputed in the backward
pass, so no [tokens x vocab] fp32 tensor ever exists for a whole micro-batch: at 8K tokens and
Qwen3's 152K vocabulary that tensor alone is 5 GB, and the full-logits path holds several of
them (logits, log-softmax, their gradients). DeepSpeed wraps `ScoringLM` itself, so under ZeRO-3
the decoder and the output layer are both called inside the engine's forward and their
parameters are gathered by its hooks, chunk by chunk, also during the recomputation.

The logits are the model's as its CausalLM wrapper returns them: the output layer's, then the
wrapper's own final processing where the architecture has one (`LOGIT_PROCESSING`: Gemma 2-4's
soft-capping, Cohere's and Granite's scaling, read from transformers' modeling code), then divided
by the sampling temperature (`temperature`, as verl scores a rollout sampled at T: vLLM's
processed log-probs are those of logits / T too). A wrapper that processes its logits in another
way, not in the table, is not detected.

Dropout: the RL trainer sets every dropout probability to 0 (`train_utils.without_dropout`), so
its old-log-prob pass (eval mode) and its training pass (train mode, which gradient checkpointing
needs) compute the same function.

What it does not do: losses (rstar2cli.rl.loss, rstar2cli.sft.packing) or the engine build
(rstar2cli.train_utils). Tested in tests/unit/test_loss.py (chunked == full-logits values and
gradients; the wrapper's logits of tiny Gemma2, Cohere and Granite models; temperature) and,
through the trainers, tests/integration/test_trainer_ranks.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

# NOTE: positions per output-layer chunk: 1024 x 152K (Qwen3) x 4 bytes = 0.6 GB per fp32
# tensor, a few of which live at once while a chunk is (re)computed.
CHUNK_TOKENS = 1024

Logits = Callable[[torch.Tensor], torch.Tensor]


def _softcap(cap: float, logits: torch.Tensor) -> torch.Tensor:
    return torch.tanh(logits / cap) * cap


def _times(factor: float, logits: torch.Tensor) -> torch.Tensor:
    return logits * factor


def _divided(divisor: float, logits: torch.Tensor) -> torch.Tensor:
    return logits / divisor


# What a CausalLM wrapper does to its output layer's logits, by config.model_type prefix:
# (prefixes, the config attribute holding the constant, the operation). The same attribute name
# means different things in different families (Granite divides by logits_scaling, HyperCLOVA X
# multiplies; MPT's logit_scale is an attention setting), hence the families.
LOGIT_PROCESSING: tuple[tuple[tuple[str, ...], str, Callable[[float, torch.Tensor], Any]], ...] = (
    (("gemma2", "gemma3", "gemma4", "vaultgemma", "nanochat"), "final_logit_softcapping", _softcap),
    (("recurrent_gemma",), "logits_soft_cap", _softcap),
    (("cohere",), "logit_scale", _times),
    (("granite",), "logits_scaling", _divided),
    (("hyperclovax",), "logits_scaling", _times),
    (("falcon_h1",), "lm_head_multiplier", _times),
)


def logit_processing(config: Any) -> Logits | None:
    """The wrapper's final processing of the output layer's logits for this model config (None:
    none known)."""
    model_type = str(getattr(config, "model_type", ""))
    for prefixes, attribute, operation in LOGIT_PROCESSING:
        value = getattr(config, attribute, None)
        if model_type.startswith(prefixes) and value is not None:
            return functools.partial(operation, float(value))
    return None


def chunked_logprobs(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of each target (and the entropy of the distribution there).

    hidden: [N, H], the final hidden states at the positions that predict `targets`; head: the
    output layer (hidden -> logits); targets: [N]. Returns (logprobs [N], entropy [N] or None),
    float32. The entropy carries a gradient only with `entropy_grad` (an entropy bonus); else it
    is a metric and costs no memory in the backward pass.
    """
    from torch.utils.checkpoint import checkpoint

    recompute = torch.is_grad_enabled() and hidden.requires_grad
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        part = (hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens])
        if recompute:
            # NOTE: only the chunk's hidden states are saved for backward; the logits are
            # computed again there, one chunk at a time.
            logp, entropy = checkpoint(
                _chunk_stats, head, *part, with_entropy, entropy_grad, use_reentrant=False
            )
        else:
            logp, entropy = _chunk_stats(head, *part, with_entropy, entropy_grad)
        logps.append(logp)
        entropies.append(entropy)
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


def _chunk_stats(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()  # [C, V]
    lse = torch.logsumexp(logits, dim=-1)  # [C]
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse  # [C]
    if not with_entropy:
        return logp, lse.new_zeros(0)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        probs = torch.softmax(logits, dim=-1)  # [C, V]
        entropy = lse - (probs * logits).sum(-1)  # [C]
    return logp, entropy


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, L, L] boolean -> the additive mask attention kernels take: 0 where allowed, the
    dtype's lowest value elsewhere (not -inf: a row with nothing allowed would give NaN)."""
    zeros = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return zeros.masked_fill(~allowed, torch.finfo(dtype).min)


class ScoringLM(nn.Module):
    """A causal LM whose forward returns per-target log-probs (and entropy), chunked."""

    def __init__(self, lm: Any):
        super().__init__()
        self.lm = lm
        self.processing = logit_processing(lm.config)

    def forward(
        self,
        input_ids: torch.Tensor,
        rows: torch.Tensor,
        cols: torch.Tensor,
        targets: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        with_entropy: bool = False,
        entropy_grad: bool = False,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids [B, L]; position (rows[i], cols[i]) predicts targets[i] (all [N]).
        `temperature`: score the distribution of logits / temperature (the rollout's).

        attention_mask: [B, L] (1: a token, 0: padding; causal), or [B, 1, L, L] boolean (True:
        may attend), used as it is (shared-prompt rows, rstar2cli/rl/shared_prompt.py).

        Returns (logprobs [N], entropy [N] or None), see `chunked_logprobs`.
        """
        if attention_mask is not None and attention_mask.dim() == 4:
            attention_mask = additive_mask(attention_mask, self.lm.dtype)
        out = self.lm.get_decoder()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
        hidden = out.last_hidden_state[rows, cols]  # [N, H]
        head = _processed_head(self.lm.get_output_embeddings(), self.processing, temperature)
        return chunked_logprobs(
            hidden=hidden,
            head=head,
            targets=targets,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
        )


def _processed_head(output_layer: Logits, processing: Logits | None, temperature: float) -> Logits:
    """hidden -> the logits the model samples from: the output layer's, the wrapper's processing,
    then / temperature."""
    if processing is None and temperature == 1.0:
        return output_layer
    return functools.partial(
        _apply_head, output_layer=output_layer, processing=processing, temperature=temperature
    )


def _apply_head(
    hidden: torch.Tensor, *, output_layer: Logits, processing: Logits | None, temperature: float
) -> torch.Tensor:
    logits = output_layer(hidden).float()  # [C, V]
    if processing is not None:
        logits = processing(logits)
    return logits if temperature == 1.0 else logits / temperature
