"""Weight sync benchmark: the disk path vs the broadcast path, same trainer, same engines, one run.

Setup: a 102M-parameter Qwen3-style model built here (rstar2cli/data/tiny.py size "100m", random
weights, fp32: 408 MB; nothing downloaded), one real DeepSpeed trainer rank as a Ray actor
(rstar2cli/rl/workers.py RayTrainers; ZeRO stage `--zero-stage`), two vLLM-CPU engines
(weights in `--engine-dtype`) as Ray actors, all on a local Ray instance, which is how rl-stage
runs with `--ray-address local`.
Both paths are rstar2cli/rl/sync.py's `WeightSync.push`:
- disk (the path every sync took before the broadcast, still the fallback): trainer rank 0's state
  dict comes to the driver (ray.get), one copy per engine goes through Ray's object store, each
  engine writes a safetensors file and vLLM reloads it from disk;
- broadcast: trainer rank 0 streams buckets over a gloo transfer group to both engines' workers,
  which load them in place (checksums compared after each sync); the driver sends a plan.
Syncs alternate between the paths (`--repeats` each, the first pair is a warm-up and not counted);
per path: median seconds per sync, and the driver's peak RSS growth during a sync (psutil, sampled
every 2 ms). Setting up the broadcast group is timed apart (once per run in rl-stage).

Beside the measurement, a PROJECTION (not a measurement) of one sync at 14B on 32 engines from
stated link and disk rates (`project_14b`): what each path moves and through where.

    python -m benchmarks.weight_sync_speed --json weight_sync.json    # ~2 min on 2 cores, ~8 GB RAM
    python -m benchmarks.weight_sync_speed --engine-dtype bfloat16    # engines in bf16, as on GPUs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


class PeakRss:
    """Samples this process's RSS in a thread; `peak_growth_mb()` since the last `reset()`."""

    def __init__(self, period_s: float = 0.002):
        import psutil

        self._proc, self._period_s = psutil.Process(), period_s
        self._lock = threading.Lock()  # NOTE: a sample read before a reset must not land after it
        self._base = self._peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        with self._lock:
            self._peak = max(self._peak, self._proc.memory_info().rss)

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self._sample()

    def reset(self) -> None:
        with self._lock:
            self._base = self._peak = self._proc.memory_info().rss

    def peak_growth_mb(self) -> float:
        self._sample()
        return (self._peak - self._base) / 2**20

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


async def one_sync(sync: Any, rss: PeakRss) -> tuple[float, float, str]:
    import gc

    gc.collect()
    rss.reset()
    start = time.perf_counter()
    row = await sync.push()
    seconds = time.perf_counter() - start
    return seconds, rss.peak_growth_mb(), row["weight_sync"]


async def measure(trainers: Any, engines: list[Any], repeats: int) -> dict[str, Any]:
    from rstar2cli.rl.sync import WeightSync

    broadcast = WeightSync(trainers, engines)
    t0 = time.perf_counter()
    await broadcast.setup()
    setup_s = time.perf_counter() - t0
    disk = WeightSync(trainers, engines)  # never set up: every engine takes the disk path
    rss = PeakRss()
    runs: dict[str, list[tuple[float, float]]] = {"disk": [], "collective": []}
    try:
        for i in range(repeats + 1):
            order = [("disk", disk), ("collective", broadcast)]
            for name, sync in order if i % 2 == 0 else order[::-1]:
                seconds, growth_mb, path = await one_sync(sync, rss)
                assert path == ("disk" if name == "disk" else "broadcast"), path
                print(f"  {name:10s} sync {i}: {seconds:6.2f} s, driver RSS +{growth_mb:7.1f} MB")
                if i > 0:  # the first pair warms caches and allocators
                    runs[name].append((seconds, growth_mb))
    finally:
        rss.close()
    out: dict[str, Any] = {
        name: {
            "sync_s": statistics.median(s for s, _ in r),
            "driver_rss_growth_mb": max(g for _, g in r),
            "sync_s_all": [round(s, 3) for s, _ in r],
        }
        for name, r in runs.items()
    }
    out["collective"]["setup_s"] = setup_s
    out["collective"]["num_buckets"] = len(broadcast.plan.buckets) if broadcast.plan else 0
    return out


def project_14b() -> dict[str, Any]:
    """PROJECTION, not a measurement: one sync of a 14B model to 32 engines (TP 1, 8 GPUs per
    node), from the rates below. Each path is summed stage by stage with no overlap, which
    overstates both a little and the disk path's pipelined network copies the most."""
    a = {
        "params": 14.8e9,  # Qwen3-14B
        "bytes_per_param": 2,  # bf16 on the wire and in vLLM
        "num_engines": 32,
        "nccl_broadcast_gb_s": 20.0,  # bus bandwidth of a pipelined NCCL broadcast across
        # InfiniBand nodes (200-400 Gb/s NICs); the low end of what such links sustain
        "zero3_allgather_gb_s": 50.0,  # per-bucket gathers among the trainer ranks
        "gpu_load_gb_s": 500.0,  # copying received buckets into the engine's weights (HBM)
        "driver_serialize_gb_s": 5.0,  # pickling a state dict into Ray's object store, per copy
        "driver_nic_gb_s": 50.0,  # one 400 Gb/s NIC out of the driver's node
        "disk_write_gb_s": 2.0,  # safetensors written to each engine node's NVMe
        "disk_read_gb_s": 2.0,  # vLLM reading it back (page cache would be faster)
    }
    size_gb = a["params"] * a["bytes_per_param"] / 1e9
    collective = size_gb * (
        1 / a["nccl_broadcast_gb_s"] + 1 / a["zero3_allgather_gb_s"] + 1 / a["gpu_load_gb_s"]
    )
    copies_gb = size_gb * a["num_engines"]  # one object per engine call
    disk = (
        size_gb / a["driver_nic_gb_s"]  # rank 0 -> driver
        + copies_gb / a["driver_serialize_gb_s"]
        + copies_gb / a["driver_nic_gb_s"]
        + size_gb / a["disk_write_gb_s"]  # engines write in parallel
        + size_gb / a["disk_read_gb_s"]
    )
    return {
        "kind": "PROJECTION from assumed rates, not a measurement",
        "assumptions": a,
        "model_gb": size_gb,
        "through_driver_gb": {"disk": size_gb + copies_gb, "collective": 0.0},
        "sync_s": {"disk": disk, "collective": collective},
        "speedup": disk / collective,
    }


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--repeats", type=int, default=3, help="timed syncs per path (after warm-up)")
    ap.add_argument("--zero-stage", type=int, default=0, choices=[0, 3])
    ap.add_argument(
        "--engine-dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="the engines' weights (the trainer keeps fp32 masters): float32, vLLM-CPU's default "
        "here, or bfloat16, as engines run on GPUs (the broadcast then sends half the bytes)",
    )
    return ap.parse_args()


def main() -> None:
    args = _parse_args()

    import ray
    import torch
    from transformers import AutoConfig

    from rstar2cli.data.tiny import build_tiny_model_dir
    from rstar2cli.engines.build import make_engines
    from rstar2cli.rl.train_recipe import RlTrainConfig
    from rstar2cli.rl.workers import RayTrainers

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="rstar2-wsync-") as tmp:
        model = build_tiny_model_dir(Path(tmp) / "model", seed=0, size="100m")
        num_params = _num_params(AutoConfig.from_pretrained(model))
        print(f"model: {num_params / 1e6:.1f}M params, {num_params * 4 / 2**20:.0f} MB fp32")
        ray.init(num_cpus=4, object_store_memory=2 * 2**30, include_dashboard=False)
        cfg = RlTrainConfig(zero_stage=args.zero_stage)
        trainers = RayTrainers(str(model), cfg, num_ranks=1, ray_address="local")
        engines = make_engines(
            str(model),
            2,
            ray_address="local",
            kv_cache_tokens=2048,
            max_model_len=1024,
            dtype=args.engine_dtype,
        )

        async def run() -> dict[str, Any]:
            try:
                return await measure(trainers, engines, args.repeats)
            finally:
                await asyncio.gather(*(e.shutdown() for e in engines))

        try:
            results = asyncio.run(run())
        finally:
            trainers.close()
            ray.shutdown()
    model_mb = num_params * 4 / 2**20
    summary = {
        "model_params": num_params,
        "model_mb": model_mb,
        "num_engines": 2,
        "zero_stage": args.zero_stage,
        "engine_dtype": args.engine_dtype,
        "disk": results["disk"],
        "collective": results["collective"],
        "speedup": results["disk"]["sync_s"] / results["collective"]["sync_s"],
        "driver_growth_share": results["collective"]["driver_rss_growth_mb"] / model_mb,
        "projection_14b_32_engines": project_14b(),
    }
    _print(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


def _num_params(config: Any) -> int:
    """From the config, tied embeddings once (what the trainer sends)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _print(s: dict[str, Any]) -> None:
    d, c, p = s["disk"], s["collective"], s["projection_14b_32_engines"]
    print(f"\n{'path':12s}{'s/sync':>10s}{'driver RSS +MB':>16s}")
    print(f"{'disk':12s}{d['sync_s']:10.2f}{d['driver_rss_growth_mb']:16.1f}")
    print(f"{'collective':12s}{c['sync_s']:10.2f}{c['driver_rss_growth_mb']:16.1f}")
    print(
        f"engines in {s['engine_dtype']}; speedup {s['speedup']:.1f}x; driver growth "
        f"{100 * s['driver_growth_share']:.2f}% of the model ({s['model_mb']:.0f} MB); "
        f"broadcast group set-up {c['setup_s']:.1f} s once"
    )
    print(
        f"PROJECTION (assumed rates, not measured) 14B x 32 engines: disk "
        f"{p['sync_s']['disk']:.0f} s, collective {p['sync_s']['collective']:.1f} s per sync "
        f"({p['speedup']:.0f}x); {p['through_driver_gb']['disk']:.0f} GB through the driver vs 0"
    )


if __name__ == "__main__":
    main()
