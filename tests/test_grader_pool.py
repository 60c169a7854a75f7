"""One capped pool of math-verify graders per process, shared by every env in it (not one grader per env)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from turngym.grading.math_answers import GraderPool, grade_answer, grader_cap

COUNT_GRADERS = r"""
import time, psutil
from turngym.envs.math_code import MathCodeEnv
from turngym.grading.math_answers import default_grader
envs = [MathCodeEnv() for _ in range(21)]
deadline = time.monotonic() + 120
while not default_grader()._idle and time.monotonic() < deadline:  # the one warm grader is up
    time.sleep(0.2)
kids = [p for p in psutil.Process().children(recursive=True) if "_grader_worker" in " ".join(p.cmdline())]
print("GRADERS", len(kids), default_grader().live)
"""


def test_many_envs_in_one_process_share_one_warm_grader():
    proc = subprocess.run([sys.executable, "-c", COUNT_GRADERS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("GRADERS"))
    assert line.split()[1:] == ["1", "1"]  # 21 envs, one grader process


def test_concurrent_answers_never_start_more_graders_than_the_cap():
    pool = GraderPool(max_graders=2)
    verdicts = []
    try:
        def grade(i):
            verdicts.append(grade_answer(rf"\frac{{{i}}}{{{2 * i}}}", ["0.5"], timeout_s=60.0, grader=pool))

        threads = [threading.Thread(target=grade, args=(i,)) for i in range(1, 9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(verdicts) == 8 and all(v.graded and v.correct for v in verdicts)
        assert pool.peak == 2 and pool.live == 2
    finally:
        pool.close()
    assert pool.live == 0


def test_the_cap_defaults_to_the_cores_and_is_settable(monkeypatch):
    monkeypatch.delenv("TURNGYM_GRADERS", raising=False)
    assert 1 <= grader_cap() <= (len(__import__("os").sched_getaffinity(0)))
    monkeypatch.setenv("TURNGYM_GRADERS", "3")
    assert grader_cap() == 3 and GraderPool().max_graders == 3
    monkeypatch.setenv("TURNGYM_GRADERS", "zero")
    with pytest.raises(ValueError, match="TURNGYM_GRADERS"):
        grader_cap()
