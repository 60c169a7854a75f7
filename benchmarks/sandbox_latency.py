"""Sandbox figures: warm execution of print(1+1) vs a fresh `python -c` subprocess (p50/p95,
goal >= 10x faster), executions per second on 2 workers, and env.step overhead without code.
Usage: python benchmarks/sandbox_latency.py [--n 200]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

from turngym.envs.calculator import CalculatorEnv
from turngym.envs.math_code import MathCodeEnv
from turngym.envs.sandbox import SandboxPool


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    pool = SandboxPool(size=2)
    warm, fresh = [], []
    with pool.session() as s:
        s.run("print(0)")
        for i in range(args.n):  # interleaved, so machine noise hits both arms alike
            t = time.perf_counter()
            r = s.run("print(1+1)")
            warm.append((time.perf_counter() - t) * 1000)
            assert r.stdout == "2\n"
            if i % 4 == 0:
                t = time.perf_counter()
                subprocess.run([sys.executable, "-c", "print(1+1)"], capture_output=True, check=True)
                fresh.append((time.perf_counter() - t) * 1000)
    print(f"warm sandbox print(1+1): p50 {pct(warm, .5):.3f} ms  p95 {pct(warm, .95):.3f} ms  (n={len(warm)})")
    print(f"fresh python -c        : p50 {pct(fresh, .5):.1f} ms  p95 {pct(fresh, .95):.1f} ms  (n={len(fresh)})")
    print(f"speed-up p50: {pct(fresh, .5) / pct(warm, .5):.0f}x   p95: {pct(fresh, .95) / pct(warm, .95):.0f}x")

    counts = [0, 0]
    stop = time.perf_counter() + 5.0

    def hammer(k: int) -> None:
        with pool.session() as s:
            while time.perf_counter() < stop:
                s.run("x = sum(range(100))")
                counts[k] += 1

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"executions per second on 2 workers: {sum(counts) / 5.0:.0f}")

    for name, env, action in [("Calculator-v0 (no tool)", CalculatorEnv(max_turns=10**6), "thinking..."),
                              ("MathCode-v0 (no code)", MathCodeEnv(dataset="gsm8k", max_turns=10**6, sandbox=pool), "thinking...")]:
        env.reset(options={"index": 0})
        times = []
        for _ in range(2000):
            t = time.perf_counter()
            env.step(action)
            times.append((time.perf_counter() - t) * 1e6)
        print(f"env.step overhead, {name}: p50 {pct(times, .5):.1f} us  p95 {pct(times, .95):.1f} us")
    pool.close()


if __name__ == "__main__":
    main()
