"""Tool-health gate: refuse to train on a step whose tool calls failed for infrastructure reasons.

A `sandbox_error` status means the code never ran properly (daemon down, connection refused,
retries exhausted), not that the model wrote bad code. Left alone, such a step teaches the policy
that calling the tool is useless (and RoC would penalise the successes that hit it). So after each
rollout the trainer checks the share of `sandbox_error` among the step's tool calls and stops
when it is above a threshold; below it, the trajectories that met one leave their groups before
RoC (rstar2cli/rl/selection.py) and the step trains on the rest.

This module only decides: `check_tool_health` returns a `ToolHealth`; the caller raises
`rstar2cli.errors.UserError(health.message(endpoints))` so the message names the sandbox URLs it
knows. Pure function. Tested in tests/unit/test_health.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SANDBOX_ERROR = "sandbox_error"


@dataclass(frozen=True)
class ToolHealth:
    """Decision for one step: `ok` is False when the sandbox_error share is above the threshold."""

    ok: bool
    num_calls: int
    num_sandbox_errors: int
    sandbox_error_share: float  # 0.0 when the step made no tool call
    max_sandbox_error_share: float

    def message(self, endpoints: Sequence[str]) -> str:
        """One line for a UserError, naming the endpoints that failed."""
        where = ", ".join(endpoints) if endpoints else "the in-process sandbox"
        return (
            f"tool health gate: {self.num_sandbox_errors}/{self.num_calls} tool calls "
            f"({self.sandbox_error_share:.1%}) ended in sandbox_error, above the limit of "
            f"{self.max_sandbox_error_share:.1%}; check the sandbox at {where} "
            f"(the step was not trained on)"
        )


def check_tool_health(statuses: Iterable[str], max_sandbox_error_share: float) -> ToolHealth:
    """Share of `sandbox_error` among a step's tool-call statuses, against the threshold.

    Passes while share <= max_sandbox_error_share ("passes a threshold" means strictly above it),
    so 0.0 tolerates no infrastructure failure and 1.0 disables the gate. A step with no tool
    call is healthy.
    """
    if not 0.0 <= max_sandbox_error_share <= 1.0:
        raise ValueError(
            f"max_sandbox_error_share must be in [0, 1], got {max_sandbox_error_share}"
        )
    num_calls = 0
    num_sandbox_errors = 0
    for status in statuses:
        num_calls += 1
        num_sandbox_errors += status == SANDBOX_ERROR
    share = num_sandbox_errors / num_calls if num_calls else 0.0
    return ToolHealth(
        ok=share <= max_sandbox_error_share,
        num_calls=num_calls,
        num_sandbox_errors=num_sandbox_errors,
        sandbox_error_share=share,
        max_sandbox_error_share=max_sandbox_error_share,
    )
