"""Math grading worker: math-verify in a process of its own, so a runaway answer can be killed.

Started by :mod:`turngym.grading.math_answers` as ``python -I -m turngym.grading._grader_worker
MEMORY_BYTES``. It caps its own address space, dies with its parent, imports and warms
math-verify, says ``{"ready": true}``, then answers one JSON line per request
``{"golds": [...], "pred": "..."}`` with ``{"ok": bool}`` or ``{"error": "...", "resource": bool}``
(``resource``: the answer exhausted memory or recursion, so no verdict was reached).
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


def main():
    memory = int(sys.argv[1])
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    verify_any(["0.5"], "\\frac{1}{2}")  # imports sympy and the grammar: the first real answer is not slower
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            reply = {"ok": bool(verify_any([str(g) for g in req["golds"]], str(req["pred"])))}
        except (MemoryError, RecursionError) as exc:
            reply = {"error": type(exc).__name__, "resource": True}
        except Exception as exc:  # noqa: BLE001 - an answer math-verify cannot read is simply wrong
            reply = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "resource": False}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
