"""Final-answer extraction (``\\boxed{}``) and grading with math-verify that cannot stall or be gamed.

math-verify runs in grader processes (:class:`GraderPool`) with an address-space cap; one that
passes its time budget or dies is killed and replaced, and the answer is tried once more on a
fresh grader. An answer is right, wrong, or (rarely) ungraded:

* an answer whose numbers are too large to evaluate (:mod:`turngym.grading.answer_size`: towers,
  huge powers, factorials, Γ, binomials, products) is refused before any symbolic work, and is wrong;
* an answer that times out, exhausts memory or kills the grader again on a fresh grader is wrong;
* only a failure of the grader itself that no answer caused (a grader that cannot start, or a gold
  answer too large to evaluate) gives ``graded=False``: rewards give it advantage 0 and metrics leave
  it out, counted.

So nothing a policy writes scores above a wrong answer unless it is right. The time budget starts
when a warm grader takes the request, so a cold start (importing sympy under load) is never a timeout.
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

import numpy as np

from turngym.episode import MAX_ACTION_CHARS
from turngym.grading.answer_size import unbounded_reason
from turngym.procs import spawn

MAX_ANSWER_CHARS = 1000
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BARE_BOXED = re.compile(r"\\boxed\s+([^\s$]+)")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces), ``""`` for an empty box,
    None when there is no complete box. ``\\boxed 5`` (no braces) is accepted too.

    Linear in the text: one running brace depth for the whole text (numpy), so a box closes at the
    first later position where the depth falls below its own; a text over ``MAX_ACTION_CHARS`` is
    not read at all (None), as the action parsers refuse it."""
    if len(text) > MAX_ACTION_CHARS:
        return None
    opens = np.array([m.end() - 1 for m in _BOXED.finditer(text)], dtype=np.int64)  # each box's "{"
    opens = opens[opens + 1 < len(text)]
    if opens.size:
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        depth = np.cumsum((codes == 123).astype(np.int32) - (codes == 125))  # after each character
        lowest_after = np.minimum.accumulate(depth[::-1])[::-1]  # min of depth[i:]
        closed = np.flatnonzero(lowest_after[opens + 1] < depth[opens])  # boxes whose depth falls back later
        if closed.size:
            p = int(opens[closed[-1]])
            close = p + 1 + int(np.argmax(depth[p + 1:] < depth[p]))
            return text[p + 1: close].strip()
    bare = _BARE_BOXED.findall(text)
    return bare[-1].strip() if bare else None


@dataclass
class Verdict:
    correct: bool
    reason: str = ""
    graded: bool = True  # False: the grader failed with no answer to blame (rare); a refused or timed-out answer is wrong


class GraderError(RuntimeError):
    """A grader process timed out, died or could not start: no verdict from this try.

    ``answer``: the failure happened while grading the answer (a timeout, a death, a reply that is not
    JSON), as opposed to a grader that could not start or was gone before the request."""

    def __init__(self, message: str, answer: bool = False):
        super().__init__(message)
        self.answer = answer


class _Grader:
    """One warm grader process (see ``_grader_worker``)."""

    def __init__(self, memory_bytes: int, startup_s: float):
        args = [sys.executable, "-I", "-m", "turngym.grading._grader_worker", str(memory_bytes)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        self.proc = spawn(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self._buf = b""
        try:
            msg = self._read(startup_s)
        except GraderError as exc:
            self.kill()
            raise GraderError(f"the grader did not start: {exc}") from None
        if msg.get("ready") is not True:
            self.kill()
            raise GraderError(f"the grader did not start: {msg}")

    def request(self, payload: dict, timeout_s: float) -> dict:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(payload) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as exc:
            raise GraderError(f"the grader is gone ({exc})") from None
        try:
            return self._read(timeout_s)
        except GraderError as exc:
            raise GraderError(str(exc), answer=True) from None

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
        """One math-verify request on a warm grader (:meth:`request`)."""
        return self.request({"golds": golds, "pred": pred}, timeout_s)

    def request(self, payload: dict, timeout_s: float) -> dict:
        """One request on a warm grader (``payload["op"]`` picks the computation, ``_grader_worker.OPS``);
        a grader that fails is killed (never reused) and GraderError raised."""
        grader = self._take()
        try:
            reply = grader.request(payload, timeout_s)
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
    warm grader; after a timeout or crash the answer is tried once more on a fresh grader, and if
    the answer fails that one too it is wrong. ``graded=False`` only when the grader itself failed
    (it could not start) or a gold answer is too large to evaluate: no answer caused it."""
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
    gold_why = next((r for g in golds if (r := unbounded_reason(g))), None)
    if gold_why:
        return Verdict(False, f"not graded: the gold answer is {gold_why}", graded=False)
    why = unbounded_reason(pred)
    if why:
        return Verdict(False, f"refused before grading: {why}")
    grader = grader or default_grader()
    failures, by_answer = [], False
    for _ in range(2):
        try:
            reply = grader.verify(golds, pred, timeout_s)
        except GraderError as exc:
            failures.append(str(exc))
            by_answer = exc.answer
            continue
        if "ok" in reply:
            return Verdict(bool(reply["ok"]), "math-verify")
        if reply.get("resource"):
            failures.append(f"the grader ran out of {'memory' if reply['error'] == 'MemoryError' else 'recursion'}")
            by_answer = True
            continue
        return Verdict(False, f"grading error: {reply.get('error')}")
    if by_answer:  # the answer failed a fresh grader too: the answer's doing, so wrong
        return Verdict(False, "failed on a fresh grader too: " + "; then ".join(failures))
    return Verdict(False, "not graded: " + "; then ".join(failures), graded=False)
