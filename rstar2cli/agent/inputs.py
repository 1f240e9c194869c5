"""Inputs shared by the commands: problem files, model folders and hub ids, Hugging Face datasets,
and a sandbox reachability check, each failing with one line before any work.

What it does not do: normalise arbitrary schemas (that is `prepare-data`; these files already have
`question` and, for training, `answer`). Tested through tests/cli and tests/integration.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rstar2cli.errors import UserError, first_line


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


def _hub_offline() -> bool:
    import os

    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def check_model_source(model: str) -> None:
    """A local model folder (as `check_model_folder`) or a Hugging Face hub id that is cached or
    that the hub answers for, checked with one request and no retries (one-line error). Without
    this, an unreachable hub costs about 25 s of retries per file before the same failure."""
    path = Path(model).expanduser()
    if path.exists() or model.startswith(("/", "./", "../", "~")) or model.count("/") > 1:
        check_model_folder(path)  # a path, not a hub id ("org/name" has one slash at most)
        return
    import huggingface_hub as hub
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError

    if isinstance(hub.try_to_load_from_cache(model, "config.json"), str):
        return
    if _hub_offline():
        raise UserError(
            f"model {model!r} is neither a local folder nor in the Hugging Face cache "
            "(HF_HUB_OFFLINE is set)"
        )
    try:
        hub.get_hf_file_metadata(hub.hf_hub_url(model, "config.json"), timeout=10)
    except RepositoryNotFoundError as exc:
        raise UserError(
            f"model {model!r} is neither a local folder nor a model on the Hugging Face hub"
        ) from exc
    except EntryNotFoundError as exc:
        raise UserError(f"model {model!r} on the Hugging Face hub has no config.json") from exc
    except Exception as exc:  # connection, DNS, proxy and HTTP errors come in many types
        raise UserError(
            f"model {model!r} is not a local folder, and the Hugging Face hub could not be "
            f"asked for it ({first_line(exc)})"
        ) from exc


def load_hub_dataset(
    dataset_id: str, config: str | None, split: str, what: str
) -> list[dict[str, Any]]:
    """Rows of a Hugging Face dataset (`what` names it in errors). Unless HF_HUB_OFFLINE is set
    (the local cache only), the hub is asked once, with no retries, before `datasets` goes to
    it: an unreachable hub or a missing dataset is one line in a second, not ~25 s of retries."""
    import datasets

    if not _hub_offline():
        import huggingface_hub as hub
        from huggingface_hub.errors import RepositoryNotFoundError

        try:
            hub.HfApi().dataset_info(dataset_id, timeout=10)
        except RepositoryNotFoundError as exc:
            raise UserError(f"{what}: no dataset {dataset_id!r} on the Hugging Face hub") from exc
        except Exception as exc:  # connection, DNS, proxy, auth: many types
            raise UserError(
                f"{what}: the Hugging Face hub could not be asked for {dataset_id!r} "
                f"({first_line(exc)}); set HF_HUB_OFFLINE=1 to use the local cache"
            ) from exc
    try:
        return datasets.load_dataset(dataset_id, config, split=split).to_list()
    except Exception as exc:  # hub, cache, auth (gated sets) and schema errors: many types
        raise UserError(
            f"{what}: cannot load {dataset_id!r} (config={config}, split={split}): "
            f"{first_line(exc)}"
        ) from exc


def check_sandboxes(urls: list[str], token_file: str | Path | None = None) -> None:
    """Fail with one line before any engine starts when no sandbox URL answers /healthz, when
    the token (`token_file`, else $RSTAR2_SANDBOX_TOKEN) is unreadable, or when a daemon refuses
    it; warn (one line) about the URLs that do not answer when others do."""
    import asyncio

    from sandboxd.auth import SandboxUnauthorized, TokenError
    from sandboxd.client import SandboxClient, SandboxUnreachable

    async def check() -> list[str]:
        client = SandboxClient(urls, timeout_s=5.0, max_attempts=1, token_file=token_file)
        try:
            return await client.check()
        finally:
            await client.close()

    try:
        dead = asyncio.run(check())
    except (SandboxUnreachable, SandboxUnauthorized, TokenError) as exc:
        option = "--sandbox-token-file: " if isinstance(exc, TokenError) else ""
        raise UserError(option + str(exc).splitlines()[0]) from None
    if dead:  # the client routes around them, but a user should know the pool is smaller
        print(
            f"warning: no answer on /healthz from {', '.join(dead)}; going on with the other "
            f"{len(urls) - len(dead)} of {len(urls)} sandboxes",
            file=sys.stderr,
        )


def check_ray_address(address: str | None) -> None:
    """Fail with one line when a Ray cluster address accepts no connection (`ray.init` would
    retry it for minutes); 'local', 'auto' and None need no cluster to be up."""
    import socket

    if address in (None, "local", "auto"):
        return
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"--ray-address must be 'local', 'auto' or HOST:PORT, got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5.0).close()
    except OSError as exc:
        raise UserError(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} (is its head up? "
            "`ray start --head` prints the address)"
        ) from None
