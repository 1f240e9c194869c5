"""The synthetic task sets: determinism, disjoint splits, right answers, short questions."""

from __future__ import annotations

import ast
import json
import operator
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rstar2cli.data.synthetic import SYNTHETIC_NAMES, make_synthetic
from rstar2cli.errors import UserError

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow}


def _eval_arith(expr: str) -> int:
    """Evaluate + - * ** on integer literals only (an independent check of the generator)."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"unexpected node {ast.dump(node)}")

    return walk(ast.parse(expr, mode="eval"))


def test_arith_rows_are_right_short_and_integer():
    train, test = make_synthetic("arith", 500, seed=3)
    assert (len(train), len(test)) == (400, 100)
    for row in train + test:
        assert set(row) == {"id", "question", "answer", "source"}
        m = re.fullmatch(r"Compute (.+)\.", row["question"])
        assert m, row["question"]
        assert str(_eval_arith(m.group(1))) == row["answer"]
        assert len(row["question"]) <= 30
        assert row["source"] == "synthetic/arith"
    # answers need the tool: every expression multiplies two two-digit numbers
    assert min(int(r["answer"]) for r in train + test) > 11 * 11 - 100


def test_deterministic_per_seed_and_disjoint_splits():
    a_train, a_test = make_synthetic("arith", 300, seed=7)
    b_train, b_test = make_synthetic("arith", 300, seed=7)
    assert (a_train, a_test) == (b_train, b_test)
    c_train, _ = make_synthetic("arith", 300, seed=8)
    assert [r["question"] for r in c_train] != [r["question"] for r in a_train]
    train_q = {r["question"] for r in a_train}
    test_q = {r["question"] for r in a_test}
    assert len(train_q) == len(a_train) and len(test_q) == len(a_test)
    assert not train_q & test_q
    ids = [r["id"] for r in a_train + a_test]
    assert len(set(ids)) == len(ids)


def test_all_forms_appear():
    train, test = make_synthetic("arith", 200, seed=0)
    shapes = {re.sub(r"\d+", "n", r["question"]) for r in train + test}
    assert shapes == {
        "Compute n*n+n.",
        "Compute n*n-n.",
        "Compute n*(n+n).",
        "Compute n*n*n.",
        "Compute n**n+n*n.",
    }


def test_smallest_split():
    train, test = make_synthetic("arith", 2, seed=0)
    assert (len(train), len(test)) == (1, 1)


def test_unknown_name_lists_available():
    with pytest.raises(UserError) as info:
        make_synthetic("nope", 10, seed=0)
    assert "nope" in str(info.value)
    for name in SYNTHETIC_NAMES:
        assert name in str(info.value)


@pytest.mark.parametrize("num", [0, 1, 10**9])
def test_bad_num(num):
    with pytest.raises(UserError, match="--num"):
        make_synthetic("arith", num, seed=0)


def test_committed_arith_set_matches_generator():
    """data/arith*.parquet are what data/PROVENANCE.md says: `--synthetic arith --num 2000 --seed 0`."""
    data_dir = Path(__file__).resolve().parents[2] / "data"
    if not (data_dir / "arith.parquet").is_file():
        pytest.skip(f"no generated set in {data_dir}")
    train, test = make_synthetic("arith", 2000, seed=0)
    for rows, name in ((train, "arith.parquet"), (test, "arith.test.parquet")):
        got = pq.read_table(data_dir / name).to_pylist()
        assert [{k: r[k] for k in ("id", "question", "answer", "source")} for r in got] == rows
        assert all(json.loads(r["meta"]) == row for r, row in zip(got, rows, strict=True))
