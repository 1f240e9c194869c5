"""Evaluation: the known benchmark sets and how they load (benchmarks.py), an `--out` folder's
results.jsonl and summary.json (results.py), and summaries, tables and the plot (eval_report.py).
The `eval` command composes these with `rstar2cli.preflight.EvalPlan`, the rollout core, the
grader and `rstar2cli.reward.metrics`."""
