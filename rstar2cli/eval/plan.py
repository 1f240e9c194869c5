"""Everything `rstar2 eval` checks before any work, so bad input fails with one line at once.

`Plan.check` validates the options (output folder, exactly one of model/endpoint, k <= n,
benchmark names, files), probes each `--endpoint` (`GET /v1/models`) and `--sandbox` (/healthz),
and loads the benchmark problems. `earlier_settings` reads what a label ran with (summary.json),
which the command compares with this run's before adding samples to it.

What it does not do: start engines or write anything. Tested in tests/cli/test_eval_grade_only.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rstar2cli.agent.inputs import check_model_folder, check_sandboxes
from rstar2cli.errors import UserError
from rstar2cli.fileio import check_output_path

SUMMARY = "summary.json"


class Plan:
    """Everything checked up front: data loaded, model/endpoint reachable, sandboxes alive."""

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
        names,
        files,
        model,
        endpoints,
        tokenizer,
        sandboxes,
        engine,
        out,
        ks,
        n,
        sandbox_token_file=None,
    ) -> Plan:
        from rstar2cli.eval import benchmarks as B

        plan = cls()
        if out is None:
            raise UserError("--out DIR is required")
        if out.exists() and not out.is_dir():
            raise UserError(f"--out must be a folder, got the file {out}")
        plan.out = out
        if (model is None) == (not endpoints):
            raise UserError("give exactly one of --model PATH or --endpoint URL")
        if engine not in ("vllm", "hf"):
            raise UserError(f"--engine must be vllm or hf, got {engine!r}")
        if not names and not files:
            raise UserError("give at least one --benchmark NAME or --data PATH")
        if ks[0] < 1 or ks[-1] > n:
            raise UserError(f"--k must be between 1 and --samples ({n}), got {ks}")
        B.check_names(names)
        for path in files:
            if not path.is_file():
                raise UserError(f"--data file not found: {path}")
        all_names = list(names) + [B.local_name(p) for p in files]
        if len(set(all_names)) != len(all_names):
            raise UserError(
                f"benchmark names repeat: {all_names} (local files are named by their stem)"
            )
        plan._check_engine_side(model, endpoints, tokenizer)
        plan.sandbox_urls = list(sandboxes)
        if sandboxes:
            check_sandboxes(sandboxes, sandbox_token_file)
        plan.benchmarks = [B.load_benchmark(nm) for nm in names] + [B.load_local(p) for p in files]
        # NOTE: last, so a bad input above leaves no --out folder behind
        check_output_path(out)
        return plan

    def _check_engine_side(
        self, model: Path | None, endpoints: list[str], tokenizer: Path | None
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


def earlier_settings(out: Path, label: str) -> dict[str, Any] | None:
    """The settings summary.json holds for `label` (None: a new label)."""
    import json

    try:
        doc = json.loads((out / SUMMARY).read_text())
        settings = doc["labels"][label]["settings"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None
    return settings if isinstance(settings, dict) else None
