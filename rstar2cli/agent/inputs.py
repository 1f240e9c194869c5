"""Inputs shared by the commands that drive the agent loop (rollout, eval, rl-stage, filter-hard):
problem files and a sandbox reachability check, both failing with one line before any work.

What it does not do: normalise arbitrary schemas (that is `prepare-data`; these files already have
`question` and, for training, `answer`). Tested through tests/cli and tests/integration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rstar2cli.errors import UserError


def load_problems(
    path: str | Path, require_answer: bool = True, max_problems: int | None = None
) -> list[dict[str, Any]]:
    """Rows with a non-empty question (and an answer, when required), in file order."""
    from rstar2cli.fileio import read_records

    rows, _ = read_records(path)
    problems = []
    for i, row in enumerate(rows):
        question, answer = row.get("question"), row.get("answer")
        if not isinstance(question, str) or not question.strip():
            continue
        if require_answer and answer is None:
            continue
        problems.append(
            {
                "id": str(row.get("id", i)),
                "question": question,
                "answer": None if answer is None else str(answer),
            }
        )
        if max_problems is not None and len(problems) >= max_problems:
            break
    if not problems:
        if require_answer:
            raise UserError(f"no problems in {path} (expected rows with 'question' and 'answer')")
        raise UserError(f"no questions in {path} (expected rows with a non-empty 'question' field)")
    return problems


def check_model_folder(model: str | Path) -> None:
    """A local Hugging Face model folder: it exists and has a config.json (one-line error)."""
    model = Path(model)
    if not model.is_dir():
        raise UserError(f"model path not found: {model}")
    if not (model / "config.json").is_file():
        raise UserError(f"no config.json in {model}: not a Hugging Face model folder")


def check_sandboxes(urls: list[str]) -> None:
    """Fail with one line before any engine starts when no sandbox URL answers /healthz."""
    import asyncio

    from sandboxd.client import SandboxClient, SandboxUnreachable

    async def check() -> None:
        client = SandboxClient(urls, timeout_s=5.0, max_attempts=1)
        try:
            await client.check()
        finally:
            await client.close()

    try:
        asyncio.run(check())
    except SandboxUnreachable as exc:
        raise UserError(str(exc).splitlines()[0]) from exc
