"""Problem files and Hugging Face datasets, read with one-line errors before any work.

`load_problems` reads a local problem file (rows with a non-empty `question` and, for training,
an `answer`); `load_hub_dataset` reads a hub dataset after asking the hub once, with no retries,
so an unreachable hub or a missing set fails in a second instead of after ~25 s of retries.

What it does not do: normalise arbitrary schemas (that is `prepare-data`,
`rstar2cli.data.dataset_normalize`; problem files already have `question` and `answer`), or
check models, sandboxes or Ray (`rstar2cli.preflight`). Tested through
tests/cli/test_rollout_preflight.py, tests/cli/test_prepare_data.py and tests/unit/test_sft_data.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rstar2cli.errors import UserError, first_line


def hub_offline() -> bool:
    """HF_HUB_OFFLINE is set: only the local Hugging Face cache may be read."""
    import os

    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


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


def load_hub_dataset(
    dataset_id: str, config: str | None, split: str, what: str
) -> list[dict[str, Any]]:
    """Rows of a Hugging Face dataset (`what` names it in errors). Unless HF_HUB_OFFLINE is set
    (the local cache only), the hub is asked once, with no retries, before `datasets` goes to
    it: an unreachable hub or a missing dataset is one line in a second, not ~25 s of retries."""
    import datasets

    if not hub_offline():
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
