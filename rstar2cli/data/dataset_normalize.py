"""Turn rows of a math dataset into problems `(id, question, answer, source, meta)`.

What it does: finds the question (fields `problem`, `question`, `prompt`; a chat-style `prompt`
list gives its last user message) and the reference answer (field `answer`, GSM8K's `#### n`
inside it, `reward_model.ground_truth`, or the last `\\boxed{...}` of a `solution`, nested braces
included), or uses the fields the caller names (dotted paths such as `reward_model.ground_truth`).
It then applies the filters of the paper's RL data recipe: integer answers only (optional),
one problem per normalised question, and no problem that shares an 8-gram with an eval set.
Every row it cannot use becomes a `Reject` with a reason; nothing is dropped silently.

What it does not: read or write files, download datasets, or grade answers. The question text is
kept verbatim; only the answer is canonicalised (an integer loses thousands separators, a sign
`+` and leading zeros, so GSM8K's `1,450,000` and AIME's `025` become `1450000` and `25`).

Tested in tests/unit/test_normalize.py and, through the CLI, tests/cli/test_prepare_data.py.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rstar2cli.protocol import last_boxed

QUESTION_FIELDS = ("problem", "question", "prompt")
NGRAM_SIZE = 8  # the 8-gram overlap rule used for decontamination

# Reject reasons (keys of the summary table and of the rejects file).
NO_QUESTION = "no_question"
NO_ANSWER = "no_answer"
NOT_INTEGER = "not_integer"
CONTAMINATED = "contaminated"
DUPLICATE = "duplicate"
INVALID_JSON = "invalid_json"
REJECT_REASONS = (INVALID_JSON, NO_QUESTION, NO_ANSWER, NOT_INTEGER, CONTAMINATED, DUPLICATE)

_MISSING = object()
_INT_RE = re.compile(r"[+-]?\d+")
# Thousands separators: "1,450,000", "58,500" and LaTeX's "10{,}080" (groups of exactly 3 digits).
_GROUPED_INT_RE = re.compile(r"[+-]?\d{1,3}(?:(?:,|\{,\})\d{3})+")


@dataclass
class Problem:
    """One usable row. `meta` is the original row as a JSON string."""

    id: str
    question: str
    answer: str
    source: str
    meta: str

    def to_row(self) -> dict[str, str]:
        return {
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "source": self.source,
            "meta": self.meta,
        }


@dataclass
class Reject:
    """A row that was not kept: `index` is its 0-based position in the input (None for a line
    that did not parse; `line` then says where)."""

    reason: str
    detail: str
    row: dict[str, Any] | None
    index: int | None = None
    line: int | None = None

    def to_row(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "detail": self.detail,
            "index": self.index,
            "line": self.line,
            # NOTE: through JSON once so HF rows holding dates/bytes still serialise
            "row": None if self.row is None else json.loads(_to_json(self.row)),
        }


@dataclass
class NormalizeOptions:
    question_field: str | None = None
    answer_field: str | None = None
    integer_only: bool = False
    dedupe: bool = True
    # 8-grams of the eval questions (see `eval_ngrams`); empty = no decontamination.
    eval_grams: set[tuple[str, ...]] = field(default_factory=set)


@dataclass
class NormalizeResult:
    kept: list[Problem]
    rejects: list[Reject]


# ---------------------------------------------------------------------------------------------
# Field lookup


def get_path(row: dict[str, Any], path: str) -> Any:
    """`row["a"]["b"]` for path "a.b"; a key that itself contains dots wins over the path."""
    if path in row:
        return row[path]
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _text_of(value: Any) -> str | None:
    """Question text from a field value: a string, or the last user message of a chat list."""
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, list):
        users = [m for m in value if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1].get("content"), str):
            return _text_of(users[-1]["content"])
    return None


def find_question(row: dict[str, Any], question_field: str | None = None) -> tuple[str | None, str]:
    """(question, detail): question is None when not found and detail says why."""
    names = (question_field,) if question_field else QUESTION_FIELDS
    for name in names:
        value = get_path(row, name)
        if value is _MISSING or value is None:
            continue
        text = _text_of(value)
        if text is None:
            return None, f"field {name!r} holds no question text"
        return text, name
    return None, f"no field among {', '.join(names)}"


# ---------------------------------------------------------------------------------------------
# Answer extraction


def gsm8k_answer(text: str) -> str | None:
    """The final answer after GSM8K's last `####`, without commas, `$` or a trailing period."""
    if "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip()
    tail = tail.replace(",", "").replace("$", "").strip().rstrip(".").strip()
    return tail or None


def canonical_answer(text: str) -> str:
    """Strip whitespace and enclosing `$...$`; write integers plainly ("1,450,000" -> "1450000",
    "025" -> "25", "+7" -> "7"). Anything else is returned as it is."""
    ans = text.strip()
    if len(ans) >= 2 and ans.startswith("$") and ans.endswith("$"):
        ans = ans.strip("$").strip()
    if _GROUPED_INT_RE.fullmatch(ans):
        ans = ans.replace("{,}", "").replace(",", "")
    if _INT_RE.fullmatch(ans):
        ans = str(int(ans))
    return ans


def _answer_of(value: Any) -> str | None:
    """Answer text from a field value: GSM8K `####`, else last `\\boxed{}`, else the value."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list) and len(value) == 1:  # some sets store ["42"]
        return _answer_of(value[0])
    if not isinstance(value, str):
        return None
    found = gsm8k_answer(value)
    if found is None and ("\\boxed" in value or "\\fbox" in value):
        found = last_boxed(value)
    if found is None:
        found = value
    found = canonical_answer(found)
    return found or None


def find_answer(row: dict[str, Any], answer_field: str | None = None) -> tuple[str | None, str]:
    """(answer, detail): the first field that yields an answer, in the order
    answer -> reward_model.ground_truth -> solution (last \\boxed{}); or only `answer_field`."""
    if answer_field:
        value = get_path(row, answer_field)
        if value is _MISSING:
            return None, f"no field {answer_field!r}"
        ans = _answer_of(value)
        return (ans, answer_field) if ans else (None, f"field {answer_field!r} holds no answer")
    for name in ("answer", "reward_model.ground_truth"):
        value = get_path(row, name)
        if value is not _MISSING:
            ans = _answer_of(value)
            if ans:
                return ans, name
    solution = row.get("solution")
    if isinstance(solution, str):
        boxed = last_boxed(solution)
        if boxed and boxed.strip():
            return canonical_answer(boxed), "solution"
    return None, "no answer field (answer, reward_model.ground_truth) and no \\boxed{} in solution"


def is_integer_answer(answer: str) -> bool:
    return _INT_RE.fullmatch(canonical_answer(answer)) is not None


# ---------------------------------------------------------------------------------------------
# Dedupe and decontamination


def normalize_question(text: str) -> str:
    """Key for dedupe: NFKC, lower case, runs of non-alphanumerics collapsed to one space."""
    text = unicodedata.normalize("NFKC", text).lower()
    return " ".join(re.findall(r"[^\W_]+", text))


def ngrams(text: str, n: int = NGRAM_SIZE) -> set[tuple[str, ...]]:
    """Word n-grams of the normalised text. A text shorter than n words gives one gram (all of
    it), so short questions are matched whole instead of never."""
    words = normalize_question(text).split()
    if not words:
        return set()
    if len(words) < n:
        return {tuple(words)}
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def eval_ngrams(questions: Iterable[str], n: int = NGRAM_SIZE) -> set[tuple[str, ...]]:
    grams: set[tuple[str, ...]] = set()
    for q in questions:
        grams |= ngrams(q, n)
    return grams


# ---------------------------------------------------------------------------------------------
# The whole pass


def normalize_records(
    rows: list[dict[str, Any]],
    source: str,
    options: NormalizeOptions,
    on_row: Callable[[], None] | None = None,
) -> NormalizeResult:
    """Normalise and filter rows in input order; ids are `{source}-{index}`.

    NOTE: a row is checked in the order question -> answer -> integer -> contamination ->
    duplicate, and rejected with the first reason that applies.
    """
    kept: list[Problem] = []
    rejects: list[Reject] = []
    seen: dict[str, str] = {}  # normalised question -> id of the first kept row
    for index, row in enumerate(rows):
        problem, reject = _normalize_one(
            index=index, row=row, source=source, options=options, seen=seen
        )
        if problem is not None:
            kept.append(problem)
        if reject is not None:
            rejects.append(reject)
        if on_row is not None:
            on_row()
    return NormalizeResult(kept=kept, rejects=rejects)


def _normalize_one(
    index: int,
    row: dict[str, Any],
    source: str,
    options: NormalizeOptions,
    seen: dict[str, str],
) -> tuple[Problem | None, Reject | None]:
    def reject(reason: str, detail: str) -> tuple[None, Reject]:
        return None, Reject(reason=reason, detail=detail, row=row, index=index)

    question, detail = find_question(row, options.question_field)
    if question is None:
        return reject(NO_QUESTION, detail)
    answer, detail = find_answer(row, options.answer_field)
    if answer is None:
        return reject(NO_ANSWER, detail)
    if options.integer_only and not is_integer_answer(answer):
        return reject(NOT_INTEGER, f"answer {answer!r} is not an integer")
    if options.eval_grams:
        overlap = ngrams(question) & options.eval_grams
        if overlap:
            return reject(CONTAMINATED, "shares with an eval set: " + " ".join(min(overlap)))
    problem_id = f"{source}-{index}"
    if options.dedupe:
        key = normalize_question(question)
        if key in seen:
            return reject(DUPLICATE, f"same question as {seen[key]}")
        seen[key] = problem_id
    return Problem(
        id=problem_id, question=question, answer=answer, source=source, meta=_to_json(row)
    ), None


def _to_json(row: dict[str, Any]) -> str:
    return json.dumps(row, ensure_ascii=False, default=str)
