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

Each option is one field of `RolloutArgs`, declared as `Annotated[type, typer.Option(...)]`:
`rollout_options` turns the fields into a command's keyword parameters (with that command's
defaults) and hands the parsed values over as one `RolloutArgs`, which builds what the rollout
job needs from them: the agent and scheduler configs, the engine spec, the run's settings and
those a resumed run must share (`run_settings`, `sample_settings`, from tuples of field names).
Adding an option is adding a field. What it does not do: run anything, or compare a resumed
run's settings (`rstar2cli.rollout.resume`). Tested in tests/unit/test_options.py,
tests/cli/test_bad_outputs.py and each command's integration test.
"""

from __future__ import annotations

import copy
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any

import typer

from rstar2cli.agent.loop import AgentConfig
from rstar2cli.engines.base import DEFAULT_KV_CACHE_TOKENS, ENGINE_KINDS, parse_speculative
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

MODEL = typer.Option(..., "--model", metavar="CKPT", help="HF model folder (weights + tokenizer).")


class _LeftOut:
    """`Annotated` mark of an option that reads None when left out on the command line; its field
    then keeps the dataclass default (no --sandbox: an empty list; no --max-response-tokens: 0,
    which `fit_to_model` resolves)."""


LEFT_OUT = _LeftOut()


@dataclass(frozen=True)
class RolloutArgs:
    """The parsed shared options of one command; each field is one option, stated once.

    A field's `typer.Option` is its flag and help (`{why}` and `{budget}` in a help are filled
    in per command by `rollout_options`), its default the option's default. The sample count,
    `--max-turns` and `--temperature` take the command's own defaults instead (`rollout_options`).
    Which settings a field is recorded in: `SAMPLE_FIELDS`, `UNRECORDED_FIELDS`, else `run_settings`.
    """

    samples: Annotated[
        int, typer.Option("--samples", "-n", min=1, help="Rollouts per problem ({why}).")
    ] = 1
    engines: Annotated[
        int, typer.Option("--engines", min=1, help="Number of inference engines.")
    ] = 1
    engine: Annotated[
        str, typer.Option("--engine", metavar="KIND", help="Engine kind: vllm | hf.")
    ] = "vllm"
    sandbox: Annotated[
        list[str],
        typer.Option(
            "--sandbox",
            metavar="URL",
            help="sandboxd URL (repeatable); none: an in-process sandbox.",
        ),
        LEFT_OUT,
    ] = field(default_factory=list)
    sandbox_token_file: Annotated[
        Path | None,  # never the token itself: that stays in the file
        typer.Option(
            "--sandbox-token-file",
            metavar="PATH",
            show_default=False,
            help="File holding the --sandbox daemons' token (default: $RSTAR2_SANDBOX_TOKEN).",
        ),
    ] = None
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            metavar="ADDR",
            help="Run engines as Ray actors: 'local' or a cluster address (HEAD:6379).",
        ),
    ] = None
    scheduler: Annotated[
        str,
        typer.Option(
            "--scheduler",
            metavar="POLICY",
            help="kv (KV-cache-aware) | static | least-requests.",
        ),
    ] = SchedulerConfig.policy
    kv_mode: Annotated[
        str,
        typer.Option(
            "--kv-mode",
            metavar="MODE",
            help="kv scheduler reservation: incremental (context + next step) | full (the "
            "paper's prompt + max response) | per_turn.",
        ),
    ] = SchedulerConfig.kv_mode
    kv_overcommit: Annotated[
        float,
        typer.Option(
            "--kv-overcommit",
            min=1.0,
            max=2.0,
            help="incremental/per_turn: reserve up to this multiple of each engine's KV; 1.0 "
            "never lets an engine preempt.",
        ),
    ] = SchedulerConfig.kv_overcommit
    admission: Annotated[
        str,
        typer.Option(
            "--admission",
            metavar="ORDER",
            help="kv: the order new trajectories start in: predicted (the longest predicted "
            "first, from their prompt's siblings) | data (the order of the data).",
        ),
    ] = SchedulerConfig.admission
    tail_kv_fraction: Annotated[
        float | None,
        typer.Option(
            "--tail-kv-fraction",
            metavar="F",
            show_default=False,
            help="kv incremental: move a trajectory predicted long, at its next tool call, to a "
            "tail engine kept under this fraction of its KV (0 < F <= 1; default: off).",
        ),
    ] = SchedulerConfig.tail_kv_fraction
    kv_cache_tokens: Annotated[
        int | None,
        typer.Option(
            "--kv-cache-tokens",
            min=1,
            show_default=False,
            help="KV cache per engine in tokens (default: on a GPU, what the engine's memory "
            f"share leaves; else {DEFAULT_KV_CACHE_TOKENS}, or one whole trajectory if more).",
        ),
    ] = None
    tensor_parallel_size: Annotated[
        int,
        typer.Option(
            "--tensor-parallel-size", min=1, help="GPUs per engine (vLLM tensor parallelism)."
        ),
    ] = 1
    speculative: Annotated[
        str | None,
        typer.Option(
            "--speculative",
            metavar="METHOD:TOKENS[:MAX_BATCH]",
            show_default=False,
            help="vllm: speculative decoding without a draft model: ngram:K drafts up to K "
            "tokens a step from the trajectory's own context while an engine's batch is at most "
            "MAX_BATCH (default 32; the rollout's tail). The samples keep the model's "
            "distribution (CPU engines: at temperature 0 only); the run prints the acceptance. "
            "Default: off.",
        ),
    ] = None
    max_turns: Annotated[
        int, typer.Option("--max-turns", min=1, help="Most model turns per trajectory.")
    ] = ROLLOUT.max_turns
    max_response_tokens: Annotated[
        int,
        typer.Option(
            "--max-response-tokens",
            min=1,
            show_default=False,
            help="Response budget, model + tool tokens (default: {budget}, clipped to the "
            "model's context with a warning).",
        ),
        LEFT_OUT,
    ] = 0  # 0: left out; `fit_to_model` resolves it (`budget_for_model`)
    temperature: Annotated[
        float,
        typer.Option("--temperature", min=0.0, help="Sampling temperature (0: greedy)."),
    ] = ROLLOUT.temperature
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="Nucleus sampling.")] = (
        ROLLOUT.top_p
    )
    seed: Annotated[
        int,
        typer.Option("--seed", help="Sampling seed (mixed with problem id, sample and turn)."),
    ] = 0
    template: Annotated[
        str,
        typer.Option("--template", metavar="NAME", help="Prompt template: paper | release."),
    ] = "paper"
    max_tool_output_chars: Annotated[
        int,
        typer.Option(
            "--max-tool-output-chars",
            min=0,
            help="Tool output kept per call (middle cut); 0 keeps all.",
        ),
    ] = 256
    tool_timeout_s: Annotated[
        float,
        typer.Option("--tool-timeout", help="Seconds one tool call may run (> 0)."),
    ] = ROLLOUT.tool_timeout_s

    @classmethod
    def pick(cls, values: dict[str, Any]) -> RolloutArgs:
        """The shared options, by name, as the command line gave them."""
        left_out = {name for name, hint in _hints().items() if LEFT_OUT in hint.__metadata__}
        return cls(**{k: v for k, v in values.items() if v is not None or k not in left_out})

    def check(self) -> None:
        """Values the option parser cannot check; one-line errors before any work."""
        from rstar2cli.preflight import check_ray_address
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

    def check_local_speculation(self) -> None:
        """CPU engines speculate at temperature 0 only (`preflight.check_local_speculation`)."""
        from rstar2cli.preflight import check_local_speculation

        check_local_speculation(
            self.speculative, self.temperature, self.ray_address, name="--speculative"
        )

    def sched_config(self, **extra: Any) -> SchedulerConfig:
        return scheduler_config(self, **extra)

    def agent_config(self, seed_base: int) -> AgentConfig:
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
        return {name: getattr(self, name) for name in RUN_FIELDS}

    def sample_settings(self, model: str) -> dict[str, Any]:
        """What a sample means: a resumed run must match these exactly."""
        return {"model": model, **{name: getattr(self, name) for name in SAMPLE_FIELDS}}


# what a sample means (`sample_settings`), in the order a mismatch is reported
SAMPLE_FIELDS = (
    "template",
    "temperature",
    "top_p",
    "max_turns",
    "max_response_tokens",
    "max_tool_output_chars",
    "tool_timeout_s",
    "seed",
)
# recorded in neither: a path on this machine
UNRECORDED_FIELDS = ("sandbox_token_file",)
# every other field: where and how it ran (`run_settings`)
RUN_FIELDS = tuple(
    f.name for f in fields(RolloutArgs) if f.name not in SAMPLE_FIELDS + UNRECORDED_FIELDS
)


@functools.cache
def _hints() -> dict[str, Any]:
    """RolloutArgs' field annotations, evaluated: `Annotated[type, typer.Option, marks...]`."""
    return typing.get_type_hints(RolloutArgs, include_extras=True)


def option_parameters(
    defaults: dict[str, Any], help_values: dict[str, str]
) -> list[inspect.Parameter]:
    """The RolloutArgs fields as a command's keyword parameters, as Typer reads them:
    `defaults` replace the fields' defaults by name, `help_values` fill the helps' `{...}`."""
    params = []
    for f in fields(RolloutArgs):
        base, option, *marks = typing.get_args(_hints()[f.name])
        option = copy.copy(option)
        option.help = option.help.format(**help_values)
        default = None if LEFT_OUT in marks else defaults.get(f.name, f.default)
        params.append(
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=Annotated[base, option],
            )
        )
    return params


def rollout_options(
    *, samples: int, samples_help: str, max_turns: int, max_response_tokens: int, temperature: float
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the shared options (the RolloutArgs fields), listed after its own, with this
    command's sample count and sampling protocol as their defaults. The command takes them as one
    `args: RolloutArgs` (`args.max_response_tokens` 0: left out; `fit_to_model` resolves it)."""
    params = option_parameters(
        defaults={"samples": samples, "max_turns": max_turns, "temperature": temperature},
        help_values={"why": samples_help, "budget": str(max_response_tokens)},
    )

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
class Fitted:
    """What the pre-flight learned from the model: its tokenizer, the arguments with the budget
    resolved, and the engines' context (longest prompt + budget)."""

    tokenizer: Any
    args: RolloutArgs
    max_model_len: int


def fit_to_model(
    *,
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
    from rstar2cli.preflight import budget_for_model, model_context_tokens

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path))
    longest = longest_prompt_tokens(
        questions=questions, tokenizer=tokenizer, template=args.template
    )
    budget = budget_for_model(
        requested=requested,
        default=default,
        longest_prompt=longest,
        context=model_context_tokens(model),
        warn=lambda msg: console.print(f"[yellow]{name}: {msg}[/]"),
    )
    args = dataclasses.replace(args, max_response_tokens=budget)
    args.engine_spec(model).check_fits(longest + budget)
    return Fitted(tokenizer=tokenizer, args=args, max_model_len=longest + budget)
