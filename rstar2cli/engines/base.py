"""The inference-engine surface the rollout scheduler talks to: the Protocol and its value types.

One small Protocol (`Engine`) with four implementations in this package:
- `VllmEngine` (vllm_engine.py): vLLM v1 `AsyncLLM`, token ids in/out, prefix caching on.
- `HfEngine` (hf_engine.py): transformers, a continuous-batching loop over a KV token budget it
  accounts itself; for machines without vLLM.
- `RayEngine` (ray_engine.py): either of the above inside one Ray actor, behind a thin async proxy.
- `EndpointEngine` (endpoint_engine.py): an OpenAI-compatible server (`vllm serve`).
Building them: local.py (one engine in this process, also what a Ray actor runs), build.py
(`EngineSpec`, `make_engines`: N engines in this process or as Ray actors, with their placement).

Every engine stops on `<|im_end|>` (always, in addition to `SamplingSpec.stop_token_ids`); when it
stops on a stop id, that id is the last entry of `GenOutput.token_ids`. The one exception is
`SamplingSpec.ignore_eos`: no stop at all, the turn runs to `max_tokens`.

`metrics()` reports at least METRIC_KEYS (counts are totals since start; prefix queries/hits are
in tokens). A Ray proxy reports its actor's.

Beyond the Protocol, vLLM engines (and their Ray proxies) take part in the broadcast weight sync
(`num_weight_receivers`, `join_weight_group`, `receive_weights`; rstar2cli/rl/sync.py) and sleep
between phases when colocated; an engine without them gets `update_weights`. `shares_prefixes`
(vLLM engines and their proxies; absent: False) says requests with a common prefix hold its KV
blocks once, so the scheduler's ledger counts the system prompt once per engine.

What this module does not do: admission control. The scheduler keeps its own KV ledger against
`kv_capacity_tokens()`; `kv_used_tokens()` and `metrics()` are for stats and plots only. It
imports nothing heavy (torch only for type checking), so the agent loop and the scheduler's users
can take these types without an engine.

NOTE: a vLLM engine is bound to the event loop it first runs on (its client's sockets and output
task live there): use all engines of a run from one event loop. (The HF engine restarts its step
task on a new loop; Ray proxies hold no loop state.)

Tested in tests/unit/test_hf_engine.py, tests/unit/test_speculative.py,
tests/integration/test_vllm_engine.py and tests/integration/test_ray_engines.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rstar2cli.errors import UserError

if TYPE_CHECKING:
    import torch

FINISH_REASONS = ("stop", "length", "abort", "error")
# speculative decoding without a draft model (vllm_args.speculative_config), by default at
# batches up to SPECULATIVE_MAX_BATCH: there, on an H100 with a 14B model, the cost model of
# benchmarks/sim/workload.py (at acceptance 0.5) still drafts 3 or 4 tokens a step; a full batch
# is left to the GPU's compute.
SPECULATIVE_METHODS = ("ngram",)
SPECULATIVE_MAX_BATCH = 32
# KV cache per engine when a command or recipe does not say, off a GPU (tokens; CPU and
# transformers engines need a size; a vLLM engine on a GPU sizes it from memory instead).
DEFAULT_KV_CACHE_TOKENS = 65536
ENGINE_KINDS = ("vllm", "hf")
METRIC_KEYS = (
    "kv_capacity_tokens",
    "kv_used_tokens",
    "peak_kv_used_tokens",
    "num_running_reqs",
    "num_waiting_reqs",
    "num_preemptions",
    "num_prefix_queries",
    "num_prefix_hits",
    "num_preempted_prefix_queries",
    "num_preempted_prefix_hits",
    "num_prompt_tokens",
    "num_generation_tokens",
)


@dataclass
class SamplingSpec:
    """Sampling settings of one generate call. temperature 0 means greedy."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)  # <|im_end|> is always added
    want_logprobs: bool = False
    # NOTE: True: the engine stops neither at the model's EOS nor at any stop id (<|im_end|>
    # included), so the turn is exactly `max_tokens` long (unless the context reaches the model's
    # length): a turn of forced length, for replaying a recorded workload
    # (benchmarks/scheduler/scripted.py).
    ignore_eos: bool = False


@dataclass
class GenOutput:
    """What one generate call produced.

    `logprobs[i]` is the log-probability of `token_ids[i]` under the distribution it was drawn
    from (after temperature and top-p; greedy: the raw logits'), or None when not asked for.
    A remote endpoint reports what its server is set to (vLLM serve: `--logprobs-mode`).
    """

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str  # one of FINISH_REASONS


@runtime_checkable
class Engine(Protocol):
    name: str

    async def generate(
        self, request_id: str, prompt_ids: list[int], spec: SamplingSpec
    ) -> GenOutput: ...

    def kv_capacity_tokens(self) -> int: ...

    def kv_block_size_tokens(self) -> int: ...

    def kv_used_tokens(self) -> int: ...

    def metrics(self) -> dict[str, float]: ...

    async def update_weights(self, named_tensors: dict[str, torch.Tensor] | str) -> None: ...

    async def shutdown(self) -> None: ...


def parse_speculative(text: str) -> tuple[str, int, int]:
    """`METHOD:TOKENS[:MAX_BATCH]` (e.g. `ngram:4`, `ngram:4:64`) -> (method, draft tokens a
    step, the largest batch that drafts; default SPECULATIVE_MAX_BATCH); one-line error if not."""
    method, *numbers = text.split(":")
    if method == "suffix":
        # NOTE: vLLM's suffix drafter asserts that every step asks it for its full draft count:
        # under the batch-size schedule the engine core died at the first batch above MAX_BATCH,
        # and drafting at every batch made a rollout ~10x slower (benchmarks/speculative.py)
        raise UserError(
            f"--speculative {text!r}: suffix decoding is not offered: vLLM's suffix drafter "
            "cannot be limited to low batches, and at every batch it made rollouts ~10x slower; "
            "use ngram:TOKENS"
        )
    ok = method in SPECULATIVE_METHODS and len(numbers) in (1, 2)
    ok = ok and all(n.isdigit() for n in numbers)
    values = [int(n) for n in numbers] if ok else []
    if not ok or not 1 <= values[0] <= 16 or (len(values) == 2 and values[1] < 1):
        raise UserError(
            f"--speculative {text!r}: expected METHOD:TOKENS[:MAX_BATCH] with METHOD one of "
            f"{', '.join(SPECULATIVE_METHODS)}, 1-16 draft tokens and a largest batch >= 1 that "
            f"drafts (default {SPECULATIVE_MAX_BATCH}), e.g. ngram:4"
        )
    return method, values[0], values[1] if len(values) == 2 else SPECULATIVE_MAX_BATCH


def close_now(engine: Engine) -> None:
    """Shut an engine down from synchronous code (cleanup paths, fixtures)."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()


def read_safetensors_folder(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF folder's *.safetensors files, by name."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors
