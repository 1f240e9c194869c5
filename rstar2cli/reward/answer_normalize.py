"""Answer normalisation and the fast exact comparison that settles most checks without sympy.

`normalize_answer` strips LaTeX wrappers that do not change a value: `$...$`, `\\left`/`\\right`,
spacing commands, `\\text{}`/`\\mbox{}`, `\\dfrac`/`\\tfrac`, `^\\circ`, `\\%`, `\\$`, a trailing
period, thousands separators, a leading `x =`, and measurement units after a plain number.
`fast_equivalent` then compares integers, decimals, fractions, mixed numbers, tuples, intervals,
unions of intervals, unordered lists, numeric matrices, multiple-choice letters and plain words
exactly, and answers None when it cannot decide (the caller then asks math-verify).

What it does not do: anything symbolic (radicals, pi, polynomials, complex numbers) — that is
math-verify's job. Every step here is a bounded regex or a linear scan, and numbers are capped
in length, so nothing in this module can hang on hostile input (`1e999999999` is not a number to
it). Tested in tests/unit/test_grader.py.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

MAX_NUMBER_CHARS = 64  # longer digit strings go to math-verify, which runs under a time bound
MAX_FAST_CHARS = 2000  # longer answers skip normalisation entirely
# NOTE: math-verify compares floats after rounding to 6 places, so an unequal pair where either
# side has this many decimals is left to it instead of being declared unequal here.
MIN_ROUNDED_DECIMALS = 6

_WRAPPER_CMDS = r"text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname"
_UNITS = (
    r"cm|mm|km|m|in|inch|inches|ft|foot|feet|yd|yards?|miles?|meters?|metres?|centimeters?"
    r"|millimeters?|kilometers?|units?|degrees?|deg|cents?|dollars?|hours?|hrs?|minutes?|mins?"
    r"|seconds?|secs?|days?|weeks?|months?|years?|mph|kg|grams?|g|pounds?|lbs?|ounces?|oz"
    r"|liters?|litres?|ml|gallons?|percent|sq|square|cubic|radians?|rad"
)
_UNIT_TAIL_RE = re.compile(r"^(.*?\S)\s*(?:" + _UNITS + r")(?:\^\{?[23]\}?)?\s*$")
_FRAC_ARG = r"(\{[^{}]*\}|\\[A-Za-z]+|[0-9A-Za-z])"
_FRAC_RE = re.compile(r"\\frac\s*" + _FRAC_ARG + r"\s*" + _FRAC_ARG)
_SQRT_RE = re.compile(r"\\sqrt\s*([0-9A-Za-z])")
_WRAPPER_RE = re.compile(r"\\(?:" + _WRAPPER_CMDS + r")\s*\{([^{}]*)\}")
_ASSIGN_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*(?:=|\\in)\s*([^=]+)$")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DECIMAL_RE = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)$")
_SLASH_RE = re.compile(r"^([+-]?\d+)/([+-]?\d+)$")
_TEX_FRAC_RE = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}$")
_MIXED_RE = re.compile(r"^([+-]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}$")
_CHOICE_RE = re.compile(r"^\(?([A-Ea-e])\)?$")
_WORD_RE = re.compile(r"^[A-Za-z]{3,}$")
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_SURD = r"(?P<coef>\d{0,12})(?:\\sqrt\{(?P<radicand>\d{1,12})\}|\\pi)"
_SURD_RE = re.compile(r"^(?P<sign>[+-]?)" + _SURD + "$")
_SURD_FRAC_RE = re.compile(r"^(?P<sign>[+-]?)\\frac\{" + _SURD + r"\}\{(?P<den>\d{1,12})\}$")
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_INF = {
    "\\infty": float("inf"),
    "+\\infty": float("inf"),
    "-\\infty": float("-inf"),
    "\\inf": float("inf"),
    "-\\inf": float("-inf"),
    "∞": float("inf"),
    "-∞": float("-inf"),
}


def normalize_answer(text: str) -> str:
    """A value-preserving cleaned form of one answer string (spaces kept where LaTeX needs them)."""
    s = text.strip()
    if len(s) > MAX_FAST_CHARS:
        return s
    s = _strip_math_delimiters(s)
    s = re.sub(r",\\!\s*", ",", s)  # MATH writes 10,\!080 for 10080
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:left|right|big|Big|bigl|bigr|Bigl|Bigr)(?![A-Za-z])", "", s)
    s = re.sub(r"\\displaystyle(?![A-Za-z])", "", s)
    s = re.sub(r"(?<!\\)\\[,;: ]|~", " ", s)  # a matrix row break stays
    s = re.sub(r"(?<!\\)\\!", "", s)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = re.sub(r"\\[dt]binom(?![A-Za-z])", r"\\binom", s)
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|°|\\degree(?![A-Za-z])", "", s)
    s = s.replace("\\%", "").replace("%", "")
    for _ in range(3):  # nested wrappers like \text{\textbf{B}}
        s = _WRAPPER_RE.sub(lambda m: m.group(1), s)
    s = _FRAC_RE.sub(
        lambda m: "\\frac{" + _unbrace(m.group(1)) + "}{" + _unbrace(m.group(2)) + "}", s
    )
    s = _SQRT_RE.sub(r"\\sqrt{\1}", s)
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"\s*\.$", "", s).strip()
    m = _ASSIGN_RE.match(s)
    if m:
        s = m.group(1).strip()
    return _drop_thousands(_strip_units(_drop_thousands(s)))


def answer_key(normalized: str) -> str:
    """The string compared for exact equality: no whitespace, `_{5}` written `_5`."""
    key = re.sub(r"\s+", "", normalized)
    return re.sub(r"_\{(\w+)\}", r"_\1", key)


@functools.lru_cache(maxsize=16384)
def _cached_key(text: str) -> str:
    # NOTE: references repeat across a group's rollouts (paper: 32 per problem), answers repeat too
    return answer_key(normalize_answer(text))


def fast_equivalent(pred: str, ref: str) -> bool | None:
    """True/False when decidable without sympy, None when math-verify must decide."""
    if len(pred) > MAX_FAST_CHARS or len(ref) > MAX_FAST_CHARS:
        return None
    kp, kr = _cached_key(pred), _cached_key(ref)
    if not kp or not kr:
        return False if kr and not kp else None
    if kp == kr:
        return True
    num_p, num_r = as_number(kp), as_number(kr)
    if num_p is not None and num_r is not None:
        return _numbers_verdict(kp, kr, num_p, num_r)
    choice_p, choice_r = _CHOICE_RE.match(kp), _CHOICE_RE.match(kr)
    if choice_p and choice_r:
        return choice_p.group(1).upper() == choice_r.group(1).upper()
    if _WORD_RE.match(kp) and _WORD_RE.match(kr):
        return kp.lower() == kr.lower()
    if num_p is not None and _is_non_numeric(kr) or num_r is not None and _is_non_numeric(kp):
        return False
    if _WORD_RE.match(kr) or _CHOICE_RE.match(kr):
        return False  # a word/letter reference against something that is neither
    if _clearly_apart(kp, kr, num_p, num_r):
        return False
    return _structures_verdict(kp, kr, num_p, num_r)


def as_number(key: str) -> Fraction | float | None:
    """An exact value for integers, decimals, a/b, \\frac{a}{b}, mixed numbers and ±\\infty."""
    if len(key) > MAX_NUMBER_CHARS:
        return None
    if key in _INF:
        return _INF[key]
    if _DECIMAL_RE.match(key):
        return Fraction(key)
    m = _SLASH_RE.match(key)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2)))
    m = _TEX_FRAC_RE.match(key)
    if m and int(m.group(3)) != 0:
        value = Fraction(int(m.group(2)), int(m.group(3)))
        return -value if m.group(1) == "-" else value
    m = _MIXED_RE.match(key)
    if m and int(m.group(4)) != 0:
        value = int(m.group(2)) + Fraction(int(m.group(3)), int(m.group(4)))
        return -value if m.group(1) == "-" else value
    return None


def _is_non_numeric(key: str) -> bool:
    """A choice letter, a word, or an expression in a free variable: never equal to a number.

    NOTE: `e` stays undecided (Euler's number: `e^2` vs `7.389056` is math-verify's call).
    """
    if _CHOICE_RE.match(key) or _WORD_RE.match(key):
        return True
    letters = set(_COMMAND_RE.sub("", key)) & _LETTERS
    if letters - {"e"} or "\\pm" in key or "\\cup" in key:
        return True
    inner = key[1:-1] if key[:1] in "([{" and key[-1:] in ")]}" else key
    return len(_split_top_level(inner)) > 1  # a tuple, interval or list


def _clearly_apart(kp: str, kr: str, num_p, num_r) -> bool:
    """Numbers and simple surds/multiples of pi whose float values are far apart.

    Only ever used to say "unequal": closeness is left to math-verify's exact checks.
    """
    value_p = float(num_p) if isinstance(num_p, Fraction) else _surd_value(kp)
    value_r = float(num_r) if isinstance(num_r, Fraction) else _surd_value(kr)
    if value_p is None or value_r is None:
        return False
    return abs(value_p - value_r) > 1e-3 * max(1.0, abs(value_r))


def _surd_value(key: str) -> float | None:
    """Float of `[-]A\\sqrt{B}`, `[-]A\\pi` and the same over an integer (`\\frac{A\\sqrt{B}}{C}`)."""
    m = _SURD_RE.match(key) or _SURD_FRAC_RE.match(key)
    if not m:
        return None
    sign, coef, radicand = m.group("sign"), m.group("coef"), m.group("radicand")
    value = (int(coef) if coef else 1) * (math.sqrt(int(radicand)) if radicand else math.pi)
    denominator = int(m.groupdict().get("den") or 1)
    if denominator == 0:
        return None
    return (-value if sign == "-" else value) / denominator


def _numbers_verdict(
    kp: str, kr: str, num_p: Fraction | float, num_r: Fraction | float
) -> bool | None:
    if num_p == num_r:
        return True
    if _num_decimals(kp) >= MIN_ROUNDED_DECIMALS or _num_decimals(kr) >= MIN_ROUNDED_DECIMALS:
        return None
    return False


def _num_decimals(key: str) -> int:
    _, dot, frac = key.partition(".")
    return len(frac) if dot and frac.isdigit() else 0


def _structures_verdict(kp: str, kr: str, num_p, num_r) -> bool | None:
    """Tuples, intervals, unions, unordered lists and matrices whose entries are all numbers."""
    sp, sr = _as_structure(kp), _as_structure(kr)
    if sr is not None and sp is None and num_p is not None:
        return False  # a single number against a tuple/interval/list
    if sp is not None and sr is None and num_r is not None:
        return False
    if sp is None or sr is None:
        return None
    kind_p, shape_p, items_p = sp
    kind_r, shape_r, items_r = sr
    if kind_p[0] != kind_r[0]:
        return None  # e.g. a tuple against an unordered list: math-verify's rules apply
    if kind_r[0] == "list":
        return sorted(items_p) == sorted(items_r)
    return kind_p == kind_r and shape_p == shape_r and items_p == items_r


def _as_structure(key: str):
    """(kind, shape, numeric items) or None. Kinds: ('seq', brackets...), ('list',), ('matrix',)."""
    if "=" in key or "<" in key or ">" in key:
        return None
    if key.startswith("\\begin{pmatrix}") and key.endswith("\\end{pmatrix}"):
        rows = key[len("\\begin{pmatrix}") : -len("\\end{pmatrix}")].split("\\\\")
        cells = [row.split("&") for row in rows]
        items = _numbers([c for row in cells for c in row])
        shape = tuple(len(row) for row in cells)
        return (("matrix",), shape, items) if items is not None else None
    pieces = key.split("\\cup")
    if len(pieces) > 1 or key[:1] in "([" and key[-1:] in ")]":
        return _as_intervals(pieces)
    parts = _split_top_level(key)
    if len(parts) < 2:
        return None
    items = _numbers(parts)
    return (("list",), (len(parts),), items) if items is not None else None


def _as_intervals(pieces: list[str]):
    brackets, shape, items = [], [], []
    for piece in pieces:
        if len(piece) < 2 or piece[0] not in "([" or piece[-1] not in ")]":
            return None
        parts = _split_top_level(piece[1:-1])
        values = _numbers(parts)
        if values is None or len(parts) < 2:
            return None
        brackets.append(piece[0] + piece[-1])
        shape.append(len(parts))
        items.extend(values)
    return ("seq", *brackets), tuple(shape), items


def _numbers(parts: list[str]) -> list | None:
    values = [as_number(p) for p in parts]
    return None if any(v is None for v in values) else values


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside (), [] or {}."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _strip_math_delimiters(s: str) -> str:
    for open_, close in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(open_) and s.endswith(close) and len(s) >= len(open_) + len(close):
            return s[len(open_) : len(s) - len(close)].strip()
    return s


def _strip_units(s: str) -> str:
    """Drop trailing unit words only when what stays is a plain number (`15 cm^2` -> `15`)."""
    rest = s
    for _ in range(3):  # e.g. "12 square feet"
        m = _UNIT_TAIL_RE.match(rest)
        if not m:
            break
        rest = m.group(1).strip()
        if as_number(answer_key(_drop_thousands(rest))) is not None:
            return rest
    return s


def _drop_thousands(s: str) -> str:
    """`58,500` -> `58500`; a list like `3, 5, 7` or `1,-2` keeps its commas."""
    return s.replace(",", "") if _THOUSANDS_RE.match(s) else s


def _unbrace(arg: str) -> str:
    return arg[1:-1] if arg.startswith("{") else arg
