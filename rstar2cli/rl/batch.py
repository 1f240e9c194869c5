"""What one RL update is made of: a kept trajectory ready for the loss (`TrainSample`), and the
padded tensors of one micro-batch (`MicroBatch`, built by `collate`, one sample per row; the
shared-prompt rows of rstar2cli/rl/shared_prompt.py fill the same type).

What it does not do: decide which samples go together (rstar2cli.rl.trainer.plan_update) or run a
forward. Tested in tests/unit/test_rl_batching.py and tests/unit/test_shared_prompt.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class TrainSample:
    """One kept trajectory, ready for the update."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]  # per response token: 1 model token, 0 tool-response token
    advantage: float
    # per response token, the engine's log-prob of it (None: unknown, no correction)
    rollout_logprobs: list[float] | None = None
    num_stale_tokens: int = 0  # the first ones of the response, sampled by an older policy

    @property
    def num_model_tokens(self) -> int:
        return int(sum(self.loss_mask))

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class MicroBatch:
    """Right-padded rows and the model tokens the loss looks at.

    Position (rows[i], cols[i]) of input_ids predicts targets[i]; only model tokens (loss mask 1)
    are listed, so prompts, padding and tool responses cost no output-layer work.
    """

    input_ids: Any  # [B, L] long
    attention_mask: Any  # [B, L] long
    rows: Any  # [N] long
    cols: Any  # [N] long
    targets: Any  # [N] long
    advantages: Any  # [N] float32, the trajectory's advantage on each of its tokens
    rollout_logprobs: Any = None  # [N] float32, the engine's log-probs; NaN where unknown
    stale: Any = None  # [N] bool, sampled under an older policy version
    # shared-prompt rows (rstar2cli/rl/shared_prompt.py): [B, L] positions, and each token's
    # sample [N]; None: one sample per row, the row is the sample
    position_ids: Any = None
    seqs: Any = None

    @property
    def sequence_ids(self) -> Any:
        """[N] each token's sample, 0..num_samples-1."""
        return self.rows if self.seqs is None else self.seqs


def collate(samples: list[TrainSample], pad_id: int) -> MicroBatch:
    import torch

    seqs = [s.prompt_ids + s.response_ids for s in samples]
    width = max(len(r) for r in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # [B, L]
    attn = torch.zeros((len(seqs), width), dtype=torch.long)  # [B, L]
    mask = torch.zeros((len(seqs), width - 1), dtype=torch.bool)  # [B, L-1], over predictions
    engine_lp = torch.full((len(seqs), width - 1), float("nan"))  # [B, L-1]
    stale = torch.zeros((len(seqs), width - 1), dtype=torch.bool)  # [B, L-1]
    for i, (seq, s) in enumerate(zip(seqs, samples, strict=True)):
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        first = len(s.prompt_ids) - 1  # the position predicting the first response token
        end = first + len(s.response_ids)
        mask[i, first:end] = torch.tensor(s.loss_mask, dtype=torch.bool)
        if s.rollout_logprobs is not None:
            engine_lp[i, first:end] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
        stale[i, first : first + s.num_stale_tokens] = True
    rows, cols = mask.nonzero(as_tuple=True)  # [N], [N]
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)  # [B]
    return MicroBatch(
        input_ids=ids,
        attention_mask=attn,
        rows=rows,
        cols=cols,
        targets=ids[rows, cols + 1],
        advantages=adv[rows],
        rollout_logprobs=engine_lp[rows, cols],
        stale=stale[rows, cols],
    )


# plan[mini][micro] -> trajectories, for one rank
RankPlan = list[list[list[TrainSample]]]
