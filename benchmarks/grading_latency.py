"""Math grading latency: math-verify in a killable grader process (turngym's default) vs in the
calling thread (the old way, which could neither stop a runaway answer nor tell a timeout from
a wrong answer), side by side on MATH500 reference answers (goal: pool <= 1.5x in-thread at p50).

Each pair grades answer i against answer j (mostly different), so math-verify runs rather than
the normalised-match shortcut; the two arms alternate per pair so machine noise hits both alike.
Usage: python benchmarks/grading_latency.py [--n 300]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import turngym
from bench_setup import pct
from turngym.grading._grader_worker import verify_any
from turngym.grading.math_answers import GraderPool, grade_answer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    args = ap.parse_args()
    path = Path(turngym.__file__).parent / "data" / "math" / "math500" / "test.jsonl"
    answers = [str(json.loads(line)["answer"]) for line in path.read_text(encoding="utf-8").splitlines()]
    pairs = [(answers[i % len(answers)], answers[(i * 7 + 3) % len(answers)]) for i in range(args.n)]
    pool = GraderPool()
    pool.warm(wait=True)
    verify_any(["0.5"], "\\frac{1}{2}")  # the in-thread arm warm too
    times: dict[str, list[float]] = {"process pool": [], "in-thread": []}
    agree = 0
    for k, (pred, gold) in enumerate(pairs):
        arms = [("process pool", lambda p=pred, g=gold: grade_answer(p, [g], grader=pool).correct),
                ("in-thread", lambda p=pred, g=gold: verify_any([g], p))]
        results = {}
        for name, fn in arms if k % 2 == 0 else arms[::-1]:
            t = time.perf_counter()
            results[name] = fn()
            times[name].append((time.perf_counter() - t) * 1000)
        agree += results["process pool"] == results["in-thread"]
    for name, xs in times.items():
        print(f"{name:>13}: p50 {pct(xs, .5):7.2f} ms  p99 {pct(xs, .99):8.2f} ms  (n={len(xs)})", flush=True)
    ratio = pct(times["process pool"], .5) / pct(times["in-thread"], .5)
    print(f"pool / in-thread at p50: {ratio:.2f}x; verdicts agree on {agree}/{len(pairs)} pairs; "
          f"grader restarts {pool.restarts}")
    pool.close()


if __name__ == "__main__":
    main()
