"""Options of the commands that roll out (`rollout`, `eval`, `filter-hard`): one definition each.

Every option that means the same thing has the same name and, where it is not a protocol setting,
the same default in every command. Two sampling protocols are written here once:

- rollouts (`rollout`, `filter-hard`): the paper's RL rollouts (arXiv 2508.20722, section 5),
  the agent loop's defaults: temperature 1.0, 10 turns, stage 1's 8K-token budget (`filter-hard`:
  stage 2's 12K, which is what the paper's hard-problem filter samples with);
- evaluation (`eval`): the paper's protocol: 16 samples, temperature 0.6, 30 turns, 30K tokens.

The sample count's default is the command's own (1 for `rollout`, 8 for `filter-hard` as the
paper, 16 for `eval`). `--max-response-tokens` left out means the protocol's budget clipped to
the model's context, with a warning (`budget_for_model`); given explicitly, a budget the model
cannot hold is a one-line error.

`rollout_options` adds them to a command (one list, in one place) and hands them over as one
`RolloutArgs`, which builds what the rollout job needs from them: the
agent and scheduler configs, the engine spec, and the settings a resumed run must share
(`sample_settings`). What it does not do: run anything. Tested in tests/cli/test_bad_outputs.py,
tests/unit/test_options.py and each command's integration test.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from rstar2cli.agent.loop import AgentConfig
from rstar2cli.engines.base import DEFAULT_KV_CACHE_TOKENS, parse_speculative
from rstar2cli.errors import UserError
from rstar2cli.rollout.jobs import scheduler_config
from rstar2cli.scheduler.scheduler import SchedulerConfig

# rollouts: the agent loop's defaults (the paper's stage-1 RL rollouts)
ROLLOUT = AgentConfig()
# filter-hard samples as the paper's stage 2 does: its 12K-token budget
FILTER_MAX_RESPONSE_TOKENS = 12288
EVAL_SAMPLES = 16
EVAL_TEMPERATURE = 0.6
EVAL_MAX_TURNS = 30
EVAL_MAX_RESPONSE_TOKENS = 30000
FILTER_SAMPLES = 8

ENGINE_KINDS = ("vllm", "hf")


def samples_option(default: int, why: str) -> Any:
    return typer.Option(default, "--samples", "-n", min=1, help=f"Rollouts per problem ({why}).")


def temperature_option(default: float) -> Any:
    return typer.Option(default, "--temperature", min=0.0, help="Sampling temperature (0: greedy).")


def max_turns_option(default: int) -> Any:
    return typer.Option(default, "--max-turns", min=1, help="Most model turns per trajectory.")


def max_response_tokens_option(default: int) -> Any:
    return typer.Option(
        None,
        "--max-response-tokens",
        min=1,
        show_default=False,
        help=f"Response budget, model + tool tokens (default: {default}, clipped to the "
        "model's context with a warning).",
    )


MODEL = typer.Option(..., "--model", metavar="CKPT", help="HF model folder (weights + tokenizer).")
ENGINES = typer.Option(1, "--engines", min=1, help="Number of inference engines.")
ENGINE = typer.Option("vllm", "--engine", metavar="KIND", help="Engine kind: vllm | hf.")
SANDBOX = typer.Option(
    None,
    "--sandbox",
    metavar="URL",
    help="sandboxd URL (repeatable); none: an in-process sandbox.",
)
SANDBOX_TOKEN_FILE = typer.Option(
    None,
    "--sandbox-token-file",
    metavar="PATH",
    show_default=False,
    help="File holding the --sandbox daemons' token (default: $RSTAR2_SANDBOX_TOKEN).",
)
RAY_ADDRESS = typer.Option(
    None,
    "--ray-address",
    metavar="ADDR",
    help="Run engines as Ray actors: 'local' or a cluster address (HEAD:6379).",
)
SCHEDULER = typer.Option(
    SchedulerConfig.policy,
    "--scheduler",
    metavar="POLICY",
    help="kv (KV-cache-aware) | static | least-requests.",
)
KV_MODE = typer.Option(
    SchedulerConfig.kv_mode,
    "--kv-mode",
    metavar="MODE",
    help="kv scheduler reservation: incremental (context + next step) | full (the paper's "
    "prompt + max response) | per_turn.",
)
KV_OVERCOMMIT = typer.Option(
    SchedulerConfig.kv_overcommit,
    "--kv-overcommit",
    min=1.0,
    max=2.0,
    help="incremental/per_turn: reserve up to this multiple of each engine's KV; 1.0 never "
    "lets an engine preempt.",
)
ADMISSION = typer.Option(
    SchedulerConfig.admission,
    "--admission",
    metavar="ORDER",
    help="kv: the order new trajectories start in: data | predicted (longest predicted first, "
    "from their prompt's siblings; slower than data order in benchmarks/scheduler_bench.py).",
)
TAIL_KV_FRACTION = typer.Option(
    SchedulerConfig.tail_kv_fraction,
    "--tail-kv-fraction",
    metavar="F",
    show_default=False,
    help="kv incremental: move a trajectory predicted long, at its next tool call, to a tail "
    "engine kept under this fraction of its KV (0 < F <= 1; default off, slower in "
    "benchmarks/scheduler_bench.py).",
)
KV_CACHE_TOKENS = typer.Option(
    None,
    "--kv-cache-tokens",
    min=1,
    show_default=False,
    help="KV cache per engine in tokens (default: on a GPU, what the engine's memory share "
    f"leaves; else {DEFAULT_KV_CACHE_TOKENS}, or one whole trajectory if more).",
)
TENSOR_PARALLEL_SIZE = typer.Option(
    1, "--tensor-parallel-size", min=1, help="GPUs per engine (vLLM tensor parallelism)."
)
SPECULATIVE = typer.Option(
    None,
    "--speculative",
    metavar="METHOD:TOKENS[:MAX_BATCH]",
    show_default=False,
    help="vllm: speculative decoding without a draft model: ngram:K drafts up to K tokens a step "
    "from the trajectory's own context while an engine's batch is at most MAX_BATCH (default 32; "
    "the rollout's tail). The samples keep the model's distribution (CPU engines: at "
    "temperature 0 only); the run prints the acceptance. Default: off.",
)
TOP_P = typer.Option(ROLLOUT.top_p, "--top-p", min=0.0, max=1.0, help="Nucleus sampling.")
SEED = typer.Option(0, "--seed", help="Sampling seed (mixed with problem id, sample and turn).")
TEMPLATE = typer.Option(
    "paper", "--template", metavar="NAME", help="Prompt template: paper | release."
)
MAX_TOOL_OUTPUT_CHARS = typer.Option(
    256,
    "--max-tool-output-chars",
    min=0,
    help="Tool output kept per call (middle cut); 0 keeps all.",
)
TOOL_TIMEOUT = typer.Option(
    ROLLOUT.tool_timeout_s, "--tool-timeout", help="Seconds one tool call may run (> 0)."
)


def rollout_options(
    *, samples: int, samples_help: str, max_turns: int, max_response_tokens: int, temperature: float
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the shared options, listed after its own, with this command's sample count
    and sampling protocol as their defaults. The command takes them as one `args: RolloutArgs`
    (`args.max_response_tokens` 0: not given; `fit_to_model` resolves it)."""
    shared = [
        ("samples", int, samples_option(samples, samples_help)),
        ("engines", int, ENGINES),
        ("engine", str, ENGINE),
        ("sandbox", list[str] | None, SANDBOX),
        ("sandbox_token_file", Path | None, SANDBOX_TOKEN_FILE),
        ("ray_address", str | None, RAY_ADDRESS),
        ("scheduler", str, SCHEDULER),
        ("kv_mode", str, KV_MODE),
        ("kv_overcommit", float, KV_OVERCOMMIT),
        ("admission", str, ADMISSION),
        ("tail_kv_fraction", float | None, TAIL_KV_FRACTION),
        ("kv_cache_tokens", int | None, KV_CACHE_TOKENS),
        ("tensor_parallel_size", int, TENSOR_PARALLEL_SIZE),
        ("speculative", str | None, SPECULATIVE),
        ("max_turns", int, max_turns_option(max_turns)),
        ("max_response_tokens", int | None, max_response_tokens_option(max_response_tokens)),
        ("temperature", float, temperature_option(temperature)),
        ("top_p", float, TOP_P),
        ("seed", int, SEED),
        ("template", str, TEMPLATE),
        ("max_tool_output_chars", int, MAX_TOOL_OUTPUT_CHARS),
        ("tool_timeout_s", float, TOOL_TIMEOUT),
    ]
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter(n, kw, default=d, annotation=a) for n, a, d in shared]

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(command).parameters.values() if p.name != "args"]

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            picked = {p.name: values.pop(p.name) for p in params}
            return command(**values, args=RolloutArgs.pick(picked))

        # NOTE: Typer reads the options from this signature (the command's own, then these)
        run.__signature__ = inspect.Signature([*own, *params])  # type: ignore[attr-defined]
        return run

    return wrap


@dataclass(frozen=True)
class RolloutArgs:
    """The parsed shared options of one command."""

    samples: int
    engines: int
    engine: str
    sandbox: list[str]
    sandbox_token_file: Path | None  # never the token itself: that stays in the file
    ray_address: str | None
    scheduler: str
    kv_mode: str
    kv_overcommit: float
    admission: str
    tail_kv_fraction: float | None
    kv_cache_tokens: int | None
    max_turns: int
    max_response_tokens: int  # resolved by `budget_for_model`
    temperature: float
    top_p: float
    seed: int
    template: str
    max_tool_output_chars: int
    tool_timeout_s: float
    tensor_parallel_size: int
    speculative: str | None

    @classmethod
    def pick(cls, values: dict[str, Any]) -> RolloutArgs:
        """The shared options, by name, as the command line gave them."""
        fields = dict(values)
        fields["sandbox"] = list(fields["sandbox"] or [])
        fields["max_response_tokens"] = fields["max_response_tokens"] or 0  # resolved later
        return cls(**fields)

    def check(self) -> None:
        """Values the option parser cannot check; one-line errors before any work."""
        from rstar2cli.agent.inputs import check_ray_address
        from rstar2cli.protocol import render_prompt

        if self.engine not in ENGINE_KINDS:
            raise UserError(f"--engine must be vllm or hf, got {self.engine!r}")
        if self.tool_timeout_s <= 0:
            raise UserError(f"--tool-timeout must be > 0 seconds, got {self.tool_timeout_s}")
        check_ray_address(self.ray_address)
        if self.sandbox_token_file is not None and not self.sandbox:
            raise UserError(
                "--sandbox-token-file is for --sandbox URLs (the in-process one needs none)"
            )
        if self.speculative is not None:
            if self.engine != "vllm":
                raise UserError(f"--speculative is for --engine vllm, not {self.engine}")
            parse_speculative(self.speculative)
        try:
            render_prompt("", self.template)
            self.sched_config()
        except ValueError as exc:
            raise UserError(str(exc)) from exc

    def sched_config(self, **extra: Any) -> SchedulerConfig:
        return scheduler_config(self, **extra)

    def agent_config(self, seed_base: int) -> Any:
        from rstar2cli.agent.loop import AgentConfig

        return AgentConfig(
            max_turns=self.max_turns,
            max_response_tokens=self.max_response_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=seed_base,
            template=self.template,
            max_tool_output_chars=self.max_tool_output_chars or None,
            tool_timeout_s=self.tool_timeout_s,
        )

    def engine_spec(self, model: Path | str) -> Any:
        from rstar2cli.engines.build import EngineSpec

        return EngineSpec(
            model_path=str(model),
            num_engines=self.engines,
            kind=self.engine,
            ray_address=self.ray_address,
            kv_cache_tokens=self.kv_cache_tokens,
            seed=self.seed,
            tensor_parallel_size=self.tensor_parallel_size,
            speculative=self.speculative,
        )

    def run_settings(self) -> dict[str, Any]:
        """Where and how it ran (free to change between a run and its resume)."""
        return {
            "samples": self.samples,
            "engines": self.engines,
            "engine": self.engine,
            "sandbox": self.sandbox,
            "ray_address": self.ray_address,
            "scheduler": self.scheduler,
            "kv_mode": self.kv_mode,
            "kv_overcommit": self.kv_overcommit,
            "admission": self.admission,
            "tail_kv_fraction": self.tail_kv_fraction,
            "kv_cache_tokens": self.kv_cache_tokens,
            "tensor_parallel_size": self.tensor_parallel_size,
            "speculative": self.speculative,
        }

    def sample_settings(self, model: str) -> dict[str, Any]:
        """What a sample means: a resumed run must match these exactly."""
        return {
            "model": model,
            "template": self.template,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_turns": self.max_turns,
            "max_response_tokens": self.max_response_tokens,
            "max_tool_output_chars": self.max_tool_output_chars,
            "tool_timeout_s": self.tool_timeout_s,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Fitted:
    """What the pre-flight learned from the model: its tokenizer, the arguments with the budget
    resolved, and the engines' context (longest prompt + budget)."""

    tokenizer: Any
    args: RolloutArgs
    max_model_len: int


def fit_to_model(
    console: Any,
    name: str,
    model: Path | str,
    tokenizer_path: Path | str,
    args: RolloutArgs,
    questions: list[str],
    requested: int | None,
    default: int,
) -> Fitted:
    """Load the tokenizer, resolve the response budget against the model's context
    (`budget_for_model`) and check that an asked-for KV cache holds one trajectory."""
    import dataclasses

    from transformers import AutoTokenizer

    from rstar2cli.agent.loop import longest_prompt_tokens

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path))
    longest = longest_prompt_tokens(questions, tokenizer, args.template)
    budget = budget_for_model(
        requested,
        default,
        longest,
        model_context_tokens(model),
        lambda msg: console.print(f"[yellow]{name}: {msg}[/]"),
    )
    args = dataclasses.replace(args, max_response_tokens=budget)
    args.engine_spec(model).check_fits(longest + budget)
    return Fitted(tokenizer, args, longest + budget)


def model_context_tokens(model: Path | str) -> int | None:
    """The longest sequence the model was built for (`max_position_embeddings`), if it says."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    config = config.get("text_config", config)
    value = config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else None


def budget_for_model(
    requested: int | None, default: int, longest_prompt: int, context: int | None, warn: Any
) -> int:
    """The response budget: `requested`, or `default` clipped to what the model's context leaves
    after the longest prompt (`warn` is told). One-line error when nothing fits."""
    if context is None:
        return requested or default
    room = context - longest_prompt
    if room < 1:
        raise UserError(
            f"the longest prompt ({longest_prompt} tokens) does not fit the model's context "
            f"({context} tokens, max_position_embeddings)"
        )
    if requested is not None:
        if requested > room:
            raise UserError(
                f"--max-response-tokens {requested} + the longest prompt ({longest_prompt}) = "
                f"{requested + longest_prompt} tokens exceeds the model's context of {context} "
                f"(max_position_embeddings); use --max-response-tokens {room} or less"
            )
        return requested
    if default > room:
        warn(
            f"response budget {default} clipped to {room} tokens: the model's context is "
            f"{context} and the longest prompt {longest_prompt}"
        )
        return room
    return default


def model_fingerprint(model: Path | str) -> str:
    """The model folder, resolved, with its weights' sizes and times: a changed or retrained
    model in the same folder makes a resumed run refuse to mix samples."""
    folder = Path(model).resolve()
    parts = [str(folder)]
    for f in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{int(st.st_mtime)}")
    return "|".join(parts)


def start_run_state(
    stats_path: Path, settings: dict[str, Any], run: dict[str, Any], num_done: int, what: str
) -> None:
    """Before a resumable run: refuse (one line) when the `num_done` records already in `what`
    were made with other sample settings, then record this run's settings in `stats_path` (the
    statistics join them at the end)."""
    from rstar2cli.fileio import write_json_atomic

    if num_done:
        earlier = read_run_state(stats_path).get("settings")
        check_same_settings(earlier, settings, what, "use another --out, or the same settings")
    write_json_atomic(stats_path, {"settings": settings, "run": run})


def read_run_state(stats_path: Path) -> dict[str, Any]:
    try:
        state = json.loads(stats_path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return state if isinstance(state, dict) else {}


def check_same_settings(
    earlier: dict[str, Any] | None, now: dict[str, Any], where: str, fix: str
) -> None:
    """Refuse (one line) to add samples made with other settings to `where`."""
    if not earlier:
        return
    for key, value in now.items():
        if key in earlier and earlier[key] != value:
            old, new = earlier[key], value
            if key == "model":  # a fingerprint: show the folder
                old, new = str(old).split("|")[0], str(new).split("|")[0]
                if old == new:
                    old, new = "an earlier version of it", "changed weights"
            raise UserError(f"{where} was made with {key}={old}, now {new}: {fix}")
