"""The layout's two rules that code review alone would let slip (CONTRIBUTING.md, Layout):
the scheduler is a leaf (stdlib only), and imports run one way between the tree's packages.

Reads the source with `ast` through tools/layout_stats.py, the script the layout numbers come
from; nothing of the project is imported or run.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_scheduler_imports_only_the_stdlib_and_itself():
    outside = []
    for path in sorted((REPO / "rstar2cli" / "scheduler").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if name.startswith("rstar2cli.scheduler") or top in sys.stdlib_module_names:
                    continue
                if top == "__future__":
                    continue
                outside.append(f"{path.name}:{node.lineno} {name}")
    assert outside == []


def test_no_package_imports_one_that_imports_it_back():
    report = json.loads(
        subprocess.run(
            [sys.executable, str(REPO / "tools" / "layout_stats.py"), "--json"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
    )
    assert report["folder_cycles"] == []
    assert report["upward_imports"] == []
    assert report["fmt_skip"] == 0
