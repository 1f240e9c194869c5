"""Sequence packing and the token-summed SFT loss.

`collate` puts a micro-batch of examples into rows of at most `max_seq_len` tokens (first fit, in
order). Position ids restart at 0 for every example; with no attention mask, transformers (>= 5)
derives a block-diagonal causal mask from those restarts for every attention backend (sdpa,
eager, flash varlen), so no token attends across examples. Padding at the end of a row is its own
block and has no targets. `packing=False` gives one example per row, which is the reference the
packed loss is tested against.

`forward_loss_sum` sums the cross-entropy over target tokens (the chunked log-probs of
`rstar2cli.lm_scoring.ScoringLM`, computed at target positions only); the trainer divides by the
number of targets in the whole global batch, so the loss does not depend on how examples were
packed or split into micro-batches. Tested in tests/unit/test_sft_data.py (packed loss ==
unpacked loss on the tiny model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IGNORE = -100


@dataclass
class Batch:
    input_ids: Any  # [R, L] long
    position_ids: Any  # [R, L] long, restarting at 0 per example
    labels: Any  # [R, L] long, IGNORE where not a target
    num_targets: int
    num_tokens: int  # real (non-padding) tokens


def first_fit(lengths: list[int], max_len: int) -> list[list[int]]:
    """Indices of examples per row; each row's lengths sum to <= max_len."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(lengths):
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(max_len - n)
    return rows


def collate(examples: list[Any], max_seq_len: int, pad_id: int, packing: bool = True) -> Batch:
    import torch

    lengths = [len(e.input_ids) for e in examples]
    rows = first_fit(lengths, max_seq_len) if packing else [[i] for i in range(len(examples))]
    width = max(sum(lengths[i] for i in row) for row in rows)
    ids, pos, labels = [], [], []
    for row in rows:
        r_ids, r_pos, r_lab = [], [], []
        for i in row:
            e = examples[i]
            r_ids += e.input_ids
            r_pos += list(range(len(e.input_ids)))
            lab = [t if m else IGNORE for t, m in zip(e.input_ids, e.loss_mask, strict=True)]
            lab[0] = IGNORE  # NOTE: never predict an example's first token from the previous one
            r_lab += lab
        num_pad = width - len(r_ids)
        ids.append(r_ids + [pad_id] * num_pad)
        pos.append(r_pos + list(range(num_pad)))
        labels.append(r_lab + [IGNORE] * num_pad)
    return Batch(
        input_ids=torch.tensor(ids, dtype=torch.long),
        position_ids=torch.tensor(pos, dtype=torch.long),
        labels=torch.tensor(labels, dtype=torch.long),
        num_targets=sum(sum(e.loss_mask[1:]) for e in examples),
        num_tokens=sum(lengths),
    )


def forward_loss_sum(model: Any, batch: Batch) -> Any:
    """Sum of next-token cross-entropy over the target tokens of a packed batch.

    `model` is a `rstar2cli.lm_scoring.ScoringLM` (or the DeepSpeed engine around one): the
    log-probs come only at target positions, in chunks. No attention mask: example boundaries
    come from the position ids.
    """
    import torch

    is_target = batch.labels[:, 1:] != IGNORE  # [R, L-1]: position t predicts token t + 1
    rows, cols = is_target.nonzero(as_tuple=True)  # [N], [N]
    targets = batch.labels[:, 1:][rows, cols]  # [N]
    logprobs, _ = model(
        input_ids=batch.input_ids,
        rows=rows,
        cols=cols,
        targets=targets,
        position_ids=batch.position_ids,
    )
    return -torch.sum(logprobs)
