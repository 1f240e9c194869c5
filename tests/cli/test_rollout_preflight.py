"""rollout and filter-hard check their inputs first: one line, exit 2, no engine, no output."""

from __future__ import annotations

from clihelpers import run_cli, write_problems


def test_rollout_bad_inputs_fail_with_one_line_before_any_work(tmp_path, tiny_model_dir):
    data = tmp_path / "p.jsonl"
    write_problems(data)
    out = tmp_path / "o.jsonl"
    no_q = tmp_path / "noq.jsonl"
    no_q.write_text('{"problem": "1+1"}\n')
    cases = [
        (["--model", tmp_path / "missing", "--data", data], "model path not found"),
        (["--model", tiny_model_dir, "--data", no_q], "no questions in"),
        (
            ["--model", tiny_model_dir, "--data", data, "--sandbox", "http://127.0.0.1:9"],
            "no sandbox answered",
        ),
        (["--model", tiny_model_dir, "--data", data, "--scheduler", "fifo"], "unknown policy"),
        (
            ["--model", tiny_model_dir, "--data", data, "--speculative", "eagle:4"],
            "expected METHOD:TOKENS",
        ),
        (
            [
                "--model",
                tiny_model_dir,
                "--data",
                data,
                "--engine",
                "hf",
                "--speculative",
                "ngram:4",
            ],
            "--speculative is for --engine vllm",
        ),
        # a Ray head that is not up: one line at once (ray.init retries for minutes)
        (
            ["--model", tiny_model_dir, "--data", data, "--ray-address", "127.0.0.1:9"],
            "cannot reach the Ray cluster at 127.0.0.1:9",
        ),
        (
            ["--model", tiny_model_dir, "--data", data, "--ray-address", "head-node"],
            "--ray-address must be 'local', 'auto' or HOST:PORT",
        ),
    ]
    for args, message in cases:
        res = run_cli("rollout", *args, "--out", out, timeout=120)
        assert res.returncode == 2, res.stderr
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and message in lines[0]
    assert not out.exists()


def test_filter_hard_bad_inputs_fail_with_one_line_before_any_work(tmp_path, tiny_model_dir):
    data = tmp_path / "p.jsonl"
    write_problems(data)
    cases = [
        (
            ["--model", tmp_path / "missing", "--out", tmp_path / "k.jsonl"],
            "model path not found",
        ),
        (["--model", tiny_model_dir, "--out", tmp_path / "k.csv"], "--out must end in"),
        (
            [
                "--model",
                tiny_model_dir,
                "--out",
                tmp_path / "k.jsonl",
                "--sandbox",
                "http://127.0.0.1:9",
            ],
            "no sandbox answered",
        ),
    ]
    for args, message in cases:
        res = run_cli("filter-hard", "--data", data, *args, timeout=120)
        assert res.returncode == 2, res.stderr
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and message in lines[0], res.stderr
    assert not list(tmp_path.glob("k.*"))


def test_a_dead_sandbox_beside_a_live_one_is_named_in_a_warning(capsys):
    from rstar2cli.preflight import check_sandboxes
    from sandboxd.spawn import spawn_daemon

    with spawn_daemon(workers=1, timeout_s=5.0) as live:
        check_sandboxes([live.url, "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert "warning: no answer on /healthz from http://127.0.0.1:9" in err
    assert "the other 1 of 2 sandboxes" in err
