"""The examples and every documented command line: scripts parse, and each `rstar2` line runs as
written as far as the command line goes.

Where command lines are found: examples/ (scripts, their comments, the systemd unit's ExecStart),
README.md and docs/**/*.md (fenced code blocks, and inline code that starts with a command), the
recipe headers (recipes/**/*.yaml comments) and recipes/paper_pipeline.sh. Backslash
continuations are joined; shell variables, `...` and `<placeholders>` stand for any word, and a
usage synopsis (`rstar2 eval [OPTIONS]`) is no command line.
Each `rstar2` line is checked against the real Typer app: the command exists, every option is
one of its options (the set is built from the app, so a renamed option fails here), options
that take a value have one, and each `--set KEY=...` of rl-stage and sft-coldstart names a key of
the recipe schema. `rstar2-sandboxd` lines are checked against the daemon's own argparse parser.
A daemon bound beyond loopback must carry --token-file, and a command sending tool calls to a
daemon that is not on loopback must carry --sandbox-token-file (or set $RSTAR2_SANDBOX_TOKEN).

recipes/paper_pipeline.sh is also run with a recording `rstar2` and `torchrun` first on PATH:
the commands it would run are checked the same way, and every one that gets --sandbox gets the
token file too. Nothing here starts an engine, a daemon or Ray.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import pytest
import typer
from pydantic import BaseModel

from rstar2cli.cli import app

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SCRIPTS = sorted([*EXAMPLES.glob("*.sh"), *EXAMPLES.glob("*.sbatch")])
PROGRAMS = ("rstar2", "rstar2-sandboxd")
LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")
LAUNCHERS = ("exec", "srun", "torchrun", "sudo", "nohup", "env", "time", "timeout", "uv")


# ---------------------------------------------------------------------------------------------
# What a command accepts, from the real app and the real daemon parser


@dataclass
class Spec:
    takes_value: dict[str, bool]  # every option spelling -> whether it takes a value
    num_arguments: int = 0
    required: set[str] = field(default_factory=set)  # options a complete line must carry
    recipe: type[BaseModel] | None = None  # what --set keys are checked against


def _click_spec(command: Any) -> Spec:
    spec = Spec(takes_value={"--help": False})
    for param in command.params:
        if param.param_type_name == "argument":
            spec.num_arguments += 1
            continue
        names = [*param.opts, *param.secondary_opts]
        for name in names:
            spec.takes_value[name] = not (param.is_flag or param.count)
        if param.required:
            spec.required.add(param.opts[0])
    return spec


def _specs() -> tuple[dict[str, Spec], Spec, Spec]:
    """(rstar2 commands, the root's options, rstar2-sandboxd)."""
    from rstar2cli.rl.stage_recipe import RlRecipe
    from rstar2cli.sft.coldstart_recipe import SftRecipe
    from sandboxd.server import build_parser

    root = typer.main.get_command(app)
    commands = {name: _click_spec(cmd) for name, cmd in root.commands.items()}  # type: ignore[attr-defined]
    commands["rl-stage"].recipe = RlRecipe
    commands["sft-coldstart"].recipe = SftRecipe
    daemon = Spec(takes_value={})
    for action in build_parser()._actions:
        for name in action.option_strings:
            daemon.takes_value[name] = action.nargs != 0
    return commands, _click_spec(root), daemon


COMMANDS, ROOT, DAEMON = _specs()


# ---------------------------------------------------------------------------------------------
# Finding command lines


@dataclass
class Found:
    where: str  # file:line
    words: list[str]  # from the program name to the end of its command
    complete: bool  # a code line (not inline code in prose): required options are checked
    env: str = ""  # the line's words before the program (assignments, launchers)


def _logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Backslash continuations joined; each result keeps its first line's number."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, text in lines:
        if pending is not None:
            number, text = pending[0], pending[1] + " " + text.lstrip()
        if text.rstrip().endswith("\\"):
            pending = (number, text.rstrip()[:-1])
            continue
        pending = None
        out.append((number, text))
    if pending is not None:
        out.append(pending)
    return out


def _is_program(word: str) -> bool:
    return word in PROGRAMS or word.endswith(tuple(f"/{p}" for p in PROGRAMS))


def _commands_in(line: str, where: str, complete: bool) -> list[Found]:
    if not re.search(r"(^|[\s/`(])rstar2(-sandboxd)?(\s|$)", line):
        return []
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True  # words split at whitespace and at ();<>|& only
    lexer.commenters = "#"
    try:
        words = list(lexer)
    except ValueError as exc:  # unbalanced quotes
        return [Found(where, ["<unparsable>", str(exc)], complete)]
    found, start = [], 0
    for end in [*(i for i, w in enumerate(words) if set(w) <= set("();<>|&")), len(words)]:
        segment, start = words[start:end], end + 1
        env = []
        while segment and re.fullmatch(r"[A-Za-z_]\w*=.*", segment[0]):  # X=1 rstar2 ...
            env, segment = [*env, segment[0]], segment[1:]
        at = _program_at(segment)
        if at is not None:
            found.append(Found(where, segment[at:], complete, env=" ".join(env + segment[:at])))
    return found


def _program_at(segment: list[str]) -> int | None:
    """Where the program starts in one simple command: its first word, or the first program
    word after a launcher (`srun ...`, `torchrun ... --no-python`, `$SFT_LAUNCH`, `exec`)."""
    if not segment:
        return None
    if _is_program(segment[0]):
        return 0
    if segment[0] in LAUNCHERS or segment[0].startswith("$"):
        return next((i for i, w in enumerate(segment) if _is_program(w)), None)
    return None


def shell_commands(text: str, path: str) -> list[Found]:
    """Commands in a shell script's code and in its comments."""
    lines = list(enumerate(text.splitlines(), start=1))
    code = [(n, t) for n, t in lines if not t.lstrip().startswith("#")]
    found = [
        cmd
        for n, line in _logical_lines(code)
        for cmd in _commands_in(line, f"{path}:{n}", complete=True)
    ]
    return found + comment_commands(lines, path)


def comment_commands(lines: list[tuple[int, str]], path: str) -> list[Found]:
    """In comments: indented lines (`#   rstar2 ...`, code) and `rstar2 ...` inline code."""
    comments = [(n, t.lstrip()[1:]) for n, t in lines if t.lstrip().startswith("#")]
    code = [(n, t) for n, t in comments if t.startswith("   ")]
    found = [
        cmd
        for n, line in _logical_lines(code)
        for cmd in _commands_in(line, f"{path}:{n}", complete=True)
    ]
    return found + inline_commands(comments, path)


def inline_commands(lines: list[tuple[int, str]], path: str) -> list[Found]:
    """`rstar2 ...` spans of inline code, which may run over a line break."""
    text = "\n".join(t for _, t in lines)
    starts = [n for n, t in lines for _ in range(len(t) + 1)]  # character -> line number
    found = []
    for m in re.finditer(r"`((?:rstar2|rstar2-sandboxd) [^`]*)`", text):
        where = f"{path}:{starts[m.start()]}"
        found += _commands_in(m.group(1).replace("\n", " "), where, complete=False)
    return found


def markdown_commands(text: str, path: str) -> list[Found]:
    """Commands in fenced code blocks (a leading `$ ` prompt dropped) and in inline code."""
    code, prose, fenced = [], [], False
    for n, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            code.append((n, re.sub(r"^\s*\$ ", "", line)))
        else:
            prose.append((n, line))
    found = [
        cmd
        for n, line in _logical_lines(code)
        for cmd in _commands_in(line, f"{path}:{n}", complete=True)
    ]
    return found + inline_commands(prose, path)


def unit_commands(text: str, path: str) -> list[Found]:
    """A systemd unit: its Exec*= lines, and its comments."""
    lines = list(enumerate(text.splitlines(), start=1))
    found = []
    for n, line in lines:
        if m := re.match(r"\s*Exec\w*=[-@+!:]*(.*)", line):
            found += _commands_in(m.group(1), f"{path}:{n}", complete=True)
    return found + comment_commands(lines, path)


def documented_commands() -> list[Found]:
    found: list[Found] = []
    for path in sorted(EXAMPLES.rglob("*")):
        rel, text = str(path.relative_to(REPO)), path.read_text() if path.is_file() else ""
        if path.suffix in (".sh", ".sbatch"):
            found += shell_commands(text, rel)
        elif path.suffix == ".service":
            found += unit_commands(text, rel)
        elif path.suffix == ".md":
            found += markdown_commands(text, rel)
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for path in (p for p in docs if p.is_file()):
        found += markdown_commands(path.read_text(), str(path.relative_to(REPO)))
    for path in sorted((REPO / "recipes").rglob("*.yaml")):
        lines = list(enumerate(path.read_text().splitlines(), start=1))
        found += comment_commands(lines, str(path.relative_to(REPO)))
    pipeline = REPO / "recipes" / "paper_pipeline.sh"
    found += shell_commands(pipeline.read_text(), str(pipeline.relative_to(REPO)))
    return found


# ---------------------------------------------------------------------------------------------
# Checking one command line


def _is_placeholder(word: str) -> bool:
    return "$" in word or word == "..." or (word.startswith("<") and word.endswith(">"))


def _nearest(word: str, choices: list[str]) -> str:
    match = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {match[0]}?)" if match else ""


def check(found: Found) -> list[str]:
    """Every problem of one command line, each as 'file:line: problem'."""
    words, program = found.words[1:], Path(found.words[0]).name
    if program == "<unparsable>":
        return [f"{found.where}: not a shell line: {words[0]}"]
    if any(w.startswith("[") for w in words):  # a usage synopsis: "rstar2 eval [OPTIONS]"
        return []
    if program == "rstar2-sandboxd":
        problems, options = _check_options(DAEMON, words, complete=False)
        problems += _token_problems("rstar2-sandboxd", options, found.env)
        return [f"{found.where}: rstar2-sandboxd: {p}" for p in problems]
    while words and words[0].startswith("-") and not _is_placeholder(words[0]):
        if words[0] not in ROOT.takes_value:
            return [f"{found.where}: rstar2 has no option {words[0]}"]
        words = words[1:]
    if not words or _is_placeholder(words[0]) or words[0].isupper():  # rstar2 COMMAND --help
        return []
    name, words = words[0], words[1:]
    if name not in COMMANDS:
        return [f"{found.where}: no command rstar2 {name}{_nearest(name, list(COMMANDS))}"]
    problems, options = _check_options(COMMANDS[name], words, complete=found.complete)
    problems += _token_problems(name, options, found.env)
    return [f"{found.where}: rstar2 {name}: {p}" for p in problems]


def _check_options(spec: Spec, words: list[str], complete: bool) -> tuple[list[str], dict]:
    """(problems, {option: [values]}) of one command's words."""
    problems: list[str] = []
    options: dict[str, list[str]] = {}
    positionals, open_ended, i = 0, False, 0
    while i < len(words):
        word = words[i]
        i += 1
        if _is_placeholder(word):
            open_ended = True
            continue
        if not word.startswith("-") or word == "-":
            positionals += 1
            continue
        name, eq, value = word.partition("=")
        if name not in spec.takes_value:
            problems.append(f"no option {name}{_nearest(name, list(spec.takes_value))}")
            if not eq and i < len(words) and not words[i].startswith("-"):
                i += 1  # its value, most likely
            continue
        if spec.takes_value[name] and not eq:
            if i >= len(words):  # inline code may name an option without its value
                problems.append(f"{name} needs a value" if complete else "")
                continue
            value, i = words[i], i + 1
        elif eq and not spec.takes_value[name]:
            problems.append(f"{name} is a switch and takes no value")
        options.setdefault(name, []).append(value)
    if positionals > spec.num_arguments:
        problems.append(f"{positionals} arguments where it takes {spec.num_arguments}")
    if complete and not open_ended:
        problems += [f"{name} is required" for name in sorted(spec.required - set(options))]
        if positionals < spec.num_arguments:
            problems.append(f"{spec.num_arguments - positionals} argument(s) missing")
    if spec.recipe is not None:
        problems += [_set_problem(spec.recipe, v) for v in options.get("--set", [])]
    return [p for p in problems if p], options


def _set_problem(schema: type[BaseModel], item: str) -> str:
    key = item.split("=", 1)[0]
    if "$" in key or "=" not in item:
        return "" if "$" in key else f"--set {item!r} is not KEY=VALUE"
    model: Any = schema
    for depth, part in enumerate(key.split(".")):
        fields = getattr(model, "model_fields", None)
        if fields is None:  # a mapping or list value: its inside is not a key
            return ""
        if part not in fields:
            return f"--set {key}: the recipe has no key {part}{_nearest(part, list(fields))}"
        model = _section(fields[part].annotation) if depth < len(key.split(".")) - 1 else None
    return ""


def _section(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _section(arg)) is not None:
            return found
    return None


def _token_problems(name: str, options: dict[str, list[str]], env: str) -> list[str]:
    """A daemon beyond loopback needs its token; so does a client of such a daemon."""
    if name in ("serve-sandbox", "rstar2-sandboxd"):
        host = (options.get("--host") or ["127.0.0.1"])[-1]
        if host not in LOOPBACK and not {"--token-file", "--insecure-no-auth"} & set(options):
            return [f"--host {host} without --token-file: the daemon refuses to start"]
        return []
    hosts = [re.sub(r"^\w+://([^/:]+|\[[^]]*\]).*", r"\1", u) for u in options.get("--sandbox", [])]
    remote = [h for h in hosts if h not in LOOPBACK and "$" not in h]
    token = "--sandbox-token-file" in options or "RSTAR2_SANDBOX_TOKEN" in env
    if remote and not token:
        return [f"--sandbox {remote[0]} without --sandbox-token-file: the daemon answers 401"]
    return []


# ---------------------------------------------------------------------------------------------
# The tests


@pytest.mark.parametrize("script", [*SCRIPTS, REPO / "recipes" / "paper_pipeline.sh"], ids=str)
def test_each_script_parses(script):
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def test_the_examples_are_there():
    names = {p.name for p in EXAMPLES.iterdir()}
    assert {
        "slurm_paper_pipeline.sbatch",
        "own_data_smollm2.sh",
        "mi300x_stage1.sh",
        "rstar2-sandboxd.service",
    } <= names


def test_every_documented_command_line_names_real_commands_and_options():
    found = documented_commands()
    where = {f.where.split(":")[0] for f in found}
    # the scan reaches every kind of source (a broken extractor would find nothing and pass)
    assert {
        "examples/slurm_paper_pipeline.sbatch",
        "examples/own_data_smollm2.sh",
        "examples/mi300x_stage1.sh",
        "examples/rstar2-sandboxd.service",
        "recipes/stage1_8k.yaml",
        "recipes/paper_pipeline.sh",
    } <= where
    assert [problem for f in found for problem in check(f)] == []


def test_every_daemon_launch_line_carries_a_token():
    daemons = [
        f
        for f in documented_commands()
        if f.where.startswith(("examples/", "recipes/"))
        and (f.words[0].endswith("rstar2-sandboxd") or f.words[1:2] == ["serve-sandbox"])
    ]
    assert len(daemons) >= 6  # the three stage headers, the pipeline, three examples
    assert [f.where for f in daemons if "--token-file" not in f.words] == []


def test_the_checker_finds_what_is_wrong():
    text = "\n".join(
        [
            "rstar2 rl-stage --recipe r.yaml --out o --set train.lrr=1 --init-form x \\",
            "  --sandbox http://cpu1:8080",
            "rstar2 trian --out x",
            "rstar2 serve-sandbox --host 0.0.0.0 --port 8080",
            "rstar2-sandboxd --host 0.0.0.0 --workerz 2 --token-file t",
            "rstar2 check-model",
            "rstar2 eval --model m --benchmark aime24 --out e --samples",
            'rstar2 rollout --model "$M" --data d --out o $MORE_OPTIONS  # fine',
        ]
    )
    problems = [p for f in shell_commands(text, "t.sh") for p in check(f)]
    assert problems == [
        "t.sh:1: rstar2 rl-stage: no option --init-form (did you mean --init-from?)",
        "t.sh:1: rstar2 rl-stage: --set train.lrr: the recipe has no key lrr (did you mean lr?)",
        "t.sh:1: rstar2 rl-stage: --sandbox cpu1 without --sandbox-token-file: the daemon "
        "answers 401",
        "t.sh:3: no command rstar2 trian (did you mean train?)"
        if "train" in COMMANDS
        else "t.sh:3: no command rstar2 trian",
        "t.sh:4: rstar2 serve-sandbox: --host 0.0.0.0 without --token-file: the daemon refuses "
        "to start",
        "t.sh:5: rstar2-sandboxd: no option --workerz (did you mean --workers?)",
        "t.sh:6: rstar2 check-model: 1 argument(s) missing",
        "t.sh:7: rstar2 eval: --samples needs a value",
    ]
    inline = "# run `rstar2 eval --modle m`, or\n# `rstar2 filter-hard --model m\n# --samplez 8`"
    lines = list(enumerate(inline.splitlines(), start=1))
    assert [p for f in comment_commands(lines, "r.yaml") for p in check(f)] == [
        "r.yaml:1: rstar2 eval: no option --modle (did you mean --model?)",
        "r.yaml:2: rstar2 filter-hard: no option --samplez (did you mean --samples?)",
    ]


def test_the_pipeline_passes_the_token_with_every_sandbox(tmp_path):
    """paper_pipeline.sh with `rstar2` and `torchrun` that only record their arguments."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    recorder = f'#!{sys.executable}\nimport sys, json\nopen({str(log)!r}, "a").write(json.dumps(sys.argv) + "\\n")\n'
    for name in ("rstar2", "torchrun"):
        (bin_dir / name).write_text(recorder)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "sandbox.token").write_text("x" * 32)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "RL_SOURCE": "my-org/math",
        "WORK": str(tmp_path / "work"),
        "SANDBOX": "--sandbox http://cpu1:8080 --sandbox http://cpu2:8080",
        "SANDBOX_TOKEN_FILE": "sandbox.token",  # relative to where the script starts
        "RAY": "--ray-address head:6379",
    }
    res = subprocess.run(
        ["bash", str(REPO / "recipes" / "paper_pipeline.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    # each call from its rstar2 word on (the SFT's comes through torchrun)
    rstar2 = [c[i:] for c in calls for i, w in enumerate(c) if w.endswith("rstar2")]
    assert [c[1] for c in rstar2] == [
        "prepare-data",
        "sft-coldstart",
        "rl-stage",
        "rl-stage",
        "filter-hard",
        "rl-stage",
        "eval",
    ]
    token = str(tmp_path / "sandbox.token")
    for argv in rstar2:
        assert check(Found("pipeline", ["rstar2", *argv[1:]], complete=True)) == []
        if "--sandbox" in argv:
            assert argv[argv.index("--sandbox-token-file") + 1] == token, argv
    assert sum("--sandbox" in argv for argv in rstar2) == 5


def test_every_named_benchmark_module_exists():
    """`python -m benchmarks.X` and `benchmarks/X.py` in the docs, recipes, examples and code
    name modules that exist (they moved once: benchmarks/scheduler_*.py -> benchmarks/scheduler/)."""
    sources = [
        REPO / "README.md",
        *(REPO / "docs").rglob("*.md"),
        *(REPO / "recipes").rglob("*"),
        *EXAMPLES.rglob("*"),
        *(REPO / "rstar2cli").rglob("*.py"),
        *(REPO / "benchmarks").rglob("*.py"),
        REPO / "Makefile",
    ]
    missing = []
    for path in (p for p in sources if p.is_file()):
        text = path.read_text()
        for m in re.finditer(r"python -m (benchmarks(?:\.\w+)+)|\b(benchmarks(?:/\w+)+\.py)", text):
            module = m.group(1)
            file = Path(m.group(2)) if m.group(2) else Path(*module.split(".")).with_suffix(".py")
            if not (REPO / file).is_file():
                line = text.count("\n", 0, m.start()) + 1
                missing.append(f"{path.relative_to(REPO)}:{line}: {m.group(0)}")
    assert missing == []
