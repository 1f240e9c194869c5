"""Tool-use transcripts built from the synthetic sets: arith (tiny default) and words.

For a row `{"question": "Compute 37*41+5.", "answer": "1522"}` the transcript is, in the
protocol's own layout (`rstar2cli.sft.data.render_chat` turns it into the RL prompt + turns):

    <reason> [prompt]  I will compute 37*41+5 with Python.
                       <tool_call>{... "code": "print(37*41+5)" ...}</tool_call><|im_end|>
    [tool response: 1522]
    <reason> [masked]  The tool printed 1522.</reason>
                       <answer>\\boxed{1522}</answer><|im_end|>

A share `direct_fraction` answers at once, without the tool ("mental arithmetic" the model
cannot actually do, so at inference such answers are mostly wrong): the SFT'd model then uses the
tool only some of the time, and RL has the paper's lesson to learn, that calling the tool pays.
Of the transcripts that use the tool, a share `error_fraction` first makes a call that fails (a
misspelt variable: NameError, or an unclosed parenthesis: SyntaxError), reads the real traceback
and then makes the corrected call, so RL starts from correct trajectories that contain tool errors
(GRPO-RoC then learns to avoid them). Every tool output is real: the code is executed here,
in-process, compiled as `main.py` with tracebacks trimmed to the user's frames like
`sandboxd.runner` prints them. That is safe because the code is arithmetic this module wrote
itself; it never runs model output.

A words row (`rstar2cli.data.words`) carries its reference solution (`solution`, or inside
the `meta` JSON that prepare-data writes): a few assignments of the question's numbers, one line
per step and a `print`. Its transcript writes that code in one call (after a broken one, in a
share `error_fraction`: a misspelt variable or an unclosed `print(`), reads the printed number
and boxes it; words transcripts never answer without the tool.

It does not tokenize, and does not read files. Tested in tests/unit/test_sft_data.py and
tests/unit/test_words.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import linecache
import random
import re
import traceback

from rstar2cli import protocol as P
from rstar2cli.sft.convert import Call, Chat, ConvertError, Message

_FILENAME = "main.py"  # what sandboxd.runner calls the snippet, so tracebacks read the same
_QUESTION = re.compile(r"Compute\s+(.+?)\.?\s*")
_PLANS = (
    "I will compute {expr} with Python.",
    "Let me evaluate {expr} with the Python tool.",
)
_FIXES = (
    "The code failed. Let me fix it.",
    "That call had an error; I will correct it.",
)
_FINALS = ("The tool printed {out}.", "The result is {out}.")
_WORD_PLANS = (
    "I will write the numbers from the problem as Python variables and compute the answer.",
    "Let me put the quantities into Python and work out the result.",
)
_DIRECT = ("I can do this in my head: {expr} = {out}.", "Mental arithmetic: {expr} = {out}.")


def expression_of(question: str) -> str:
    m = _QUESTION.fullmatch(question.strip())
    if not m:
        raise ConvertError(f"not an arith question (expected 'Compute <expr>.'): {question[:60]!r}")
    return m.group(1)


def run_code(code: str) -> tuple[str, str, str]:
    """(status, stdout, stderr) of a trusted snippet, executed here like the sandbox runs it."""
    out = io.StringIO()
    old = linecache.cache.get(_FILENAME)
    linecache.cache[_FILENAME] = (len(code), None, code.splitlines(True), _FILENAME)
    try:
        compiled = compile(code, _FILENAME, "exec", dont_inherit=True)
        with contextlib.redirect_stdout(out):
            exec(compiled, {"__name__": "__main__"})  # noqa: S102 - our own arithmetic, not model output
        return "ok", out.getvalue(), ""
    except Exception as exc:  # noqa: BLE001 - the error text is the tool output
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != _FILENAME:
            tb = tb.tb_next  # NOTE: show only main.py frames, as sandboxd.runner does
        return "error", out.getvalue(), "".join(traceback.format_exception(type(exc), exc, tb))
    finally:
        if old is None:
            linecache.cache.pop(_FILENAME, None)
        else:
            linecache.cache[_FILENAME] = old


def broken_code(expr: str, rng: random.Random) -> str:
    if rng.random() < 0.5:
        return f"result = {expr}\nprint(reslt)"  # NameError
    return f"print({expr}"  # SyntaxError: '(' was never closed


def solution_of(row: dict) -> str:
    """The reference solution of a words row: its `solution`, or the one in its `meta` JSON."""
    code = row.get("solution")
    if code is None and isinstance(row.get("meta"), str):
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            code = json.loads(row["meta"]).get("solution")
    if not isinstance(code, str) or not code.strip():
        raise ConvertError("a words row needs its reference solution ('solution' or meta.solution)")
    return code


def broken_solution(code: str, rng: random.Random) -> str:
    """The solution with its last line broken: a misspelt name (NameError) or no `)` (SyntaxError)."""
    *head, last = code.splitlines()
    names = set(re.findall(r"[A-Za-z_]\w*", code))
    printed = re.fullmatch(r"print\((\w+)\)", last)
    if printed and rng.random() < 0.5:
        name = printed.group(1)
        typo = name[:-2] + name[-1] if len(name) > 2 else name + name[-1]
        if typo not in names:
            return "\n".join([*head, f"print({typo})"])
    return "\n".join([*head, last[:-1]])  # NOTE: every solution ends with a print(...) line


def _call_turn(text: str, code: str) -> tuple[Message, Message]:
    status, stdout, stderr = run_code(code)
    call = Message("assistant", text, [Call(P.TOOL_NAME, {"code": code})])
    return call, Message("tool", P.format_tool_output(status, stdout, stderr))


def _final_turn(reasoning: str, answer: str) -> Message:
    answer_block = f"{P.ANSWER_OPEN}\\boxed{{{answer}}}{P.ANSWER_CLOSE}"
    return Message("assistant", f"{reasoning}{P.REASON_CLOSE}\n{answer_block}")


def make_transcript(
    row: dict,
    rng: random.Random,
    with_error: bool,
    template: str = "paper",
    direct: bool = False,
    kind: str = "arith",
) -> Chat:
    question, answer = str(row["question"]), str(row["answer"]).strip()
    user = P.USER_TEMPLATE.format(question=question)
    if template == "release":
        user += P.RELEASE_USER_SUFFIX  # NOTE: as render_prompt does; a test checks they agree
    messages = [Message("system", P.system_text(template)), Message("user", user)]
    # NOTE: the paper template opens every assistant turn with <reason> itself; under the release
    # template the model writes it.
    opener = "" if P.assistant_prefix(template) else P.REASON_OPEN
    if kind == "words":
        code = solution_of(row)
        plan = rng.choice(_WORD_PLANS)
        broken = broken_solution(code, rng) if with_error else ""
    else:
        expr = expression_of(question)
        if direct:
            text = rng.choice(_DIRECT).format(expr=expr, out=answer)
            return Chat([*messages, _final_turn(opener + text, answer)])
        code = f"print({expr})"
        plan = rng.choice(_PLANS).format(expr=expr)
        broken = broken_code(expr, rng) if with_error else ""
    if broken:
        messages += _call_turn(opener + plan, broken)
        if messages[-1].content.strip() == answer:
            raise ConvertError("the broken call did not fail")
        plan = rng.choice(_FIXES)
    messages += _call_turn(opener + plan, code)
    out = messages[-1].content.strip()
    if out != answer:
        raise ConvertError(f"tool output {out[:40]!r} differs from the reference answer {answer!r}")
    final = rng.choice(_FINALS).format(out=out)
    return Chat([*messages, _final_turn(opener + final, out)])


def make_transcripts(
    rows: list[dict],
    error_fraction: float,
    seed: int,
    template: str = "paper",
    direct_fraction: float = 0.0,
    kind: str = "arith",
) -> list[Chat | ConvertError]:
    """One transcript (or the reason there is none) per row, in order; deterministic in `seed`.
    `kind` is the set the rows come from (arith or words); `direct_fraction` applies to arith."""
    rng = random.Random(f"sft-transcripts:{seed}")
    direct_rng = random.Random(f"sft-direct:{seed}")
    out: list[Chat | ConvertError] = []
    for row in rows:
        with_error = rng.random() < error_fraction
        # NOTE: drawn from its own stream, so direct_fraction=0 keeps the transcripts of before
        direct = direct_rng.random() < direct_fraction
        try:
            if "question" not in row or "answer" not in row:
                raise ConvertError(f"a {kind} row needs 'question' and 'answer'")
            direct = direct and kind == "arith"
            out.append(
                make_transcript(
                    row=row,
                    rng=rng,
                    with_error=with_error and not direct,
                    template=template,
                    direct=direct,
                    kind=kind,
                )
            )
        except ConvertError as exc:
            out.append(exc)
    return out
