"""Shared-prompt rows: the samples of one prompt trained as one row that holds the prompt once.

GRPO trains G responses to the same prompt, and the plain layout repeats the prompt in each of
their rows. When prompts are long next to responses (the paper's system prompt with its tool block
is ~360 SmolLM2 tokens; an arith response after the cold start is ~100), most of the forward and
backward work is the same prompt recomputed G times. A shared row is

    [prompt | response 1 | response 2 | ... ]        positions 0..P-1, then P.. for each response

with an attention mask that lets each response see the prompt and its own earlier tokens only,
and position ids that restart at P for each response. Every response token then gets exactly the
hidden state it gets in its own row (same attended keys, same positions), so the log-probs and
their gradients are the same as the plain layout's up to float summation order; the first
response token of every sample is predicted by the prompt's last position, which they share.

`pack_rows` cuts a list of samples into rows (samples with equal prompt ids, in order of first
appearance, filled greedily while a row stays within `max_row_tokens`); `collate_shared` builds
the tensors. The mask is a [R, 1, L, L] boolean (True: may attend); `rstar2cli.lm_scoring`
turns it into the model's additive mask. NOTE: a padding position attends to itself, so no
softmax row is empty (an all-masked row gives NaN, which the backward pass would spread).

What it does not do: decide when to share (`train.share_prompt_rows`, used by
`rstar2cli.rl.trainer.plan_update` and the trainer) or pick the attention kernel: the mask needs
an implementation that takes a dense 4D mask (sdpa or eager); FlashAttention does not.
Tested in tests/unit/test_shared_prompt.py (log-probs and gradients equal to the plain layout's
on the tiny model; packing and budgets worked by hand).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rstar2cli.rl.batch import MicroBatch, TrainSample


@dataclass
class SharedRow:
    """Samples with one prompt, laid out in one row; what `plan_update` deals when sharing."""

    samples: list[TrainSample]

    @property
    def num_tokens(self) -> int:
        return len(self.samples[0].prompt_ids) + sum(len(s.response_ids) for s in self.samples)

    @property
    def num_model_tokens(self) -> int:
        return sum(s.num_model_tokens for s in self.samples)


def pack_rows(samples: list[TrainSample], max_row_tokens: int) -> list[SharedRow]:
    """Rows of samples sharing a prompt, each at most `max_row_tokens` long (a sample longer on
    its own gets a row of its own). Order: prompts by first appearance, samples as given."""
    by_prompt: dict[tuple[int, ...], list[TrainSample]] = {}
    for s in samples:
        by_prompt.setdefault(tuple(s.prompt_ids), []).append(s)
    rows: list[SharedRow] = []
    for group in by_prompt.values():
        current: list[TrainSample] = []
        length = len(group[0].prompt_ids)
        for s in group:
            if current and length + len(s.response_ids) > max_row_tokens:
                rows.append(SharedRow(current))
                current, length = [], len(group[0].prompt_ids)
            current.append(s)
            length += len(s.response_ids)
        rows.append(SharedRow(current))
    return rows


def collate_shared(samples: list[TrainSample], pad_id: int, max_row_tokens: int) -> MicroBatch:
    """The micro-batch of `samples` in shared-prompt rows; token order: sample by sample, as
    given, each sample's model tokens in order (`MicroBatch.seqs` names each token's sample)."""
    import torch

    rows = pack_rows(samples, max_row_tokens)
    width = max(r.num_tokens for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [R, L]
    pos = torch.zeros((len(rows), width), dtype=torch.long)  # [R, L]
    allowed = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1)  # [R, L, L]
    causal = torch.ones((width, width), dtype=torch.bool).tril()  # [L, L]
    where: dict[int, tuple[int, int, int]] = {}  # id(sample) -> (row, prompt end, response start)
    for r, row in enumerate(rows):
        prompt = row.samples[0].prompt_ids
        p = len(prompt)
        ids[r, :p] = torch.tensor(prompt)
        pos[r, :p] = torch.arange(p)
        allowed[r, :p, :p] = causal[:p, :p]
        start = p
        for s in row.samples:
            n, end = len(s.response_ids), start + len(s.response_ids)
            ids[r, start:end] = torch.tensor(s.response_ids)
            pos[r, start:end] = torch.arange(p, p + n)
            allowed[r, start:end, :p] = True  # the response sees the whole prompt
            allowed[r, start:end, start:end] = causal[:n, :n]  # and its own past
            where[id(s)] = (r, p, start)
            start = end
    return _targets(samples=samples, where=where, ids=ids, pos=pos, allowed=allowed)


def _targets(
    samples: list[TrainSample],
    where: dict[int, tuple[int, int, int]],
    ids: Any,
    pos: Any,
    allowed: Any,
) -> MicroBatch:
    """Where each model token is predicted: response token j of a sample at its row's position
    start + j - 1, and token 0 at the prompt's last position."""
    import torch

    from rstar2cli.rl.batch import MicroBatch

    rows, cols, targets, seqs, adv, engine_lp, stale = [], [], [], [], [], [], []
    for k, s in enumerate(samples):
        r, p, start = where[id(s)]
        for j, (tok, m) in enumerate(zip(s.response_ids, s.loss_mask, strict=True)):
            if not m:
                continue
            rows.append(r)
            cols.append(p - 1 if j == 0 else start + j - 1)
            targets.append(tok)
            seqs.append(k)
            adv.append(s.advantage)
            lp = s.rollout_logprobs
            engine_lp.append(float("nan") if lp is None else float(lp[j]))
            stale.append(j < s.num_stale_tokens)
    return MicroBatch(
        input_ids=ids,
        attention_mask=allowed[:, None],  # [R, 1, L, L]
        rows=torch.tensor(rows, dtype=torch.long),
        cols=torch.tensor(cols, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        advantages=torch.tensor(adv, dtype=torch.float32),
        rollout_logprobs=torch.tensor(engine_lp, dtype=torch.float32),
        stale=torch.tensor(stale, dtype=torch.bool),
        position_ids=pos,
        seqs=torch.tensor(seqs, dtype=torch.long),
    )
