"""Bad `--out` paths and option values fail with exit 2 before any work and leave files untouched.

`rollout`, `filter-hard` and `eval` through the real entry point (subprocess, hub offline). The
model is an empty folder or one holding only `{}` as config.json: every check here runs before a
tokenizer or engine would load, so nothing heavy starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

RSTAR2 = [sys.executable, "-m", "rstar2cli.cli"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
PARQUET = b"PAR1 not really a parquet, but bytes that must stay as they are PAR1"


def _cli(*args):
    return subprocess.run(
        [*RSTAR2, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **OFFLINE},
    )


def _fails(res, message, one_line=True):
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, res.stderr
    assert message in " ".join(res.stderr.split()), res.stderr
    if one_line:
        assert len(lines) == 1, res.stderr


def _setup(tmp_path, config=True):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"question": "What is 1+1?", "answer": "2"}) + "\n")
    model = tmp_path / "model"
    model.mkdir()
    if config:
        (model / "config.json").write_text("{}")
    blocker = tmp_path / "a_file"  # a folder under it can never be created, even as root
    blocker.write_text("x")
    return data, model, blocker


def test_rollout_refuses_bad_out_and_keeps_files(tmp_path):
    data, model, blocker = _setup(tmp_path)
    before = data.read_bytes()
    parquet = tmp_path / "old.parquet"
    parquet.write_bytes(PARQUET)
    base = ["rollout", "--model", model, "--data", data]
    _fails(_cli(*base, "--out", parquet), "--out must be a .jsonl file")
    _fails(_cli(*base, "--out", data), "is also an input")
    _fails(_cli(*base, "--out", blocker / "o.jsonl"), "cannot write to")
    assert parquet.read_bytes() == PARQUET and data.read_bytes() == before


def test_rollout_refuses_bad_option_values(tmp_path):
    data, model, _ = _setup(tmp_path)
    out = tmp_path / "o.jsonl"
    base = ["rollout", "--model", model, "--data", data, "--out", out]
    _fails(_cli(*base, "--tool-timeout", 0), "--tool-timeout must be > 0")
    _fails(_cli(*base, "--tool-timeout", -1), "--tool-timeout must be > 0")
    _fails(_cli(*base, "--admission", "sideways"), "unknown admission 'sideways'")
    _fails(_cli(*base, "--tail-kv-fraction", 0), "tail_kv_fraction must be in (0, 1]")
    # typer's own range errors: exit 2 with a usage panel
    _fails(_cli(*base, "--max-tool-output-chars", -1), "'--max-tool-output-chars'", False)
    _fails(_cli(*base, "--kv-cache-tokens", -5), "'--kv-cache-tokens'", False)
    assert not out.exists()


def test_rollout_and_eval_want_config_json_in_the_model_folder(tmp_path):
    data, model, _ = _setup(tmp_path, config=False)
    out = tmp_path / "o.jsonl"
    _fails(_cli("rollout", "--model", model, "--data", data, "--out", out), "no config.json in")
    res = _cli("eval", "--model", model, "--data", data, "--out", tmp_path / "ev")
    _fails(res, "no config.json in")
    assert not out.exists() and not (tmp_path / "ev").exists()


def test_filter_hard_keeps_existing_outputs_and_the_data(tmp_path):
    data, model, blocker = _setup(tmp_path)
    before = data.read_bytes()
    old = tmp_path / "kept.parquet"
    old.write_bytes(PARQUET)
    counts = tmp_path / "k.counts.jsonl"
    counts.write_text('{"id": "0"}\n')
    base = ["filter-hard", "--model", model, "--data", data]
    _fails(_cli(*base, "--out", old), "output exists")
    _fails(_cli(*base, "--out", tmp_path / "k.jsonl"), "output exists")  # its counts file
    _fails(_cli(*base, "--out", data), "is also an input")
    _fails(_cli(*base, "--out", data, "--force"), "is also an input")
    _fails(_cli(*base, "--out", blocker / "k.parquet"), "cannot write to")
    _fails(_cli(*base, "--out", old, "--force", "--template", "foo"), "unknown template 'foo'")
    assert old.read_bytes() == PARQUET and data.read_bytes() == before
    assert counts.read_text() == '{"id": "0"}\n' and not (tmp_path / "kept.counts.jsonl").exists()


def test_eval_refuses_an_unwritable_out_and_a_negative_kv_cache(tmp_path):
    data, model, blocker = _setup(tmp_path)
    base = ["eval", "--model", model, "--data", data]
    _fails(_cli(*base, "--out", blocker / "ev"), "cannot write to")
    _fails(
        _cli(*base, "--out", tmp_path / "ev", "--kv-cache-tokens", -5), "'--kv-cache-tokens'", False
    )
    assert blocker.read_text() == "x" and not (tmp_path / "ev").exists()
