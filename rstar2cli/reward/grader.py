"""Binary math reward: extract the boxed answer, compare it with the reference, bounded in time.

rStar2-Agent's reward (GRPO-RoC): 1 when the `\\boxed{}` answer (inside the `<answer>` block)
equals the reference under a rule-based verifier, else 0; truncated responses get 0.

- `is_equivalent(pred, ref)`: fast exact path (`normalize.fast_equivalent`), then math-verify with
  its own SIGALRM time limits. In-process, so main thread only.
- `Grader`: the batch API for the RL loop and `eval`. The fast path runs in the caller (no
  sympy, cannot hang); only undecided pairs go to worker processes, where math-verify runs with its
  alarms off and the parent enforces `timeout_s` by killing the worker. A killed check is
  incorrect with status "timeout", a dead worker gives "crash"; either way the worker is
  replaced and the rest of the batch goes on. Identical undecided pairs in one batch are checked
  once. Works from any thread (no alarms in the caller), one batch at a time per `Grader`.

What it does not do: answer extraction rules (those live in `rstar2cli.protocol`), format
rewards, or partial credit. Tested in tests/unit/test_grader.py; benchmarks/grading.py measures it
against plain math-verify.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from rstar2cli.protocol import extract_answer, last_boxed
from rstar2cli.reward.answer_normalize import fast_equivalent, normalize_answer

GRADE_STATUSES = ("ok", "no_answer", "timeout", "crash", "truncated")
# NOTE: "budget" = the response-token budget ran out mid-answer; "max_turns" = cut off while still
# calling tools. Both are truncations in the paper's sense and score 0 when `zero_truncated`.
TRUNCATED_FINISH_REASONS = ("budget", "max_turns")
MAX_WORKER_START_S = 120.0
WARMUP_PAIRS = (
    ("\\frac{\\sqrt{12}}{2}", "\\sqrt{3}"),
    ("(x+1)^2", "x^2+2x+1"),
    ("(1, \\frac{\\pi}{2})", "\\left(1, \\frac{\\pi}{2}\\right)"),
    ("(-\\infty, 2] \\cup (3, \\infty)", "(-\\infty,2]\\cup(3,\\infty)"),
    ("1 - 2i", "-2i+1"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("y = 2x", "2x"),
)
MAX_START_FAILURES = 3


@dataclass
class GradeResult:
    correct: bool
    extracted: str | None
    status: str  # one of GRADE_STATUSES


def reference_answer(reference: object) -> str:
    """The answer part of a reference: GSM8K's `... #### 18` and `\\boxed{}` wrappers are unwrapped."""
    ref = str(reference).strip()
    if "####" in ref:
        ref = ref.rsplit("####", 1)[1].strip()
    boxed = last_boxed(ref) if "\\boxed" in ref or "\\fbox" in ref else None
    return boxed if boxed is not None else ref


def math_verify_equal(pred: str, ref: str, timeout_s: int | None = 5) -> bool:
    """math-verify on the normalised answers; `timeout_s=None` turns its SIGALRM limits off."""
    from math_verify import parse, verify

    gold = parse("\\boxed{" + normalize_answer(ref) + "}", parsing_timeout=timeout_s)
    target = parse("\\boxed{" + normalize_answer(pred) + "}", parsing_timeout=timeout_s)
    if not gold or not target:
        return False
    return bool(verify(gold, target, timeout_seconds=timeout_s))


def is_equivalent(pred: str, ref: str) -> bool:
    """Is the answer `pred` equal to the reference `ref`? Main thread only (math-verify alarms)."""
    ref = reference_answer(ref)
    verdict = fast_equivalent(pred, ref)
    if verdict is not None:
        return verdict
    return math_verify_equal(pred, ref)


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    conn: Connection
    deadline: float  # start-up deadline until ready, then the current check's deadline
    ready: bool = False
    job: tuple[str, str] | None = None


@dataclass
class _SlowRun:
    """Book-keeping of one batch's undecided pairs while workers check them."""

    pending: deque = field(default_factory=deque)
    outcome: dict = field(default_factory=dict)  # (pred, ref) -> (correct, status)


class Grader:
    """Batch grader with `num_workers` checker processes; use as a context manager or `close()`.

    `strict=True` is the paper's reward rule: only a `\\boxed{}` inside the `<answer>` block counts.
    `strict=False` also accepts the last `\\boxed{}` anywhere (for grading other models' output).
    """

    def __init__(
        self,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        strict: bool = False,
        zero_truncated: bool = True,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.strict = strict
        self.zero_truncated = zero_truncated
        self.num_replaced = 0
        self._start_failures = 0
        self._ctx = mp.get_context("spawn")  # no fork: callers hold threads (engines, Ray, asyncio)
        self._workers: list[_Worker] = [self._start_worker() for _ in range(num_workers)]
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    def grade_batch(
        self, items: list[tuple[str, str]], finish_reasons: list[str | None] | None = None
    ) -> list[GradeResult]:
        """Grade (response_text, reference) pairs; results in input order, never raises per item."""
        if finish_reasons is not None and len(finish_reasons) != len(items):
            raise ValueError("finish_reasons must be as long as items")
        results: list[GradeResult | None] = []
        undecided: dict[int, tuple[str, str]] = {}
        for i, (text, reference) in enumerate(items):
            reason = finish_reasons[i] if finish_reasons is not None else None
            result, pair = self._grade_in_caller(text, reference, reason)
            results.append(result)
            if pair is not None:
                undecided[i] = pair
        if undecided:
            outcome = self._check_in_workers(list(dict.fromkeys(undecided.values())))
            for i, pair in undecided.items():
                correct, status = outcome[pair]
                results[i] = GradeResult(correct, pair[0], status)
        return results  # type: ignore[return-value]

    def score(self, response_text: str, reference: str, finish_reason: str | None = None) -> float:
        """1.0 or 0.0 for one response (the paper's binary reward)."""
        result = self.grade_batch([(response_text, reference)], [finish_reason])[0]
        return 1.0 if result.correct else 0.0

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- caller side --------------------------------------------------------------------------

    def _grade_in_caller(
        self, text: str, reference: str, finish_reason: str | None
    ) -> tuple[GradeResult | None, tuple[str, str] | None]:
        extracted = extract_answer(text or "", strict=self.strict)
        if self.zero_truncated and finish_reason in TRUNCATED_FINISH_REASONS:
            return GradeResult(False, extracted, "truncated"), None
        if extracted is None:
            return GradeResult(False, None, "no_answer"), None
        ref = reference_answer(reference)
        verdict = fast_equivalent(extracted, ref)
        if verdict is not None:
            return GradeResult(verdict, extracted, "ok"), None
        return None, (extracted, ref)

    # -- worker side --------------------------------------------------------------------------

    def _check_in_workers(self, pairs: list[tuple[str, str]]) -> dict:
        if not self._workers:
            raise RuntimeError("the grader is closed")
        run = _SlowRun(pending=deque(pairs))
        while run.pending or any(w.job is not None for w in self._workers):
            self._dispatch(run)
            watched = [w for w in self._workers if w.job is not None or not w.ready]
            now = time.monotonic()
            wait_s = max(0.0, min(w.deadline for w in watched) - now)
            answered = wait([w.conn for w in watched], timeout=wait_s)
            for worker in watched:
                if worker.conn in answered:
                    self._receive(worker, run)
                elif time.monotonic() >= worker.deadline:
                    self._expire(worker, run)
        return run.outcome

    def _dispatch(self, run: _SlowRun) -> None:
        for worker in self._workers:
            if not (worker.ready and worker.job is None and run.pending):
                continue
            pair = run.pending.popleft()
            try:
                worker.conn.send(pair)
            except (BrokenPipeError, OSError):  # died while idle: not this pair's fault
                run.pending.appendleft(pair)
                self._replace(worker)
                continue
            worker.job = pair
            worker.deadline = time.monotonic() + self.timeout_s

    def _receive(self, worker: _Worker, run: _SlowRun) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            if worker.job is not None:
                run.outcome[worker.job] = (False, "crash")
            else:
                self._note_start_failure("a checker process exited while starting")
            self._replace(worker)
            return
        if not worker.ready:
            if message[1] is not None:
                raise RuntimeError(f"grader worker cannot start: {message[1]}")
            worker.ready = True
            self._start_failures = 0
            return
        run.outcome[worker.job] = message
        worker.job = None

    def _expire(self, worker: _Worker, run: _SlowRun) -> None:
        if worker.job is not None:
            run.outcome[worker.job] = (False, "timeout")
        else:
            self._note_start_failure(
                f"a checker process did not start in {MAX_WORKER_START_S:.0f}s"
            )
        self._replace(worker)

    def _note_start_failure(self, why: str) -> None:
        self._start_failures += 1
        if self._start_failures > MAX_START_FAILURES:
            raise RuntimeError(f"grader workers keep failing: {why}")

    def _start_worker(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=_worker_main, args=(child_conn,), daemon=True)
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn, deadline=time.monotonic() + MAX_WORKER_START_S)

    def _replace(self, worker: _Worker) -> None:
        _stop_worker(worker)
        index = self._workers.index(worker)
        self._workers[index] = self._start_worker()
        self.num_replaced += 1


def _stop_worker(worker: _Worker) -> None:
    if worker.process.is_alive():
        worker.process.kill()
    worker.process.join(timeout=5)
    worker.conn.close()


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        _stop_worker(worker)
    workers.clear()


def _worker_main(conn: Connection) -> None:
    """Checker process: math-verify with its alarms off; the parent kills us if a check hangs."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        import math_verify  # noqa: F401  (import cost paid before reporting ready)

        logging.getLogger("math_verify").setLevel(logging.ERROR)
        # math-verify logs its "timeout is disabled" warning through this module logger too
        logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)
    except Exception as exc:  # a missing dependency must surface in the parent, once
        conn.send(("ready", f"{type(exc).__name__}: {exc}"))
        return
    for pred, ref in WARMUP_PAIRS:  # sympy loads much lazily: pay it before the first real check
        math_verify_equal(pred, ref, timeout_s=None)
    conn.send(("ready", None))
    while True:
        try:
            pred, ref = conn.recv()
        except (EOFError, OSError):
            return
        try:
            verdict = (math_verify_equal(pred, ref, timeout_s=None), "ok")
        except Exception:
            verdict = (False, "crash")
        conn.send(verdict)
