"""Tool-use transcripts for the tiny default, built from synthetic arith problems.

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

It does not tokenize, and does not read files. Tested in tests/unit/test_sft_data.py.
"""

from __future__ import annotations

import contextlib
import io
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


def _call_turn(text: str, code: str) -> tuple[Message, Message]:
    status, stdout, stderr = run_code(code)
    call = Message("assistant", text, [Call(P.TOOL_NAME, {"code": code})])
    return call, Message("tool", P.format_tool_output(status, stdout, stderr))


def _final_turn(reasoning: str, answer: str) -> Message:
    answer_block = f"{P.ANSWER_OPEN}\\boxed{{{answer}}}{P.ANSWER_CLOSE}"
    return Message("assistant", f"{reasoning}{P.REASON_CLOSE}\n{answer_block}")


def make_transcript(
    row: dict, rng: random.Random, with_error: bool, template: str = "paper", direct: bool = False
) -> Chat:
    question, answer = str(row["question"]), str(row["answer"]).strip()
    expr = expression_of(question)
    user = P.USER_TEMPLATE.format(question=question)
    if template == "release":
        user += P.RELEASE_USER_SUFFIX  # NOTE: as render_prompt does; a test checks they agree
    messages = [Message("system", P.system_text(template)), Message("user", user)]
    # NOTE: the paper template opens every assistant turn with <reason> itself; under the release
    # template the model writes it.
    opener = "" if P.assistant_prefix(template) else P.REASON_OPEN
    if direct:
        text = rng.choice(_DIRECT).format(expr=expr, out=answer)
        return Chat([*messages, _final_turn(opener + text, answer)])
    plan = rng.choice(_PLANS).format(expr=expr)
    if with_error:
        messages += _call_turn(opener + plan, broken_code(expr, rng))
        if messages[-1].content.strip() == answer:
            raise ConvertError("the broken call did not fail")
        plan = rng.choice(_FIXES)
    messages += _call_turn(opener + plan, f"print({expr})")
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
) -> list[Chat | ConvertError]:
    """One transcript (or the reason there is none) per row, in order; deterministic in `seed`."""
    rng = random.Random(f"sft-transcripts:{seed}")
    direct_rng = random.Random(f"sft-direct:{seed}")
    out: list[Chat | ConvertError] = []
    for row in rows:
        with_error = rng.random() < error_fraction
        # NOTE: drawn from its own stream, so direct_fraction=0 keeps the transcripts of before
        direct = direct_rng.random() < direct_fraction
        try:
            if "question" not in row or "answer" not in row:
                raise ConvertError("an arith row needs 'question' and 'answer'")
            out.append(
                make_transcript(
                    row=row,
                    rng=rng,
                    with_error=with_error and not direct,
                    template=template,
                    direct=direct,
                )
            )
        except ConvertError as exc:
            out.append(exc)
    return out
