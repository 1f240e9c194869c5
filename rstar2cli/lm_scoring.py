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

What it does not do: losses (rstar2cli.rl.loss, rstar2cli.sft.packing) or the engine build
(rstar2cli.train_utils). Tested in tests/unit/test_loss.py (chunked == full-logits values and
gradients) and, through the trainers, tests/integration/test_trainer_ranks.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

# NOTE: positions per output-layer chunk: 1024 x 152K (Qwen3) x 4 bytes = 0.6 GB per fp32
# tensor, a few of which live at once while a chunk is (re)computed.
CHUNK_TOKENS = 1024


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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids [B, L]; position (rows[i], cols[i]) predicts targets[i] (all [N]).

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
        head = self.lm.get_output_embeddings()
        return chunked_logprobs(
            hidden=hidden,
            head=head,
            targets=targets,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
        )
