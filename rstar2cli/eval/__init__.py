"""Evaluation: the known benchmark sets and how they load (benchmarks.py). The `eval` command
composes these with the rollout core, the grader and `rstar2cli.reward.metrics`."""
