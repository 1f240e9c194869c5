"""tests/suiteplan.py: the groups and the order `make test` hands to its two xdist workers."""

from __future__ import annotations

import suiteplan


def test_a_module_is_a_group_and_every_ray_test_shares_one():
    assert suiteplan.group_of("tests/unit/test_x.py::test_a[1]", uses_ray=False) == (
        "tests/unit/test_x.py"
    )
    assert suiteplan.group_of("tests/integration/test_y.py::test_b", uses_ray=True) == "ray"


def test_groups_come_longest_first_and_keep_their_own_order():
    items = [
        ("tests/unit/test_a.py::t1", "tests/unit/test_a.py"),
        ("tests/integration/test_b.py::t1", "tests/integration/test_b.py"),
        ("tests/integration/test_r.py::t1", "ray"),
        ("tests/unit/test_a.py::t2", "tests/unit/test_a.py"),
        ("tests/integration/test_b.py::t2", "tests/integration/test_b.py"),
        ("tests/integration/test_s.py::t1", "ray"),
    ]
    durations = {
        "tests/unit/test_a.py::t1": 1.0,
        "tests/unit/test_a.py::t2": 2.0,  # group a: 3 s
        "tests/integration/test_b.py::t1": 10.0,  # group b: 10 s + t2's tier default (60 s)
        "tests/integration/test_r.py::t1": 40.0,
        "tests/integration/test_s.py::t1": 35.0,  # ray: 75 s
    }
    ordered = suiteplan.longest_first(items, key=lambda it: it, durations=durations)
    assert [nodeid for nodeid, _ in ordered] == [
        "tests/integration/test_r.py::t1",
        "tests/integration/test_s.py::t1",
        "tests/integration/test_b.py::t1",
        "tests/integration/test_b.py::t2",
        "tests/unit/test_a.py::t1",
        "tests/unit/test_a.py::t2",
    ]


def test_durations_come_from_junit_without_xdists_group_suffix(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.unit.test_a" name="t1@tests/unit/test_a.py" time="1.25"/>'
        '<testcase classname="tests.cli.test_b" name="t2[x@y]" time="3.5"/>'
        "</testsuite></testsuites>"
    )
    assert suiteplan.durations_from_junit(junit) == {
        "tests/unit/test_a.py::t1": 1.25,
        "tests/cli/test_b.py::t2[x@y]": 3.5,
    }
    assert suiteplan.expected_s("tests/cli/test_new.py::t", {}) == suiteplan.TIER_DEFAULT_S["cli"]
