"""Final-answer extraction (``\\boxed{}``) and grading with math-verify that cannot stall or lie.

math-verify runs in grader processes (:class:`GraderPool`) with an address-space cap; one that
passes its time budget or dies is killed and replaced, and the answer is tried once more on a
fresh grader. Answers that are obviously unbounded (power towers, huge exponents or factorials)
are refused before any symbolic work. A refusal, a second timeout or a crash is never
"incorrect": the :class:`Verdict` says ``graded=False`` with the reason, and rewards and metrics
treat the outcome as missing. The time budget starts when a warm grader takes the request, so
a cold start (importing sympy under load) is never a timeout.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from turngym.procs import spawn

MAX_ANSWER_CHARS = 1000
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces), ``""`` for an empty box,
    None when there is no complete box. ``\\boxed 5`` (no braces) is accepted too."""
    last: str | None = None
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            last = text[m.end(): i - 1].strip()
    if last is None:
        bare = re.findall(r"\\boxed\s+([^\s$]+)", text)
        if bare:
            last = bare[-1].strip()
    return last


@dataclass
class Verdict:
    correct: bool
    reason: str = ""
    graded: bool = True  # False: no verdict was reached (refused, timed out, grader crashed); never "incorrect"


MAX_EXPONENT = 100_000  # 2^100000 has 30,103 digits: still cheap; anything larger is refused
MAX_FACTORIAL = 10_000
_POWER = re.compile(r"\^|\*\*")
_FACTORIAL = re.compile(r"(\d+)\s*!")
_CHAINED_POWER = re.compile(r"(?:\^|\*\*)\s*[\w.\\]+\s*(?:\^|\*\*)")  # a^b^c, 10**10**10


def _exponent(text: str, start: int) -> str:
    """The exponent that begins at ``start``: a balanced ``{...}`` group or one token."""
    i = start
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] in "{(":
        close = "}" if text[i] == "{" else ")"
        depth, j = 1, i + 1
        while j < len(text) and depth:
            depth += {text[i]: 1, close: -1}.get(text[j], 0)
            j += 1
        return text[i + 1: j - 1]
    m = re.match(r"-?\d+|\\?[A-Za-z]+|.", text[i:])
    return m.group(0) if m else ""


def unbounded_reason(answer: str) -> str | None:
    """Why ``answer`` would make symbolic grading unbounded (time or memory), or None. Cheap."""
    if _CHAINED_POWER.search(answer):
        return "a power tower (an exponent that is itself a power)"
    for m in _POWER.finditer(answer):
        exp = _exponent(answer, m.end())
        if _POWER.search(exp):
            return "a power tower (an exponent that is itself a power)"
        digits = exp.replace(" ", "").lstrip("+-")
        if digits.isdigit() and int(digits) > MAX_EXPONENT:
            return f"an exponent above {MAX_EXPONENT:,}"
    for m in _FACTORIAL.finditer(answer):
        if int(m.group(1)) > MAX_FACTORIAL:
            return f"a factorial above {MAX_FACTORIAL:,}!"
    return None


class GraderError(RuntimeError):
    """A grader process timed out, died or could not start: no verdict."""


class _Grader:
    """One warm grader process (see ``_grader_worker``)."""

    def __init__(self, memory_bytes: int, startup_s: float):
        args = [sys.executable, "-I", "-m", "turngym.grading._grader_worker", str(memory_bytes)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        self.proc = spawn(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self._buf = b""
        msg = self._read(startup_s)
        if msg.get("ready") is not True:
            self.kill()
            raise GraderError(f"the grader did not start: {msg}")

    def ask(self, golds: list[str], pred: str, timeout_s: float) -> dict:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps({"golds": golds, "pred": pred}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as exc:
            raise GraderError(f"the grader is gone ({exc})") from None
        return self._read(timeout_s)

    def _read(self, timeout_s: float) -> dict:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise GraderError(f"grading timed out after {timeout_s:g} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self.proc.wait()
                raise GraderError(f"the grader died (exit status {code})")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            raise GraderError("the grader wrote something that is not JSON") from None

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except (OSError, AttributeError):
                pass


def grader_cap() -> int:
    """How many grader processes one process may run: ``TURNGYM_GRADERS`` if set, else its usable cores."""
    given = os.environ.get("TURNGYM_GRADERS", "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise ValueError(f"TURNGYM_GRADERS must be a whole number >= 1, got {given!r}")
        return int(given)
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return max(1, len(cores) if cores else (os.cpu_count() or 1))


class GraderPool:
    """Warm math-verify grader processes shared by every caller, at most ``max_graders`` of them (default
    :func:`grader_cap`: the process's cores); a caller waits for a free one. One that fails is replaced.

    ``memory_bytes``: the address-space cap of each grader; ``startup_s``: how long a grader
    may take to start (not part of any answer's time budget).
    """

    def __init__(self, memory_bytes: int = 2 << 30, startup_s: float = 120.0, max_graders: int | None = None):
        self.memory_bytes, self.startup_s = memory_bytes, startup_s
        self.max_graders = grader_cap() if max_graders is None else int(max_graders)
        if self.max_graders < 1:
            raise ValueError(f"max_graders must be >= 1, got {max_graders}")
        self._idle: list[_Grader] = []
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)  # a grader went idle or away
        self.live = 0  # graders running or starting, idle or busy
        self.peak = 0  # the most there ever were at once
        self.restarts = 0

    def _count(self, delta: int) -> None:
        """Change the live count (the lock held) and wake a waiting caller when one went away."""
        self.live += delta
        self.peak = max(self.peak, self.live)
        if delta < 0:
            self._freed.notify()

    def warm(self, wait: bool = False) -> None:
        """Start one grader ahead of the first answer (in the background unless ``wait``); nothing when one
        already runs or starts, so many envs in one process share it."""
        with self._lock:
            if self.live > 0:
                return
            self._count(+1)

        def start() -> None:
            try:
                g = _Grader(self.memory_bytes, self.startup_s)
            except GraderError:
                with self._lock:
                    self._count(-1)
                return  # the first request will try again and say why
            with self._lock:
                self._idle.append(g)
                self._freed.notify()

        if wait:
            start()
        else:
            threading.Thread(target=start, daemon=True, name="turngym-grader-warm").start()

    def _take(self) -> _Grader:
        with self._lock:
            while not self._idle and self.live >= self.max_graders:
                self._freed.wait()
            if self._idle:
                return self._idle.pop()
            self._count(+1)
        try:
            return _Grader(self.memory_bytes, self.startup_s)
        except GraderError:
            with self._lock:
                self._count(-1)
            raise

    def verify(self, golds: list[str], pred: str, timeout_s: float) -> dict:
        """One request on a warm grader; a grader that fails is killed (never reused) and GraderError raised."""
        grader = self._take()
        try:
            reply = grader.ask(golds, pred, timeout_s)
        except GraderError:
            grader.kill()
            with self._lock:
                self.restarts += 1
                self._count(-1)
            raise
        with self._lock:
            self._idle.append(grader)
            self._freed.notify()
        return reply

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._count(-len(idle))
        for g in idle:
            g.kill()


_POOLS: dict[int, GraderPool] = {}
_POOLS_LOCK = threading.Lock()


def default_grader() -> GraderPool:
    """This process's grader pool, shared by every env in it (a forked child gets its own)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(os.getpid())
        if pool is None:
            pool = _POOLS[os.getpid()] = GraderPool()
        return pool


def _normalise(s: str) -> str:
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)
    return re.sub(r"\s+|\\[,;! ]|\$|\\left|\\right", "", s).rstrip(".")


def grade_answer(pred: str | None, golds: list[str], timeout_s: float = 5.0, grader: GraderPool | None = None) -> Verdict:
    """Is ``pred`` equivalent to any gold answer? Thread-safe. ``timeout_s`` bounds each try on a
    warm grader; after a timeout or crash the answer is tried once more on a fresh grader, and
    if that fails too the verdict is ``graded=False`` (no verdict), never incorrect."""
    if pred is None:
        return Verdict(False, "no boxed answer")
    if not pred.strip():
        return Verdict(False, "empty boxed answer")
    if len(pred) > MAX_ANSWER_CHARS:
        return Verdict(False, f"answer longer than {MAX_ANSWER_CHARS} characters")
    golds = [str(g) for g in golds]
    for gold in golds:
        if _normalise(pred) == _normalise(gold):
            return Verdict(True, "normalised match")
    why = unbounded_reason(pred) or next((f"gold: {r}" for g in golds if (r := unbounded_reason(g))), None)
    if why:
        return Verdict(False, f"refused before grading: {why}", graded=False)
    grader = grader or default_grader()
    failures = []
    for _ in range(2):
        try:
            reply = grader.verify(golds, pred, timeout_s)
        except GraderError as exc:
            failures.append(str(exc))
            continue
        if "ok" in reply:
            return Verdict(bool(reply["ok"]), "math-verify")
        if reply.get("resource"):
            failures.append(f"the grader ran out of {'memory' if reply['error'] == 'MemoryError' else 'recursion'}")
            continue
        return Verdict(False, f"grading error: {reply.get('error')}")
    return Verdict(False, "not graded: " + "; then ".join(failures), graded=False)
