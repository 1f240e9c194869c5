"""GRPO-RoC: the algorithm cores of the RL stages.

- `roc`: penalties (p_err, p_format), equal-reward group dropping, Resample-on-Correct
  down-sampling from 2G to G (`paper` and `release` modes); numpy only.
- `advantages`: group-normalised advantages over the kept rollouts; torch.
- `loss`: token-level PPO clip loss (asymmetric clip), optional KL / entropy terms, metrics; torch.
- `health`: the tool-health gate on `sandbox_error` shares; pure Python.

Nothing is imported here, so `import rstar2cli.rl.roc` never pulls in torch.
"""
