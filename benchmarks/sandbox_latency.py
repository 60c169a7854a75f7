"""Sandbox figures, side by side in one process: warm execution of print(1+1) at the strongest
isolation level the machine allows (bubblewrap, with a cgroup where possible; as root, an
unprivileged host uid) vs the rlimits-only level (an ordinary user's opt-in, not isolation; skipped
as root, where it is refused) vs the same cell through ``MathCodeEnv.step`` (what an agent pays) vs
a SandboxFusion server (``--sandboxfusion URL`` or TURNGYM_SANDBOXFUSION_URL: a cell in a fresh
session, a 4th cell, which replays the session's 3 earlier ones, and a bare request) vs a fresh `python -c`
subprocess (p50/p95; goal: warm cell through env.step >= 50x faster than `python -c` at p50),
worker start-up time per level, executions per second on 2 workers, and env.step overhead without
code. Usage: python benchmarks/sandbox_latency.py [--n 300] [--sandboxfusion http://127.0.0.1:8080]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

from bench_setup import pct
from turngym.envs.calculator import CalculatorEnv
from turngym.envs.math_code import MathCodeEnv
from turngym.sandbox import SandboxPool, make_sandbox
from turngym.sandbox.local import _Worker


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--sandboxfusion", default=os.environ.get("TURNGYM_SANDBOXFUSION_URL"),
                    help="a SandboxFusion server's URL: adds its arms (a remote cell every 4th round)")
    args = ap.parse_args()
    strong = SandboxPool(size=2, isolation="auto")
    weak = SandboxPool(size=1, isolation="rlimits-only") if os.geteuid() != 0 else None
    fusion = make_sandbox(f"sandboxfusion:{args.sandboxfusion}") if args.sandboxfusion else None
    print(f"levels: {strong.chosen.level} ({strong.chosen.note})"
          + (f" vs {weak.chosen.level}" if weak else " (rlimits-only is refused as root: not measured)")
          + (f" vs SandboxFusion at {args.sandboxfusion}" if fusion else " (no SandboxFusion URL: not measured)"))
    arm_env = "MathCodeEnv.step (" + strong.chosen.level + ")"
    arm_f0, arm_f3, arm_raw = "sandboxfusion, 1st cell", "sandboxfusion, 4th cell", "sandboxfusion, bare request"
    times: dict[str, list[float]] = {strong.chosen.level: [], arm_env: []}
    times.update({weak.chosen.level: []} if weak else {})
    times.update({arm_f0: [], arm_f3: [], arm_raw: []} if fusion else {})
    times["fresh python -c"] = []
    env = MathCodeEnv(dataset="gsm8k", max_turns=10**6, sandbox=strong)
    env.reset(options={"index": 0})
    with strong.session() as s_new:
        s_old = weak.session() if weak else None
        strong.wait_warm()  # refills start workers in the background: let them finish first
        local = [(strong.chosen.level, s_new)]
        if weak:
            weak.wait_warm()
            local.append((weak.chosen.level, s_old))
        for _, s in local:
            s.run("print(0)")
        env.step("```python\nprint(0)\n```")
        if fusion:
            fusion.session().run("print(0)")
        print(f"host uid of the cells: {s_new.describe()['host_uid']} ({strong.chosen.level}), "
              f"{env.episode.meta['sandbox']['host_uid']} (env)")
        for i in range(args.n):  # interleaved, so machine noise hits every arm alike
            for level, s in local:
                t = time.perf_counter()
                r = s.run("print(1+1)")
                times[level].append((time.perf_counter() - t) * 1000)
                assert r.stdout == "2\n", r.render()
            t = time.perf_counter()
            obs, *_ = env.step("```python\nprint(1+1)\n```")
            times[arm_env].append((time.perf_counter() - t) * 1000)
            assert "\n2\n" in obs, obs
            if i % 4 == 0:
                t = time.perf_counter()
                subprocess.run([sys.executable, "-c", "print(1+1)"], capture_output=True, check=True)
                times["fresh python -c"].append((time.perf_counter() - t) * 1000)
                if fusion:
                    _fusion_round(fusion, times[arm_f0], times[arm_f3], times[arm_raw])
        if s_old:
            s_old.close()
    fresh50 = pct(times["fresh python -c"], .5)
    for name, xs in times.items():
        extra = "" if name.startswith("fresh") else f"   fresh/warm at p50: {fresh50 / pct(xs, .5):.1f}x"
        print(f"{name:>26}: p50 {pct(xs, .5):8.3f} ms  p95 {pct(xs, .95):8.3f} ms  (n={len(xs)}){extra}")
    if fusion:
        local50 = pct(times[strong.chosen.level], .5)
        print(f"SandboxFusion / local warm pool at p50: {pct(times[arm_f0], .5) / local50:.0f}x (1st cell), "
              f"{pct(times[arm_f3], .5) / local50:.0f}x (4th cell)")

    for pool in [p for p in (strong, weak) if p]:  # cold start of one worker (numpy and sympy preloaded), paid off the hot path
        starts = []
        for _ in range(5):
            t = time.perf_counter()
            w = _Worker(pool.limits, pool.preload, pool.chosen)
            w.wait_ready()
            starts.append((time.perf_counter() - t) * 1000)
            w.close()
        print(f"worker start-up, {pool.chosen.level}: p50 {pct(starts, .5):.0f} ms (n={len(starts)})")

    counts = [0, 0]
    stop = time.perf_counter() + 5.0

    def hammer(k: int) -> None:
        with strong.session() as s:
            while time.perf_counter() < stop:
                s.run("x = sum(range(100))")
                counts[k] += 1

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"executions per second on 2 workers ({strong.chosen.level}): {sum(counts) / 5.0:.0f}")

    for name, env, action in [("Calculator-v0 (no tool)", CalculatorEnv(max_turns=10**6), "thinking..."),
                              ("MathCode-v0 (no code)", MathCodeEnv(dataset="gsm8k", max_turns=10**6, sandbox=strong),
                               "thinking...")]:
        env.reset(options={"index": 0})
        step_us = []
        for _ in range(2000):
            t = time.perf_counter()
            env.step(action)
            step_us.append((time.perf_counter() - t) * 1e6)
        print(f"env.step overhead, {name}: p50 {pct(step_us, .5):.1f} us  p95 {pct(step_us, .95):.1f} us")
    strong.close()
    if weak:
        weak.close()


def _fusion_round(fusion, first: list[float], fourth: list[float], bare: list[float]) -> None:
    """One fresh session's first cell, then its 4th (MathCode's default turn budget) after two more;
    and the same cell as a bare ``/run_code`` request (no driver, no replay: the server's own cost)."""
    from sandbox_fusion import RunCodeRequest, run_code

    t = time.perf_counter()
    r = run_code(RunCodeRequest(code="print(1+1)", language="python"), endpoint=fusion.url, max_attempts=1)
    bare.append((time.perf_counter() - t) * 1000)
    assert r.run_result.stdout == "2\n", r
    with fusion.session() as s:
        t = time.perf_counter()
        r = s.run("x = 1 + 1\nprint(x)")
        first.append((time.perf_counter() - t) * 1000)
        assert r.stdout == "2\n", r.render()
        s.run("y = x * 3")
        s.run("z = y + 1")
        t = time.perf_counter()
        r = s.run("print(x + y + z)")
        fourth.append((time.perf_counter() - t) * 1000)
        assert r.stdout == "15\n", r.render()


if __name__ == "__main__":
    main()
