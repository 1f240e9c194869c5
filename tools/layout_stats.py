"""Layout numbers for the source tree: import cycles, upward imports, long modules and functions.

`python tools/layout_stats.py [--json]` reads rstar2cli/, sandboxd/ and benchmarks/ with `ast`
(nothing is imported or run) and prints:
- cycles: groups of files that import each other, directly or through others (imports inside
  functions and under TYPE_CHECKING count: they still tie the files together);
- upward imports: file imports that close a cycle between two folders (top-level packages of the
  tree, or single modules), e.g. agent/ -> scheduler/ while scheduler/ imports agent/;
- modules over 400 lines, functions over 60 lines (decorators included);
- calls passing five or more positional arguments, and `# fmt: skip` markers.
It does not judge names or docstrings. Used for the layout table in CONTRIBUTING.md.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

ROOTS = ("rstar2cli", "sandboxd", "benchmarks")
MODULE_LINES = 400
FUNCTION_LINES = 60
POSITIONAL_ARGS = 5


def module_name(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.Module, name: str, is_package: bool) -> set[str]:
    """Every module this file names in an import statement, made absolute."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; returns the components with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def folder_of(module: str) -> str:
    """The unit an upward import is judged between: rstar2cli.X or sandboxd or benchmarks.X."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] in ("rstar2cli", "benchmarks") else parts[0]


def positional_calls(tree: ast.Module) -> int:
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and sum(not isinstance(arg, ast.Starred) for arg in node.args) >= POSITIONAL_ARGS
    )


def long_functions(tree: ast.Module, path: Path) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            span = (node.end_lineno or node.lineno) - first + 1
            if span > FUNCTION_LINES:
                out.append(f"{path}:{node.lineno} {node.name} {span}")
    return out


def collect(repo: Path) -> dict:
    files = sorted(p for root in ROOTS for p in (repo / root).rglob("*.py"))
    trees: dict[str, ast.Module] = {}
    paths: dict[str, Path] = {}
    texts: dict[str, str] = {}
    for path in files:
        rel = path.relative_to(repo)
        name = module_name(rel)
        texts[name] = path.read_text()
        trees[name] = ast.parse(texts[name], filename=str(rel))
        paths[name] = rel
    graph = {
        name: {
            target
            for target in imported_modules(tree, name, paths[name].name == "__init__.py")
            if target in trees and target != name
        }
        for name, tree in trees.items()
    }
    cycles = strongly_connected(graph)
    folders: dict[str, set[str]] = {}
    for name, targets in graph.items():
        for target in targets:
            if folder_of(target) != folder_of(name):
                folders.setdefault(folder_of(name), set()).add(folder_of(target))
    for name in graph:
        folders.setdefault(folder_of(name), set())
    folder_cycles = strongly_connected(folders)
    in_cycle = {member: i for i, group in enumerate(folder_cycles) for member in group}
    edges: dict[tuple[str, str], list[str]] = {}
    for name, targets in graph.items():
        for target in targets:
            a, b = folder_of(name), folder_of(target)
            if a != b and in_cycle.get(a, -1) == in_cycle.get(b, -2):
                edges.setdefault((a, b), []).append(f"{paths[name]} -> {target}")
    # Of two folders that import each other, the direction with fewer file imports is the one
    # that runs against the grain (the lower folder reaching up); a tie reports both.
    upward = sorted(
        line
        for (a, b), lines in edges.items()
        if len(lines) <= len(edges.get((b, a), lines))
        for line in lines
    )
    lengths = {name: len(text.splitlines()) for name, text in texts.items()}
    long_modules = sorted(f"{paths[name]} {n}" for name, n in lengths.items() if n > MODULE_LINES)
    functions = [line for name, tree in trees.items() for line in long_functions(tree, paths[name])]
    positional = sum(positional_calls(tree) for tree in trees.values())
    skips = sum(text.count("# fmt: skip") for text in texts.values())
    return {
        "cycles": [[str(paths[m]) for m in group] for group in cycles],
        "folder_cycles": folder_cycles,
        "upward_imports": upward,
        "modules_over_400": long_modules,
        "functions_over_60": functions,
        "positional_calls_5plus": positional,
        "fmt_skip": skips,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON")
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    report = collect(args.repo)
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for key, value in report.items():
        if isinstance(value, list):
            print(f"{key}: {len(value)}")
            for item in value:
                print(f"  {item}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
