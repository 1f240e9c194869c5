"""A replay workload: multi-turn trajectories as per-turn lengths and tool latencies, one JSON file.

The scheduler benchmark runs the same workload on real engines (benchmarks/scheduler/scripted.py:
each turn's length forced with `SamplingSpec.ignore_eos`, each tool call a sleep of its recorded
latency) and in the simulator (`to_sim` -> `workload.SimTraj`). A `Replay` comes from a real
rollout's trajectory records (`from_records`) or from the simulator's generator (`from_sim`), and
`save`/`load` keep a list of them with a free-form `meta` dict (where they came from) as

    {"version": 1, "meta": {...}, "trajectories": [{"group": ..., "sample": ..., ...}, ...]}

What it deliberately does not keep: token ids or text (a replay's content is whatever the engine
draws), the tool calls' code or status, or a trajectory's finish reason: only the lengths and the
latencies that load an engine and a sandbox. Stdlib only; nothing here starts an engine.
Tested in tests/unit/test_replay.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from benchmarks.sim.workload import SimTraj

VERSION = 1


@dataclass
class Replay:
    """One trajectory to replay. NOTE: invariants (checked): at least one turn, every turn at
    least one token, and one tool call (its response chunk and latency) between two turns."""

    group: str | int  # its prompt: the samples of one prompt share it
    sample: int  # the sample's index within its group
    prompt_tokens: int
    turns: list[int]  # model tokens per turn
    chunks: list[int]  # tool-response tokens after each turn but the last
    tool_s: list[float]  # latency of the tool call after each turn but the last

    def __post_init__(self) -> None:
        ok = bool(self.turns) and all(n >= 1 for n in self.turns) and self.prompt_tokens >= 0
        ok = ok and len(self.chunks) == len(self.tool_s) == len(self.turns) - 1
        ok = ok and all(n >= 0 for n in self.chunks) and all(s >= 0 for s in self.tool_s)
        if not ok:
            raise ValueError(
                f"replay {self.group!r}/{self.sample}: expected >= 1 turns of >= 1 token and "
                f"len(turns) - 1 chunks and tool latencies, got turns {self.turns}, chunks "
                f"{self.chunks}, tool_s {self.tool_s}"
            )

    @property
    def response_tokens(self) -> int:
        return sum(self.turns) + sum(self.chunks)


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """[1, 1, 0, 1] -> [(1, 2), (0, 1), (1, 1)]: (mask value, length) of each run."""
    out: list[tuple[int, int]] = []
    for m in mask:
        if out and out[-1][0] == m:
            out[-1] = (m, out[-1][1] + 1)
        else:
            out.append((m, 1))
    return out


def from_record(record: Mapping[str, Any]) -> Replay | None:
    """One trajectory record (rstar2cli/records.py) -> its Replay; None when it made no model
    token (an engine error on its first request: nothing to replay).

    Turns are the runs of loss mask 1, chunks the runs of 0 between them; the i-th chunk answers
    the i-th entry of `tool_calls` and takes its `duration_s` (0.0 for a call that never ran, a
    parse error). NOTE: the agent loop records a call whose answer did not fit the budget without
    appending its chunk, so `tool_calls` may be longer than the chunks: calls are aligned to the
    chunks and the extra ones left out (the replay ends at its last turn, as
    `workload.played_turns` ends a trajectory whose chunk does not fit), and a chunk without a
    call gets 0.0. A response that ends in a chunk (no model token after it: an engine error
    after the tool answer) drops that chunk and its call, so every chunk sits between two turns.
    """
    mask = [int(m) for m in record["loss_mask"]]
    runs = _runs(mask)
    if runs and runs[0][0] == 0:
        raise ValueError(
            f"record {record.get('id')!r}/{record.get('sample')}: the response starts with a "
            "tool-response token; a trajectory starts with a model turn"
        )
    while runs and runs[-1][0] == 0:
        runs.pop()
    if not runs:
        return None
    calls = list(record.get("tool_calls") or [])
    chunks = [n for m, n in runs if m == 0]
    return Replay(
        group=record.get("group") or record["id"],
        sample=int(record["sample"]),
        prompt_tokens=len(record["prompt_ids"]),
        turns=[n for m, n in runs if m == 1],
        chunks=chunks,
        tool_s=[
            float(calls[i]["duration_s"]) if i < len(calls) else 0.0 for i in range(len(chunks))
        ],
    )


def from_records(records: Iterable[Mapping[str, Any]]) -> list[Replay]:
    """Trajectory records -> Replays, in order; records with no model token are left out
    (`from_record`). `group` is the record's `group` (partial rollout) or else its problem `id`."""
    return [r for r in (from_record(rec) for rec in records) if r is not None]


def from_sim(trajs: list[SimTraj]) -> list[Replay]:
    """Simulator trajectories -> Replays (their script only: a run's state, budget and carried
    tokens are not kept). `sample` counts a group's trajectories in order; a trajectory without
    a group (None) is its own group, named by its index in `trajs`."""
    seen: dict[str | int, int] = {}
    out = []
    for i, t in enumerate(trajs):
        group = i if t.group is None else t.group
        if not isinstance(group, str | int):
            group = str(group)
        seen[group] = seen.get(group, -1) + 1
        out.append(
            Replay(
                group=group,
                sample=seen[group],
                prompt_tokens=t.prompt_tokens,
                turns=list(t.turns),
                chunks=list(t.chunks),
                tool_s=list(t.tool_s),
            )
        )
    return out


def to_sim(replays: list[Replay]) -> list[SimTraj]:
    """Replays -> fresh simulator trajectories (lists copied; `SimTraj.__post_init__` sets the
    first turn's tokens left, the rest of the run state starts at zero)."""
    return [
        SimTraj(
            prompt_tokens=r.prompt_tokens,
            turns=list(r.turns),
            chunks=list(r.chunks),
            tool_s=list(r.tool_s),
            group=r.group,
        )
        for r in replays
    ]


def save(path: str | Path, replays: list[Replay], meta: dict[str, Any]) -> None:
    """Write `replays` and `meta` (JSON-able: where they came from) to `path` as one JSON file."""
    data = {"version": VERSION, "meta": meta, "trajectories": [asdict(r) for r in replays]}
    Path(path).write_text(json.dumps(data) + "\n")


def load(path: str | Path) -> tuple[list[Replay], dict[str, Any]]:
    """The replays and meta `save` wrote to `path`; a one-line ValueError naming it if the file
    is not such a file."""
    names = {f.name for f in fields(Replay)}
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"expected a JSON object with version {VERSION}")
        if not isinstance(data.get("meta"), dict) or not isinstance(data.get("trajectories"), list):
            raise ValueError("expected 'meta' (an object) and 'trajectories' (a list)")
        replays = []
        for t in data["trajectories"]:
            if not isinstance(t, dict) or set(t) != names:
                raise ValueError(f"a trajectory needs exactly the keys {sorted(names)}")
            t = {**t, "tool_s": [float(s) for s in t["tool_s"]]}
            replays.append(Replay(**t))
    except (OSError, ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{path}: not a replay file: {first}") from exc
    return replays, data["meta"]


def _percentile(values: list[int], q: float) -> int:
    """Nearest-rank percentile of a non-empty list (q in (0, 1])."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(len(ordered) * q) - 1)]


def sessions(
    *,
    num_prompts: int,
    num_samples: int,
    prompt_tokens: int,
    turns: int,
    turn_tokens: int,
    chunk_tokens: int,
    tool_s: float,
) -> list[Replay]:
    """Identical many-turn sessions: every trajectory `turns` turns of `turn_tokens` tokens, each
    tool call answered with `chunk_tokens` tokens after `tool_s` seconds. Many of them at once
    on a small KV is where sending every turn back to its home engine thrashes: the prefixes of
    sessions waiting for a tool are evicted by the ones running, and prefilled again."""
    return [
        Replay(
            group=g,
            sample=k,
            prompt_tokens=prompt_tokens,
            turns=[turn_tokens] * turns,
            chunks=[chunk_tokens] * (turns - 1),
            tool_s=[tool_s] * (turns - 1),
        )
        for g in range(num_prompts)
        for k in range(num_samples)
    ]


def summary(replays: list[Replay]) -> dict[str, float]:
    """Counts and sizes, for a report: trajectories, groups, response tokens (tool chunks
    included) per trajectory (mean, p50, p90, max), turns per trajectory, tool calls and their
    mean latency. An empty list gives zeros."""
    resp = [r.response_tokens for r in replays] or [0]
    tool_s = [s for r in replays for s in r.tool_s]
    return {
        "num_trajectories": float(len(replays)),
        "num_groups": float(len({r.group for r in replays})),
        "mean_response_tokens": sum(resp) / len(resp),
        "p50_response_tokens": float(_percentile(resp, 0.5)),
        "p90_response_tokens": float(_percentile(resp, 0.9)),
        "max_response_tokens": float(max(resp)),
        "mean_turns": sum(len(r.turns) for r in replays) / max(len(replays), 1),
        "num_tool_calls": float(len(tool_s)),
        "mean_tool_s": sum(tool_s) / len(tool_s) if tool_s else 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    """`python -m benchmarks.sim.replay --records R.jsonl [--records ...] --out F`, or
    `--from-sim --num-prompts P --num-samples S --max-response T --seed K --out F`, or
    `--sessions TURNS,TOKENS,CHUNK,TOOL_S --num-prompts P --num-samples S --prompt-tokens N
    --out F` (`sessions`): write a replay file and print its summary."""
    import argparse

    from benchmarks.sim.workload import make_workload

    ap = argparse.ArgumentParser(description="write a replay file (benchmarks/sim/replay.py)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--records", action="append", help="trajectory records (JSON lines)")
    src.add_argument("--from-sim", action="store_true", help="the simulator's generator")
    src.add_argument(
        "--sessions",
        metavar="TURNS,TOKENS,CHUNK,TOOL_S",
        help="identical sessions: TURNS turns of TOKENS tokens, tool answers of CHUNK tokens "
        "after TOOL_S seconds",
    )
    ap.add_argument("--prompt-tokens", type=int, default=200, help="--sessions' prompt length")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--num-samples", type=int, default=4)
    ap.add_argument("--max-response", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.records:
        lines = [ln for p in args.records for ln in Path(p).read_text().splitlines()]
        replays = from_records(json.loads(ln) for ln in lines if ln.strip())
        meta: dict[str, Any] = {"source": "records", "records": args.records}
    elif args.sessions:
        turns, tokens, chunk, tool_s = args.sessions.split(",")
        shape = dict(
            num_prompts=args.num_prompts,
            num_samples=args.num_samples,
            prompt_tokens=args.prompt_tokens,
            turns=int(turns),
            turn_tokens=int(tokens),
            chunk_tokens=int(chunk),
            tool_s=float(tool_s),
        )
        replays = sessions(**shape)
        meta = {"source": "sessions", **shape}
    else:
        settings = dict(
            num_prompts=args.num_prompts,
            num_samples=args.num_samples,
            max_response=args.max_response,
            seed=args.seed,
        )
        replays = from_sim(make_workload(**settings))
        meta = {"source": "sim.workload.make_workload", **settings}
    save(args.out, replays, meta=meta)
    print(f"{args.out}: " + ", ".join(f"{k} {v:g}" for k, v in summary(replays).items()))


if __name__ == "__main__":
    main()
