"""Recipe loading: a whole YAML file, `--set key=value` overrides, validation with every problem listed.

Schemas live next to the code that uses them (sft, rl, eval) as pydantic models with
`extra="forbid"`; this module only reads, overrides, validates and writes the resolved copy, and
compares it with the copy an earlier run left in its folder (to refuse resuming with another recipe).
Each problem names where its key was given (the file's line, or the `--set`), and an unknown key
gets the nearest key of its section (difflib).
It deliberately has no inheritance or interpolation: a recipe is the whole truth.
Tested in tests/unit/test_recipe.py.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from rstar2cli.errors import UserError, first_line

M = TypeVar("M", bound=BaseModel)


class RecipeModel(BaseModel):
    """Base config for recipe sections: unknown keys are errors, values are checked on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def parse_sets(sets: list[str]) -> dict[str, Any]:
    """Turn ["train.lr=1.0e-6", "seed=3"] into a nested dict; values are parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in sets:
        if "=" not in item:
            raise UserError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise UserError(f"--set has an empty key: {item!r}")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"--set {key}: {part} is both a value and a section")
        try:
            node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise UserError(
                f"--set {key.strip()}: {raw!r} is not a valid YAML value ({yaml_problem(exc)})"
            ) from None
    return out


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong and where (line, column; 1-based)."""
    problem = getattr(exc, "problem", None) or first_line(exc)
    mark = getattr(exc, "problem_mark", None)
    return (
        problem if mark is None else f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    )


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = _merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def format_validation_error(
    source: str,
    exc: ValidationError,
    *,
    schema: type[BaseModel] | None = None,
    origins: dict[tuple[str, ...], str] | None = None,
) -> str:
    """Every problem on its own line. `origins` says where a key was given (a file line or a
    `--set`); an unknown key gets the nearest key `schema` has in its place."""
    lines = [f"recipe {source} has {exc.error_count()} problem(s):"]
    for err in exc.errors():
        loc = tuple(str(x) for x in err["loc"])
        where = _origin(loc, origins or {})
        if err["type"] == "extra_forbidden":
            nearest = _nearest_key(schema, loc) if schema is not None else None
            hint = f"; did you mean {nearest}?" if nearest else ""
            lines.append(f"  - {'.'.join(loc)}: unknown key{where}{hint}")
        else:
            lines.append(f"  - {'.'.join(loc) or '(top)'}: {err['msg']}{where}")
    return "\n".join(lines)


def _origin(loc: tuple[str, ...], origins: dict[tuple[str, ...], str]) -> str:
    """' (from --set a.b=1)' or ' (line 7)' for the first given key at or under `loc`."""
    for path, origin in origins.items():
        if loc and path[: len(loc)] == loc:
            return f" ({origin})"
    return ""


def key_origins(text: str, sets: list[str]) -> dict[tuple[str, ...], str]:
    """Where each key path of a recipe was given: its line in the file, or the `--set` that
    overrode it (which wins, as its value does). List items are keyed by their index."""
    origins: dict[tuple[str, ...], str] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                origins[(*path, str(key.value))] = f"line {key.start_mark.line + 1}"
                walk(value, (*path, str(key.value)))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, (*path, str(index)))

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    for item in sets:
        key = tuple(p for p in item.split("=", 1)[0].strip().split(".") if p)
        origins = {k: v for k, v in origins.items() if k[: len(key)] != key}
        origins[key] = f"from --set {item}"
    return origins


def _nearest_key(schema: type[BaseModel], loc: tuple[str, ...]) -> str | None:
    """The dotted key `schema` has nearest to `loc` (difflib), in the same section."""
    model: Any = schema
    for part in loc[:-1]:
        if part.isdigit():  # a list item: its model is already the list's element type
            continue
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        model = _section_model(field.annotation) if field is not None else None
        if model is None:
            return None
    match = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.6)
    return ".".join([*loc[:-1], match[0]]) if match else None


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The recipe section a field holds: its model, or the model of its list's items."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):  # Optional[Section], list[Section]
        if (found := _section_model(arg)) is not None:
            return found
    return None


def load_recipe(path: str | Path, schema: type[M], sets: list[str] | None = None) -> M:
    """Read YAML, apply overrides, validate. Raises UserError listing every problem at once."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"recipe not found: {p}")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"recipe {p} is not valid YAML: {yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise UserError(f"recipe {p} must be a mapping at the top level")
    data = _merge(data, parse_sets(sets or []))
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        origins = key_origins(p.read_text(encoding="utf-8"), sets or [])
        message = format_validation_error(str(p), exc, schema=schema, origins=origins)
        raise UserError(message) from exc


def dump_recipe(recipe: BaseModel, path: str | Path) -> None:
    """Write the resolved recipe (after overrides and defaults) next to a run's outputs."""
    from rstar2cli.fileio import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(
            yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False), encoding="utf-8"
        )


RUN_FILES = ("checkpoints", "metrics.jsonl", "final")
# Keys that set where the work runs or how much memory a step takes, not what it computes: a
# resumed run may change them (after running out of memory, or with its sandbox daemon restarted
# elsewhere). The gradients and tool outputs are the same, up to float rounding.
RESUME_FREE_KEYS = (
    "train.max_tokens_per_micro_batch",
    "train.gradient_checkpointing",
    "sandbox.urls",
    "sandbox.token_file",
    "sandbox.num_local_workers",
    "reward.num_workers",
)


def check_resume(
    out: str | Path, recipe: BaseModel, run_files: tuple[str, ...] = RUN_FILES
) -> list[tuple[str, Any, Any]]:
    """Refuse to resume `out` with a recipe other than the one its run started with, but for
    `RESUME_FREE_KEYS`: their changes come back, for the caller to report.

    NOTE: a recipe.yaml alone (a run that failed before its first metrics row or checkpoint) holds
    nothing a different recipe could corrupt, so it does not block a corrected rerun; the caller
    rewrites it. Only once one of `run_files` exists is the recipe fixed for that folder."""
    out = Path(out)
    path = out / "recipe.yaml"
    if not path.exists():
        return []
    changes = recipe_changes(path, recipe)  # a torn recipe.yaml is a one-line error either way
    if not any((out / name).exists() for name in run_files):
        return []
    fields = [c for c in changes if c[0] not in RESUME_FREE_KEYS]
    if fields:
        shown = "; ".join(f"{k}: {a!r} in the run, {b!r} now" for k, a, b in fields[:4])
        more = f"; also {', '.join(k for k, _, _ in fields[4:])}" if len(fields) > 4 else ""
        raise UserError(
            f"{out} holds a run with a different recipe ({shown}{more}); rerun with the same "
            "recipe and options (--set KEY=VALUE for each, a default changed since included) to "
            "resume, or pick a new --out"
        )
    return changes


def resume_changes_line(changes: list[tuple[str, Any, Any]]) -> str:
    """The one line a resumed run prints for the `RESUME_FREE_KEYS` it changed."""
    shown = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in changes)
    return f"resuming with other settings for where and in what memory it runs: {shown}"


def recipe_changes(path: str | Path, recipe: BaseModel) -> list[tuple[str, Any, Any]]:
    """Where `recipe` differs from the resolved copy at `path`: `field_changes` ([] if none).

    A file that is not a YAML mapping (empty, a list, a torn write) is a one-line `UserError`."""
    p = Path(path)
    try:
        before = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UserError(f"{p} is not a recipe mapping: {first_line(exc)}") from exc
    if not isinstance(before, dict):
        got = "an empty file" if before is None else f"a YAML {type(before).__name__}"
        raise UserError(f"{p} is not a recipe mapping: got {got}; remove it or pick a new --out")
    return field_changes(before, recipe.model_dump(mode="json"))


def field_changes(before: Any, now: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Every leaf where two resolved recipes differ, as (dotted key, before, now), in key order;
    a key one side lacks is None there."""
    if isinstance(before, dict) and isinstance(now, dict):
        return [
            change
            for k in sorted(set(before) | set(now), key=str)
            for change in field_changes(before.get(k), now.get(k), f"{prefix}{k}.")
        ]
    return [] if before == now else [(prefix.rstrip("."), before, now)]
