"""Small file helpers shared by the commands: read records, write atomically, append durably.

Reading accepts jsonl, json (a list of objects, or {"data": [...]}) and parquet. Writers never
leave a half-written output: `atomic_path` writes to a temporary sibling and renames it into place;
`JsonlAppender` appends and fsyncs so a crash loses at most the batch being written.
Tested in tests/unit/test_fileio.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rstar2cli.errors import UserError

RECORD_SUFFIXES = (".jsonl", ".json", ".parquet")
_UMASK = os.umask(0o022)  # read once at import (os.umask can only be read by setting it)
os.umask(_UMASK)


def read_records(path: str | Path) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """Read a local jsonl/json/parquet file into dicts.

    Returns (records, bad_lines) where bad_lines holds (line number, reason) for jsonl lines that
    are not JSON objects; the caller decides whether those are rejects or fatal.
    """
    p = Path(path)
    if not p.exists():
        raise UserError(f"file not found: {p}")
    if p.is_dir():
        raise UserError(f"expected a file, got a directory: {p}")
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(p).to_pylist(), []
        except Exception as exc:  # pyarrow raises several types for corrupt files
            raise UserError(f"cannot read parquet {p}: {exc}") from exc
    if suffix == ".json":
        try:
            obj = json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot parse JSON {p}: {exc}") from exc
        if isinstance(obj, dict) and isinstance(obj.get("data"), list):
            obj = obj["data"]
        if not isinstance(obj, list) or not all(isinstance(r, dict) for r in obj):
            raise UserError(f"{p}: expected a JSON list of objects")
        return obj, []
    if suffix == ".jsonl":
        records: list[dict[str, Any]] = []
        bad: list[tuple[int, str]] = []
        with p.open("r", encoding="utf-8", errors="replace") as f:
            for num, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    bad.append((num, f"invalid JSON: {exc.msg}"))
                    continue
                if not isinstance(obj, dict):
                    bad.append((num, "line is not a JSON object"))
                    continue
                records.append(obj)
        return records, bad
    raise UserError(f"unsupported file type {p.suffix!r} for {p} (use .jsonl, .json or .parquet)")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it onto `path` only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates 0600; give the output the permissions a plain open() would have.
    os.chmod(tmp_path, 0o666 & ~_UMASK)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json_atomic(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=indent, sort_keys=False) + "\n", encoding="utf-8")


def write_jsonl_atomic(path: str | Path, rows: list[dict[str, Any]]) -> None:
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


class JsonlAppender:
    """Append JSON lines durably: each `write_batch` ends with flush + fsync.

    The file is opened at the first write, so a run that fails before producing anything leaves
    no empty output behind. Then a trailing partial line (a crash mid-write) is cut off, so the
    file stays valid jsonl.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._f: Any = None

    def write_batch(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _truncate_partial_tail(self.path)
            self._f = self.path.open("a", encoding="utf-8")
        for row in rows:
            self._f.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl_if_exists(path: str | Path) -> list[dict[str, Any]]:
    """Rows already in an output file (for resuming); missing file -> []. Skips a torn last line."""
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            rows.append(obj)
    return rows


def _truncate_partial_tail(path: Path) -> None:
    """Cut a torn last line; a last line that is a whole JSON object only lacks its newline (it
    counts as done for `read_jsonl_if_exists`), so it keeps its row and gets the newline."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1  # 0 when the only line is torn
        try:
            whole = isinstance(json.loads(data[cut:]), dict)
        except (json.JSONDecodeError, UnicodeDecodeError):
            whole = False
        if whole:
            f.write(b"\n")
        else:
            f.truncate(cut)


def check_output_path(
    out: str | Path,
    inputs: tuple[str | Path | None, ...] = (),
    suffix: str | None = None,
    option: str = "--out",
) -> Path:
    """Before any work: `out` (given as `option`) is not one of the `inputs`, has `suffix` (if
    given), and its folder can be created and written to. Raises a one-line `UserError`; returns
    `out` as a Path."""
    out = Path(out)
    if suffix is not None and out.suffix.lower() != suffix:
        raise UserError(f"{option} must be a {suffix} file, got {out}")
    for src in inputs:
        if src is not None and Path(src).exists() and out.exists() and out.samefile(src):
            raise UserError(f"{option} {out} is also an input; write the output elsewhere")
    if out.is_dir() and suffix is not None:
        raise UserError(f"{option} is a directory, expected a {suffix} file: {out}")
    folder = out if suffix is None else out.parent
    try:
        missing = [f for f in (folder, *folder.parents) if not f.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        _CREATED.extend(reversed(missing))
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".rstar2-probe-"):
            pass
    except OSError as exc:
        raise UserError(f"cannot write to {folder}: {exc.strerror or exc}") from None
    return out


# the folders `check_output_path` created in this process, outermost first
_CREATED: list[Path] = []


def remove_created_if_empty() -> None:
    """After a failed command: remove the folders `check_output_path` created for it that are
    still empty (innermost first), so that a run that failed leaves nothing behind."""
    for folder in reversed(_CREATED):
        try:
            folder.rmdir()
        except OSError:
            pass
    _CREATED.clear()


def refuse_overwrite(paths: list[Path], force: bool) -> None:
    """One line naming the outputs that already exist, unless `force`."""
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise UserError(f"output exists: {', '.join(existing)} (use --force to overwrite)")
