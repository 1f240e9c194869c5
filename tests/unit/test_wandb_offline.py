"""The W&B hook of rl-stage (rstar2cli/rl/stage_report.py) against the real wandb client, offline.

WANDB_MODE=offline: wandb writes its run file under OUT/wandb and reaches no network. The run
file is read back here (its record log: 7-byte header, then 32 KiB blocks of records, each with a
crc, a length and a type, holding protobuf `Record`s) to check every logged scalar reached it at
its step (wandb's service process finishes the file shortly after `finish()` returns: the test
waits for its exit record), and that a recipe asking for W&B without wandb installed fails in one line.
"""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import pytest

from rstar2cli.errors import UserError
from rstar2cli.rl.stage_recipe import LogConfig
from rstar2cli.rl.stage_report import SCALARS, StageReporter

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_run_file(path: Path) -> list[bytes]:
    """The payloads of a wandb run file (the log format of its DataStore)."""
    raw = path.read_bytes()
    assert raw[:4] == b":W&B", "not a wandb run file"
    out, pending, pos = [], b"", 7
    while pos + 7 <= len(raw):
        room = BLOCK - pos % BLOCK
        if room < 7:  # the rest of a block too short for a header is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        data = raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:  # zero padding up to the block's end
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        pending = data if kind in (FULL, FIRST) else pending + data
        if kind in (FULL, LAST):
            out.append(pending)
    return out


def logged_history(run_dir: Path, timeout_s: float = 60.0) -> list[dict[str, float]]:
    """The history rows of the run under `run_dir`, once its exit record is written (wandb's
    service process writes the file after `finish()` returns)."""
    from wandb.proto import wandb_internal_pb2 as pb

    deadline = time.monotonic() + timeout_s
    while True:
        (run_file,) = run_dir.glob("offline-run-*/run-*.wandb")
        records = []
        for payload in read_run_file(run_file):
            record = pb.Record()
            record.ParseFromString(payload)
            records.append(record)
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "exit" in kinds, f"the run file was not finished within {timeout_s} s: {kinds}"
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append(
                {
                    item.key or ".".join(item.nested_key): json.loads(item.value_json)
                    for item in items
                }
            )
    return rows


def test_rl_stage_scalars_reach_an_offline_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    rows = [
        {"step": 1, "reward": 0.25, "grad_norm": 1.5, "mismatch_kl": None, "num_kept": 6},
        {"step": 2, "reward": 0.5, "grad_norm": 0.75, "eval_accuracy": 0.4, "num_kept": 8},
    ]
    cfg = LogConfig(tensorboard=False, wandb_project="rstar2-test", plots=False)
    with StageReporter(
        out=tmp_path,
        log_cfg=cfg,
        start_step=0,
        num_steps=2,
        run_name="run-a",
        recipe_dump={"algo": {"lr": 1.0e-6}},
        live=False,
    ) as reporter:
        for row in rows:
            reporter.step(row)

    history = logged_history(tmp_path / "wandb")
    assert [h["_step"] for h in history] == [1, 2]
    for logged, row in zip(history, rows, strict=True):
        sent = {k: v for k, v in row.items() if k in SCALARS and v is not None}
        assert {k: logged[k] for k in sent} == sent
        assert "mismatch_kl" not in logged  # None is left out, not logged as null
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])["reward"] == 0.5


def test_wandb_project_without_wandb_installed_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    cfg = LogConfig(tensorboard=False, wandb_project="p", plots=False)
    reporter = StageReporter(
        out=tmp_path,
        log_cfg=cfg,
        start_step=0,
        num_steps=1,
        run_name="r",
        recipe_dump={},
        live=False,
    )
    with pytest.raises(UserError, match=r"is not installed \(pip install wandb\)$"):
        reporter.__enter__()
