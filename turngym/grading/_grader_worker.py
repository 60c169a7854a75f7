"""Math grading worker: math-verify in a process of its own, so a runaway answer can be killed.

Started by :mod:`turngym.grading.math_answers` as ``python -I -m turngym.grading._grader_worker
MEMORY_BYTES``. It caps its own address space, dies with its parent, imports and warms
math-verify, says ``{"ready": true}``, then answers one JSON line per request
``{"golds": [...], "pred": "..."}`` with ``{"ok": bool}`` or ``{"error": "...", "resource": bool}``
(``resource``: the answer exhausted memory or recursion, so no verdict was reached). A request's ``op``
picks another computation (:mod:`turngym.grading.official_math`): ``"prm800k"`` (TTRL's grader, ``{"ok": bool}``)
or ``"empo_key"`` (the string EMPO clusters, ``{"key": str}``).
"""

import ctypes
import json
import logging
import resource
import signal
import sys

PR_SET_PDEATHSIG = 1


def _wrap(ans):
    ans = ans.strip()
    return ans if ans.startswith("$") else f"${ans}$"


def verify_any(golds, pred):
    from math_verify import parse, verify

    p = parse(_wrap(pred), parsing_timeout=None)
    if not p:
        return False
    for gold in golds:
        g = parse(_wrap(gold), parsing_timeout=None)
        if g and verify(g, p, timeout_seconds=None):
            return True
    return False


def prm800k_any(golds, pred):
    """TTRL's ``math_grade.grade_answer`` (PRM800K's grader), as the mathruler package ships it."""
    from mathruler.grader import grade_answer

    return any(grade_answer(pred, gold) for gold in golds)


def empo_key(pred):
    """EMPO's math prediction (``trl/src/open_r1/rewards.py`` lines 164-190, ``normalize_prediction`` 265-274)
    for a response whose last box holds ``pred``."""
    import re

    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse

    config = LatexExtractionConfig(
        normalization_config=NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True,
                                                 equations=True, boxed="all", units=True),
        boxed_match_priority=0, try_extract_without_anchor=False)
    found = parse("\\boxed{" + pred + "}", extraction_config=[config], extraction_mode="first_match",
                  parsing_timeout=None)
    if not found:
        return ""
    text = str(found[-1])
    text = re.sub(r"(\\text\{)(.*?)(\})", "\\2", text)
    return re.sub(r"(\\boxed\{)(.*)(\})", "\\2", text)


OPS = {"verify": lambda req: {"ok": bool(verify_any([str(g) for g in req["golds"]], str(req["pred"])))},
       "prm800k": lambda req: {"ok": bool(prm800k_any([str(g) for g in req["golds"]], str(req["pred"])))},
       "empo_key": lambda req: {"key": empo_key(str(req["pred"]))}}


def main():
    memory = int(sys.argv[1])
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)  # equations=True (EMPO's setting) warns
    verify_any(["0.5"], "\\frac{1}{2}")  # imports sympy and the grammar: the first real answer is not slower
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            reply = OPS[req.get("op", "verify")](req)
        except (MemoryError, RecursionError) as exc:
            reply = {"error": type(exc).__name__, "resource": True}
        except Exception as exc:  # noqa: BLE001 - an answer math-verify cannot read is simply wrong
            reply = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "resource": False}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
