"""Tool-health gate on the sandbox_error share of a step."""

from __future__ import annotations

import pytest

from rstar2cli.rl.health import check_tool_health


def test_only_sandbox_error_counts():
    # 1 sandbox_error of 4; "error" and "timeout" are the model's failures, not infrastructure.
    health = check_tool_health(["ok", "sandbox_error", "error", "timeout"], 0.2)
    assert health.num_calls == 4 and health.num_sandbox_errors == 1
    assert health.sandbox_error_share == 0.25
    assert not health.ok  # 0.25 > 0.2


def test_share_equal_to_threshold_passes():
    assert check_tool_health(["ok", "sandbox_error", "ok", "ok"], 0.25).ok


def test_zero_threshold_tolerates_no_sandbox_error_and_one_disables():
    assert check_tool_health(["ok"] * 99, 0.0).ok
    assert not check_tool_health(["ok"] * 99 + ["sandbox_error"], 0.0).ok
    assert check_tool_health(["sandbox_error"] * 3, 1.0).ok


def test_step_without_tool_calls_is_healthy():
    health = check_tool_health(iter([]), 0.1)
    assert health.ok and health.num_calls == 0 and health.sandbox_error_share == 0.0


def test_message_names_endpoints_and_counts():
    health = check_tool_health(["sandbox_error", "sandbox_error", "ok"], 0.5)
    msg = health.message(["http://10.0.0.5:8080", "http://10.0.0.6:8080"])
    assert "2/3" in msg and "66.7%" in msg and "50.0%" in msg
    assert "http://10.0.0.5:8080, http://10.0.0.6:8080" in msg
    assert "\n" not in msg
    assert "in-process" in health.message([])


def test_bad_threshold():
    with pytest.raises(ValueError, match="max_sandbox_error_share"):
        check_tool_health(["ok"], 1.5)
