"""Is a predicted answer equivalent to the gold? Fast paths, then math-verify in supervised workers."""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import re
import select
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from conductor_pipeline.grading.extraction import (
    PLAIN_NUMBER_RE,
    PROSE_RE,
    balanced_brace_end,
    extract_answer,
    normalize_gold,
)

logger = logging.getLogger(__name__)

# --- knobs -------------------------------------------------------------------------------------
# Default per-comparison deadline; math-verify normally answers in 1-100 ms, so 2 s only cuts
# pathological inputs.
DEFAULT_TIMEOUT_S = 2.0
# Longer texts are not answers but runaway generations; math-verify would spend its whole
# deadline on them and they are never equal to a short gold.
MAX_ANSWER_CHARS = 1_000
# A fresh worker imports sympy + math-verify (about 1 s on an idle core, several on a busy one).
WORKER_START_TIMEOUT_S = 60.0
# Upper bound on worker processes kept per grader process; concurrent callers beyond it queue.
MAX_WORKERS = 8
# Entries kept by the (pred, gold) verdict cache; a probing run repeats answers a lot.
CACHE_SIZE = 200_000
_FRACTION_RE = re.compile(r"^([+-]?)\\frac\{(\d+)\}\{(\d+)\}$|^([+-]?)(\d+)/(\d+)$")
_CHOICE_RE = re.compile(r"^(?:\\text\{)?\(?([A-Ea-e])\)?\}?[.:]?$")
_UNIT_WORDS_RE = re.compile(r"^(.*?\d)\s*(?:\\text\{\s*[a-zA-Z ]+\}|[a-zA-Z][a-zA-Z ]*)$")
# Anything that could make text compute to a number it does not spell out: operators, LaTeX,
# brackets, non-ASCII (x, sqrt, superscripts), exponents, digits separated by blanks ("2 3").
_COULD_COMPUTE_RE = re.compile(r"[^\x00-\x7f]|[\\^*/+()\[\]{}!%|<>_-]|\d\s+\d|\d[eE]|\d\s*,\s*\d")
_NUMBER_TOKEN_RE = re.compile(r"\d+(?:\.\d+)?")
# "2, 500" lists two numbers (boxes read together are joined this way); thousands separators
# never have a blank after the comma.
_LISTING_COMMA_RE = re.compile(r"\d\s*,\s+\d")
_NON_UNIT_WORDS = {"pi", "i", "e", "sqrt", "x", "y", "z", "n", "k"}


def _canonical(answer: str) -> str:
    """A spelling-insensitive form used only to decide *equal*, never *different*."""
    text = answer.strip()
    for _ in range(3):
        stripped = text
        if len(text) >= 2 and text[0] == "$" and text[-1] == "$":
            stripped = text.strip("$")
        elif text.startswith("\\(") and text.endswith("\\)"):
            stripped = text[2:-2]
        elif text.startswith("\\[") and text.endswith("\\]"):
            stripped = text[2:-2]
        elif text.startswith(("\\boxed{", "\\text{")) and balanced_brace_end(text, text.index("{")) == len(
            text
        ):
            stripped = text[text.index("{") + 1 : -1]
        if stripped == text:
            break
        text = stripped.strip()
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = text.replace("\\left", "").replace("\\right", "").replace("−", "-")
    text = re.sub(r"\\[!,;: ]", "", text)
    text = re.sub(r"\s+", "", text)
    text = text.rstrip(".")
    if text.startswith("\\$"):
        text = text[2:]
    elif text.startswith("$") and text.count("$") == 1:
        text = text[1:]
    return text


def _as_number(text: str) -> Fraction | None:
    """Exact value of a plain number, ``a/b`` or ``\\frac{a}{b}``, else None."""
    if PLAIN_NUMBER_RE.match(text):
        return Fraction(text.replace(",", ""))
    match = _FRACTION_RE.match(text)
    if match:
        sign, numerator, denominator = (
            (match.group(1), match.group(2), match.group(3))
            if match.group(2) is not None
            else (match.group(4), match.group(5), match.group(6))
        )
        if int(denominator) == 0:
            return None
        value = Fraction(int(numerator), int(denominator))
        return -value if sign == "-" else value
    return None


def _strip_units(text: str) -> str:
    """``18dollars`` / ``45\\text{cm}`` -> ``18`` / ``45`` when what is left is a number."""
    match = _UNIT_WORDS_RE.match(text)
    if match and PLAIN_NUMBER_RE.match(match.group(1)):
        words = text[len(match.group(1)) :].lower()
        if words.strip() not in _NON_UNIT_WORDS:
            return match.group(1)
    return text


def _fast_verdict(predicted: str, gold: str) -> bool | None:
    """True/False when plain comparison settles it, None when math-verify must decide."""
    pred_c, gold_c = _canonical(predicted), _canonical(gold)
    if not pred_c:
        return False
    if pred_c == gold_c:
        return True
    gold_choice, pred_choice = _CHOICE_RE.match(gold_c), _CHOICE_RE.match(pred_c)
    if gold_choice and pred_choice and gold_choice.group(1).isupper():
        return gold_choice.group(1).upper() == pred_choice.group(1).upper()
    gold_number = _as_number(gold_c)
    if gold_number is None:
        return None
    pred_number = None
    if not _LISTING_COMMA_RE.search(predicted):
        pred_number = _as_number(pred_c)
        if pred_number is None:
            pred_number = _as_number(_strip_units(pred_c))
    if pred_number is None:
        if not _COULD_COMPUTE_RE.search(predicted) and all(
            Fraction(token) != gold_number for token in _NUMBER_TOKEN_RE.findall(predicted)
        ):
            # Words and literal numbers only, none of them the gold: math-verify can only read
            # one of those numbers or a product of symbols, so it cannot say equal either.
            return False
        return None
    if pred_number == gold_number:
        return True
    exact = "." not in pred_c and "." not in gold_c
    if exact or abs(pred_number - gold_number) > Fraction(1, 10**5):
        # Different exact numbers, or decimals far apart: math-verify's 6-digit rounding
        # cannot make them equal.
        return False
    return None


# --- math-verify in supervised worker processes ------------------------------------------------


def _latex_for_parse(answer: str) -> str:
    """Give math-verify a delimiter so it reads the text as LaTeX (bare ``\\frac12`` is ignored).

    Prose ("The game lasted 53 minutes") stays bare: as LaTeX every letter would become a
    symbol, while bare text lets math-verify take its last number.
    """
    text = answer.strip()
    if "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text or PROSE_RE.search(text):
        return text
    return f"${text}$"


class _Worker:
    """One child process running math-verify on requests read line by line from stdin."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "conductor_pipeline.grading._math_verify_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
            bufsize=1,
            close_fds=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        ready = self._read_line(WORKER_START_TIMEOUT_S)
        if ready != "ready":
            self.kill()
            raise RuntimeError("grading worker failed to start")

    def _read_line(self, timeout_s: float) -> str | None:
        assert self.process.stdout is not None
        readable, _, _ = select.select([self.process.stdout], [], [], max(timeout_s, 0.0))
        if not readable:
            return None
        line = self.process.stdout.readline()
        return line.rstrip("\n") if line else None

    def ask(self, predicted: str, gold: str, timeout_s: float) -> tuple[bool | None, bool]:
        """(verdict or None on timeout, whether the worker can be reused).

        The worker stops itself with an interval timer a little before ``timeout_s`` and says
        so; if it does not answer by ``timeout_s`` (stuck in C code, dead) it must be killed.
        """
        assert self.process.stdin is not None
        request = json.dumps({"pred": predicted, "gold": gold, "timeout_s": timeout_s})
        try:
            self.process.stdin.write(request + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return None, False
        line = self._read_line(timeout_s)
        if line == "timeout":
            return None, True
        if line not in ("1", "0"):
            return None, False
        return line == "1", True

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a killed child always exits
            logger.warning("grading worker %s did not exit", self.process.pid)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


class _WorkerPool:
    """Idle workers shared by all threads of this process; grows on demand up to MAX_WORKERS."""

    def __init__(self) -> None:
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._lock = threading.Lock()
        self._count = 0
        self._slots = threading.BoundedSemaphore(MAX_WORKERS)
        self._owner_pid = os.getpid()

    def _reset_after_fork(self) -> None:
        # Workers started by a parent process belong to it; a forked child starts its own.
        if os.getpid() != self._owner_pid:
            self._idle = queue.LifoQueue()
            self._count = 0
            self._slots = threading.BoundedSemaphore(MAX_WORKERS)
            self._lock = threading.Lock()
            self._owner_pid = os.getpid()

    def _checkout(self) -> _Worker:
        self._slots.acquire()
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        try:
            worker = _Worker()
        except BaseException:
            self._slots.release()
            raise
        with self._lock:
            self._count += 1
        return worker

    def _checkin(self, worker: _Worker, healthy: bool) -> None:
        if healthy and worker.alive():
            self._idle.put(worker)
        else:
            worker.kill()
            with self._lock:
                self._count -= 1
        self._slots.release()

    def verify(self, predicted: str, gold: str, timeout_s: float) -> bool | None:
        self._reset_after_fork()
        worker = self._checkout()
        verdict: bool | None = None
        healthy = False
        try:
            verdict, healthy = worker.ask(predicted, gold, timeout_s)
        finally:
            self._checkin(worker, healthy=healthy)
        return verdict

    def warm(self, count: int) -> None:
        self._reset_after_fork()
        workers = [self._checkout() for _ in range(min(count, MAX_WORKERS))]
        for worker in workers:
            self._checkin(worker, healthy=True)

    def close(self) -> None:
        if os.getpid() != self._owner_pid:
            return
        while True:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                break
            worker.kill()


_POOL = _WorkerPool()
atexit.register(_POOL.close)


def warm_up(workers: int = 1) -> None:
    """Start math-verify workers now, so the first graded answers do not pay their start-up."""
    _POOL.warm(workers)


def math_verify_verdict(predicted: str, gold: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool | None:
    """math-verify alone (no fast paths, no cache) under a hard deadline; None on timeout."""
    if len(predicted) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        return False
    return _POOL.verify(_latex_for_parse(predicted), _latex_for_parse(gold), timeout_s)


@lru_cache(maxsize=CACHE_SIZE)
def _cached_math_verify(predicted: str, gold: str, timeout_s: float) -> bool:
    verdict = math_verify_verdict(predicted, gold, timeout_s=timeout_s)
    if verdict is None:
        logger.info("math-verify overran %.1fs; graded as not equivalent", timeout_s)
        return False
    return verdict


def is_equivalent(predicted: str | None, gold: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether ``predicted`` is mathematically the gold answer; None is never equivalent.

    Safe from any thread or process; the comparison is cut at ``timeout_s`` (the very first call
    in a process additionally waits for a math-verify worker to start, see ``warm_up``).
    """
    settled = _settle(predicted, gold)
    if isinstance(settled, bool):
        return settled
    return _cached_math_verify(*settled, float(timeout_s))


def _settle(predicted: str | None, gold: str) -> bool | tuple[str, str]:
    """The verdict when no math-verify call is needed, else the (answer, gold) pair it must verify."""
    if predicted is None:
        return False
    gold = normalize_gold(gold)
    fast = _fast_verdict(predicted, gold)
    if fast is not None:
        return fast
    if len(predicted) > MAX_ANSWER_CHARS:
        return False
    return predicted.strip(), gold


# --- batch API ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grade:
    """One graded response: what was read as its answer, and whether that answer is right."""

    extracted: str | None
    correct: bool


def grade(response: str | None, gold: str) -> Grade:
    """Extract the answer from one response and grade it against the gold."""
    extracted = extract_answer(response) if response else None
    return Grade(extracted=extracted, correct=is_equivalent(extracted, gold))


def grade_many(
    responses: Sequence[str | None],
    golds: Sequence[str],
    *,
    processes: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[Grade]:
    """Grade many responses: fast paths in-process, math-verify residue on ``processes`` workers.

    Identical (answer, gold) pairs are verified once; the residue is spread over worker
    processes by as many threads, each blocked on its own worker's pipe.
    """
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
    workers = max(1, min(processes, MAX_WORKERS))
    extracted: list[str | None] = []
    verdicts: list[bool | None] = []
    residue: dict[tuple[str, str], Future[bool]] = {}
    waiting: list[tuple[int, tuple[str, str]]] = []
    # Residue is submitted while extraction goes on, so the workers start and verify in parallel
    # with the main process instead of after it.
    with ThreadPoolExecutor(max_workers=workers) as executor:
        for index, (response, gold) in enumerate(zip(responses, golds)):
            answer = extract_answer(response) if response else None
            extracted.append(answer)
            settled = _settle(answer, gold)
            if isinstance(settled, bool):
                verdicts.append(settled)
                continue
            verdicts.append(None)
            if settled not in residue:
                residue[settled] = executor.submit(_cached_math_verify, *settled, float(timeout_s))
            waiting.append((index, settled))
        for index, pair in waiting:
            verdicts[index] = residue[pair].result()
    return [Grade(extracted=answer, correct=bool(verdict)) for answer, verdict in zip(extracted, verdicts)]
