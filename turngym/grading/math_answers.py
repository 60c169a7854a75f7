"""Final-answer extraction (``\\boxed{}``) and grading with math-verify, safe in any thread.

math-verify's own timeouts use signals, which only work on the main thread. Here its
timeouts are switched off and each verification runs in a daemon thread that the
caller waits on for at most ``timeout_s``; inputs are also length-capped, so a
pathological answer cannot stall a rollout worker.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass

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


def has_boxed(text: str) -> bool:
    return extract_boxed(text) is not None


@dataclass
class Verdict:
    correct: bool
    reason: str = ""


def _wrap(ans: str) -> str:
    ans = ans.strip()
    return ans if ans.startswith("$") else f"${ans}$"


def _verify(gold: str, pred: str) -> bool:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    g = parse(_wrap(gold), parsing_timeout=None)
    p = parse(_wrap(pred), parsing_timeout=None)
    if not g or not p:
        return False
    return bool(verify(g, p, timeout_seconds=None))


def _normalise(s: str) -> str:
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)
    return re.sub(r"\s+|\\[,;! ]|\$|\\left|\\right", "", s).rstrip(".")


def grade_answer(pred: str | None, golds: list[str], timeout_s: float = 5.0) -> Verdict:
    """Is ``pred`` equivalent to any gold answer? Thread-safe; bounded by ``timeout_s``."""
    if pred is None:
        return Verdict(False, "no boxed answer")
    if not pred.strip():
        return Verdict(False, "empty boxed answer")
    if len(pred) > MAX_ANSWER_CHARS:
        return Verdict(False, f"answer longer than {MAX_ANSWER_CHARS} characters")
    for gold in golds:
        if _normalise(pred) == _normalise(str(gold)):
            return Verdict(True, "normalised match")
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["ok"] = any(_verify(str(gold), pred) for gold in golds)
        except Exception as exc:  # noqa: BLE001 - an unparsable answer is simply wrong
            result["error"] = f"{type(exc).__name__}: {exc}"

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return Verdict(False, f"grading timed out after {timeout_s:g} s")
    if "error" in result:
        return Verdict(False, f"grading error: {result['error']}")
    return Verdict(bool(result.get("ok")), "math-verify")
