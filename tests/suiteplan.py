"""How `make test` spreads the suite over two pytest-xdist workers (`--dist loadgroup`).

- Groups: the tests of one module form one group, so a module's fixtures (an engine, a daemon, a
  primed model) are built once, on one worker. Every test marked `ray` (it starts a local Ray
  instance or cluster) joins the one group "ray": two Ray instances on a 2-core machine would
  only slow each other, and a test of that group never meets another's instance.
- Order: groups start longest first, so the long ones overlap and the short ones fill the gaps
  at the end. A group's length is the sum of its tests' seconds in tests/durations.json (written
  from a run's junit XML by `make test-durations`); a test not in that file counts its tier's
  default, so a new test needs no edit here.

What it does not do: decide which tests run (the markers and paths do) or time anything.
Tested in tests/unit/test_suiteplan.py; the hook is tests/conftest.py's.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

RAY_GROUP = "ray"
DURATIONS = Path(__file__).resolve().parent / "durations.json"
# seconds a test not yet in the durations file counts, by tier (the folder below tests/)
TIER_DEFAULT_S = {"integration": 60.0, "sandboxd": 5.0, "cli": 3.0, "unit": 0.5, "gpu": 0.5}

T = TypeVar("T")


def group_of(nodeid: str, uses_ray: bool) -> str:
    """The xdist group of a test: "ray", or its module's path."""
    return RAY_GROUP if uses_ray else nodeid.split("::", 1)[0]


def expected_s(nodeid: str, durations: dict[str, float]) -> float:
    """A test's seconds from the last recorded run, or its tier's default."""
    if nodeid in durations:
        return durations[nodeid]
    parts = nodeid.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "unit"
    return TIER_DEFAULT_S.get(tier, 1.0)


def longest_first(
    items: Iterable[T], key: Callable[[T], tuple[str, str]], durations: dict[str, float]
) -> list[T]:
    """`items` reordered so that whole groups come longest first; inside a group the order stays.

    `key(item)` gives (nodeid, group). Ties keep the order the groups were collected in.
    """
    items = list(items)
    total: dict[str, float] = {}
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        nodeid, group = key(item)
        total[group] = total.get(group, 0.0) + expected_s(nodeid, durations)
        first_seen.setdefault(group, i)
    return sorted(items, key=lambda it: (-total[key(it)[1]], first_seen[key(it)[1]]))


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    """nodeid -> seconds; empty when the file is absent."""
    if not path.is_file():
        return {}
    return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}


def durations_from_junit(junit_xml: Path) -> dict[str, float]:
    """nodeid -> seconds (setup, call and teardown together) from pytest's junit XML."""
    seconds: dict[str, float] = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = case.get("name", "")
        if name.rfind("@") > name.rfind("]"):  # xdist's "@group" suffix (loadgroup)
            name = name[: name.rfind("@")]
        nodeid = f"{module}.py::{name}"
        seconds[nodeid] = seconds.get(nodeid, 0.0) + float(case.get("time", 0.0))
    return seconds


def main() -> None:
    """`python tests/suiteplan.py JUNIT_XML`: write tests/durations.json from a run's report."""
    import sys

    if len(sys.argv) != 2:
        raise SystemExit("usage: python tests/suiteplan.py JUNIT_XML")
    seconds = durations_from_junit(Path(sys.argv[1]))
    rounded = {k: round(v, 1) for k, v in sorted(seconds.items())}
    DURATIONS.write_text(json.dumps(rounded, indent=0) + "\n")
    print(f"wrote {DURATIONS} ({len(rounded)} tests, {sum(rounded.values()):.0f} s)")


if __name__ == "__main__":
    main()
