"""Benchmarks: scripts that run the project and its baseline side by side and print ratios.

Each script runs from the repository root as `python -m benchmarks.<name>` (`--help` lists its
flags); `make bench` runs the main ones. `benchmarks/scheduler/` is the rollout scheduler's
benchmark (`python -m benchmarks.scheduler.bench`), and `benchmarks/sim/` is the cluster simulator
it runs, typed and tested like product code (tests/unit/test_scheduler_sim.py). None of this is in
the wheel: pyproject packages rstar2cli and sandboxd only, and no product module imports a
benchmark. Tests never assert on wall-clock time.
"""
