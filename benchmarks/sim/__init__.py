"""A discrete-event simulator of a rollout cluster, driven by the real `Scheduler`.

The scheduler's defaults (`kv_mode`, `admission`, `tail_kv_fraction`, `SPECULATIVE_MAX_BATCH`)
are argued from its numbers (benchmarks/scheduler/bench.py part (b)), so it is typed and tested
like the product. Its modules, each importing only the ones above it:
- `workload`: the step cost model (`Cost`), the modeled GPUs, simulated trajectories
  (`SimTraj`) and the heavy-tailed workload;
- `bounds`: the work, critical-path, batching and full-load bounds and the step floor;
- `engine`: one simulated vLLM-like engine (continuous batching, KV, preemption, prefix cache);
- `result`: what a run reports (`SimResult`), per-tenth profiles, Spearman;
- `hindsight`: what perfect length knowledge buys (reference runs, not policies);
- `model`: `simulate`, the discrete-event run of engines, tools and the scheduler;
- `partial_rollout`: partial rollout, steps back to back;
- `policies`: the benchmark's policy rows and the flags that make their `SchedulerConfig`.
It prints nothing and reads no files. Tested in tests/unit/test_scheduler_sim.py.
"""
