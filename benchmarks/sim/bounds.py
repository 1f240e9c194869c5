"""What no schedule of a workload can beat, and estimates of the tail no online policy removes.

Bounds (`lower_bound_s`): the work bound (total work / total capacity) and the critical path (the
slowest trajectory alone on an engine: its prompt and tool answers prefilled, every token decoded at
batch 1, every tool call waited in full); the batching bound (`batching_bound_s`) makes the two pay
for each other (a trajectory can share its steps only as far as it still finishes in time).
`step_floor_s` estimates the tail no online policy removes: see its docstring. `full_load_path_s`
(not a bound either) is the slowest trajectory's time on an engine held at the work bound's load,
where the two bounds pull apart. `workload_bounds` computes them all at once (`Bounds`).
`own_min_s` (one trajectory alone) also gives each simulated run its start-limited bound
(`result.SimResult.start_bound_s`).

Closed forms over the workload's scripted turns (`workload.played_turns`): nothing here runs the
scheduler or the simulator. Tested in tests/unit/test_scheduler_sim.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchmarks.sim.workload import Cost, SimTraj, played_turns


def attention_tokens(c: int, n: int) -> float:
    """Context tokens read over `n` decode steps that start at context `c`."""
    return n * c + n * (n - 1) / 2


def own_min_s(t: SimTraj, max_response: int, cost: Cost) -> float:
    """The least time trajectory `t` can take anywhere: alone on an engine (batch 1), its prompt
    and tool responses prefilled, every decode step at batch 1, every tool latency in full."""
    return _trajectory_s(t, max_response, cost, lambda c, n: cost.decode_s(1, c, n))


def _trajectory_s(
    t: SimTraj, max_response: int, cost: Cost, decode_s: Callable[[int, int], float]
) -> float:
    """Trajectory `t`'s time from its first prefill to its last token: its prompt and tool
    responses prefilled, every tool latency in full, and `decode_s(context, n)` for decoding n
    tokens from that context."""
    own = cost.p_s * t.prompt_tokens
    for c, n, tool_s, chunk in played_turns(t, max_response):
        own += decode_s(c, n)
        own += tool_s + cost.p_s * chunk
    return own


def lower_bound_s(
    workload: list[SimTraj],
    *,
    num_engines: int,
    capacity_tokens: int,
    max_response: int,
    cost: Cost,
    max_num_seqs: int = 256,
) -> tuple[float, float]:
    """(work bound, critical-path bound); no schedule finishes before either.

    Work (the issue's bound, total work / total capacity): every token at the cheapest per-token
    cost any engine could reach (batch as large as KV and `max_num_seqs` allow; with speculative
    decoding maybe the largest that drafts, `_work_batch`), every prompt and tool response
    prefilled once, spread evenly over all engines, no engine ever idle.
    Critical path: the slowest single trajectory's `own_min_s` (alone on an engine, batch 1).
    """
    total_tokens, ctx_token_sum, prefill = _totals(workload, max_response)
    batch = _work_batch(
        cost,
        total_tokens=total_tokens,
        ctx_token_sum=ctx_token_sum,
        capacity_tokens=capacity_tokens,
        max_num_seqs=max_num_seqs,
    )
    work = (
        _decode_work_s(cost, batch, total_tokens, ctx_token_sum) + cost.p_s * prefill
    ) / num_engines
    path = max(own_min_s(t, max_response, cost) for t in workload)
    return work, path


def batching_bound_s(
    workload: list[SimTraj],
    *,
    num_engines: int,
    capacity_tokens: int,
    max_response: int,
    cost: Cost,
    max_num_seqs: int = 256,
) -> float | None:
    """A lower bound on any schedule's makespan that makes the work bound and the critical path
    pay for each other (None with speculative decoding, where a step makes several tokens).

    A trajectory makes its D decode tokens in D steps, one after another, and waits out every
    step it is in: the longer its engine's batch, the slower it goes. Let a step take a + x, where
    x = the members' b + c x context (mu per token) plus any prefill it stalls for. The step's
    members' mu sum to at most x, so each step is worth at least sum(mu / x) over its tokens, and
    the number of steps N >= the sum of mu / x over all tokens. For one trajectory whose steps may
    add up to at most S = T - its tool waits and prefills - a x D, Cauchy-Schwarz gives
    sum(mu / x) >= (sum of sqrt(mu))^2 / S: it can only share its steps so much before it misses
    T. N also needs at least tokens / max_num_seqs, context tokens read / KV capacity (as the
    work bound) and the longest trajectory's D. All engines together run a x N + every token's b
    and c work + every prefill, which must fit in num_engines x T. The bound is the least T (not
    below the critical path) where it does. It is a relaxation (no engine placement, no discrete
    batches, no tool or KV contention), so a schedule may stay above it; none goes below it.
    """
    if cost.max_draft:
        return None
    total_tokens, ctx_token_sum, prefill = _totals(workload, max_response)
    fixed_s = cost.b_s * total_tokens + cost.c_s * ctx_token_sum + cost.p_s * prefill
    sqrt_sq, wait, decoded = [], [], []
    for t in workload:
        root, waited, num = 0.0, cost.p_s * t.prompt_tokens, 0
        for c, n, tool_s, chunk in played_turns(t, max_response):
            root += float(np.sqrt(cost.b_s + cost.c_s * np.arange(c, c + n)).sum())
            waited += tool_s + cost.p_s * chunk
            num += n
        sqrt_sq.append(root * root)
        wait.append(waited)
        decoded.append(num)
    roots, unusable = np.array(sqrt_sq), np.array(wait) + cost.a_s * np.array(decoded)
    min_steps = max(total_tokens / max_num_seqs, ctx_token_sum / capacity_tokens, max(decoded))

    def fits(T: float) -> bool:
        shares = np.divide(roots, T - unusable, out=np.zeros_like(roots), where=roots > 0)
        steps = max(float(shares.sum()), min_steps)
        return cost.a_s * steps + fixed_s <= num_engines * T

    lo = max(own_min_s(t, max_response, cost) for t in workload)
    if fits(lo):
        return lo
    hi = 2 * lo
    while not fits(hi):
        hi *= 2
    while hi - lo > 1e-6 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def _decode_work_s(cost: Cost, batch: int, total_tokens: int, ctx_token_sum: float) -> float:
    """Engine time to decode `total_tokens` (reading `ctx_token_sum` context tokens) at `batch`,
    speculating as an engine at that batch does."""
    d = cost.draft(batch, batch * ctx_token_sum / max(total_tokens, 1))
    per_token = cost.a_s / batch + cost.b_s * (d + 1)
    return (total_tokens * per_token + cost.c_s * ctx_token_sum) / cost.tokens_per_step(d)


def _work_batch(
    cost: Cost, *, total_tokens: int, ctx_token_sum: float, capacity_tokens: int, max_num_seqs: int
) -> int:
    """The batch the work bound runs at: the cheapest per token. Without speculative decoding the
    largest the KV and `max_num_seqs` allow (`_full_batch`); with it, possibly the largest batch
    that still drafts (`Cost.spec_max_batch`), when drafting there costs less per token."""
    full = _full_batch(total_tokens, ctx_token_sum, capacity_tokens, max_num_seqs)
    batches = {full, min(full, cost.spec_max_batch)} if cost.max_draft else {full}
    return min(batches, key=lambda b: _decode_work_s(cost, b, total_tokens, ctx_token_sum))


def full_load_path_s(
    workload: list[SimTraj],
    *,
    capacity_tokens: int,
    max_response: int,
    cost: Cost,
    max_num_seqs: int = 256,
) -> float:
    """Not a bound: the slowest trajectory's time on an engine held at the work bound's load.

    The work bound runs every engine at one batch B (`lower_bound_s`) holding B x the mean
    context in KV, so each decode step there costs a + b B + c (B x mean context). This is the
    longest any trajectory takes when every one of its steps costs that (its prefills and tool
    calls as in `own_min_s`). A schedule whose engines all stay at that load (the work bound's
    premise) cannot finish before it; to finish its slowest trajectories sooner it must run
    their engines lighter, which costs throughput. When this exceeds the work bound, the two
    bounds pull against each other and their max is not reachable at once.
    """
    total_tokens, ctx_token_sum, _ = _totals(workload, max_response)
    batch = _work_batch(
        cost,
        total_tokens=total_tokens,
        ctx_token_sum=ctx_token_sum,
        capacity_tokens=capacity_tokens,
        max_num_seqs=max_num_seqs,
    )
    mean_ctx = ctx_token_sum / max(total_tokens, 1)
    d = cost.draft(batch, batch * mean_ctx)
    token_s = cost.step_s(batch, batch * mean_ctx, d) / cost.tokens_per_step(d)
    return max(_trajectory_s(t, max_response, cost, lambda _, n: n * token_s) for t in workload)


def _totals(workload: list[SimTraj], max_response: int) -> tuple[int, float, int]:
    """(decoded tokens, context tokens read while decoding them, prefilled tokens), summed."""
    total_tokens, ctx_token_sum, prefill = 0, 0.0, 0
    for t in workload:
        prefill += t.prompt_tokens
        for c, n, _, chunk in played_turns(t, max_response):
            total_tokens += n
            ctx_token_sum += attention_tokens(c, n)
            prefill += chunk
    return total_tokens, ctx_token_sum, prefill


def _full_batch(
    total_tokens: int, ctx_token_sum: float, capacity_tokens: int, max_num_seqs: int
) -> int:
    """The batch the work bound assumes: as many mean contexts (decoded-token weighted) as the
    KV holds, at most `max_num_seqs`."""
    mean_ctx = ctx_token_sum / max(total_tokens, 1)
    return max(1, min(max_num_seqs, int(capacity_tokens / max(mean_ctx, 1))))


def step_floor_s(
    workload: list[SimTraj], *, num_engines: int, max_response: int, cost: Cost
) -> tuple[float, int, int]:
    """An estimate, not a bound, of the makespan no length-blind placement goes below.

    Let D be the `num_engines`-th largest decode count. When at least `num_engines` trajectories
    decode D tokens or more and lengths are unknown at admission, a placement that spreads load
    evenly leaves (nearly) every engine one of them; if it does not move, that engine runs at least
    D decode steps, each paying the fixed cost `a` once, plus its even share of everyone's per-token
    work (b, c and p terms): a * D + per-token work / num_engines. The work bound instead spreads
    `a` over full batches of `max_num_seqs`. A placement that knew the lengths could put the long
    trajectories on fewer engines and do better; so could migration. With speculative decoding
    those D tokens take D / (the tokens a batch-1 step makes) steps (the per-token work is left
    as it is). Returns (estimate s, D, trajectories decoding at least D).
    """
    decode, marginal_s = [], 0.0
    for t in workload:
        marginal_s += cost.p_s * t.prompt_tokens
        num = 0
        for c, n, _, chunk in played_turns(t, max_response):
            num += n
            marginal_s += cost.b_s * n + cost.c_s * attention_tokens(c, n) + cost.p_s * chunk
        decode.append(num)
    decode.sort(reverse=True)
    d = decode[min(num_engines, len(decode)) - 1]
    steps = d / cost.tokens_per_step(cost.draft(1, 0))
    return cost.a_s * steps + marginal_s / num_engines, d, sum(1 for x in decode if x >= d)


@dataclass(frozen=True)
class Bounds:
    """Every bound and estimate of one workload on one cluster (see the functions above)."""

    work_s: float
    critical_path_s: float
    batching_s: float | None  # None with speculative decoding
    step_floor_s: float
    step_floor_tokens: int  # D of `step_floor_s`
    num_step_floor: int  # trajectories decoding at least D tokens
    full_load_path_s: float

    @property
    def max_s(self) -> float:
        """max(work bound, critical path): what the issue's first target is set against."""
        return max(self.work_s, self.critical_path_s)


def workload_bounds(
    workload: list[SimTraj],
    *,
    num_engines: int,
    capacity_tokens: int,
    max_response: int,
    cost: Cost,
    max_num_seqs: int = 256,
) -> Bounds:
    """`lower_bound_s`, `batching_bound_s`, `step_floor_s` and `full_load_path_s` of `workload`."""
    work_s, path_s = lower_bound_s(
        workload,
        num_engines=num_engines,
        capacity_tokens=capacity_tokens,
        max_response=max_response,
        cost=cost,
        max_num_seqs=max_num_seqs,
    )
    batching_s = batching_bound_s(
        workload,
        num_engines=num_engines,
        capacity_tokens=capacity_tokens,
        max_response=max_response,
        cost=cost,
        max_num_seqs=max_num_seqs,
    )
    floor_s, floor_tokens, num_floor = step_floor_s(
        workload, num_engines=num_engines, max_response=max_response, cost=cost
    )
    full_load_s = full_load_path_s(
        workload,
        capacity_tokens=capacity_tokens,
        max_response=max_response,
        cost=cost,
        max_num_seqs=max_num_seqs,
    )
    return Bounds(
        work_s=work_s,
        critical_path_s=path_s,
        batching_s=batching_s,
        step_floor_s=floor_s,
        step_floor_tokens=floor_tokens,
        num_step_floor=num_floor,
        full_load_path_s=full_load_s,
    )
