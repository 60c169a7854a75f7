"""Sandbox figures, side by side in one process: warm execution of print(1+1) at the strongest
isolation level the machine allows (bubblewrap, with a cgroup where possible; as root, an
unprivileged host uid) vs the rlimits-only level (an ordinary user's opt-in, not isolation; skipped
as root, where it is refused) vs the same cell through ``MathCodeEnv.step`` (what an agent pays) vs
a SandboxFusion server (``--sandboxfusion URL`` or TURNGYM_SANDBOXFUSION_URL: a cell in a fresh
session, a 4th cell, which replays the session's 3 earlier ones, and a bare request) vs a fresh `python -c`
subprocess (p50/p95; goal: warm cell through env.step >= 50x faster than `python -c` at p50),
worker start-up time per level, executions per second on 2 workers, and env.step overhead without
code. With ``--jupyter`` (jupyter_client + ipykernel, the ``bench`` extra) a warm Jupyter kernel, what many agent
frameworks run code in (no isolation), joins the interleaved arms, and 16 envs stepping at once are set against
16 kernels at once (goal: env.step >= 5x the kernel at p50, and at p99 with 16 concurrent).
Usage: python benchmarks/sandbox_latency.py [--n 300] [--jupyter] [--sandboxfusion http://127.0.0.1:8080]
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
    ap.add_argument("--jupyter", action="store_true", help="add the warm Jupyter kernel arms (the bench extra)")
    ap.add_argument("--concurrent", type=int, default=16, help="envs / kernels stepping at once in the --jupyter arm")
    args = ap.parse_args()
    kernel = JupyterKernel() if args.jupyter else None
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
    times.update({ARM_KERNEL: []} if kernel else {})
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
            if kernel:
                t = time.perf_counter()
                out = kernel.run("print(1+1)")
                times[ARM_KERNEL].append((time.perf_counter() - t) * 1000)
                assert out == "2\n", out
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
    if kernel:
        kernel.close()
        p50 = pct(times[ARM_KERNEL], .5) / pct(times[arm_env], .5)
        env16, kernel16 = concurrent_cells(args.concurrent, min(args.n, 100))
        p99 = pct(kernel16, .99) / pct(env16, .99)
        print(f"{args.concurrent} at once, each {len(env16) // args.concurrent} cells: MathCodeEnv.step p50 "
              f"{pct(env16, .5):.2f} ms p99 {pct(env16, .99):.2f} ms; jupyter kernels p50 {pct(kernel16, .5):.2f} ms "
              f"p99 {pct(kernel16, .99):.2f} ms")
        print(f"env.step vs jupyter kernel: p50 {p50:.1f}x, p99 {p99:.1f}x (with {args.concurrent} concurrent)")
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


ARM_KERNEL = "warm jupyter kernel"


class JupyterKernel:
    """One warm IPython kernel driven by jupyter_client, as agent frameworks run code cells (no isolation)."""

    def __init__(self) -> None:
        from jupyter_client.manager import start_new_kernel

        self.manager, self.client = start_new_kernel(kernel_name="python3")
        self.run("print(0)")

    def run(self, code: str) -> str:
        """The cell's stdout, once the kernel is idle again and has sent its execute_reply. Read straight off
        the channels (3.6 ms a cell here), not through ``execute_interactive`` (4.5 ms): the faster client
        is the yardstick."""
        msg_id = self.client.execute(code, store_history=False)
        out: list[str] = []
        while True:
            msg = self.client.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        while True:
            reply = self.client.get_shell_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg_id:
                assert reply["content"]["status"] == "ok", reply["content"]
                return "".join(out)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def concurrent_cells(n: int, cells: int) -> tuple[list[float], list[float]]:
    """ms per cell with ``n`` MathCode envs stepping at once (each its own session of the default local pool,
    as ``n`` envs of a run), then ``n`` warm kernels at once, one thread each."""
    envs = [MathCodeEnv(dataset="gsm8k", max_turns=10**6) for _ in range(n)]
    for env in envs:
        env.reset(options={"index": 0})
        env.step("```python\nprint(0)\n```")
    kernels = [JupyterKernel() for _ in range(n)]

    def timed(fn, out: list[float]) -> None:
        for _ in range(cells):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1000)

    def together(fns) -> list[float]:
        outs: list[list[float]] = [[] for _ in fns]
        threads = [threading.Thread(target=timed, args=(fn, o)) for fn, o in zip(fns, outs, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [x for o in outs for x in o]

    env_ms = together([lambda e=e: e.step("```python\nprint(1+1)\n```") for e in envs])
    kernel_ms = together([lambda k=k: k.run("print(1+1)") for k in kernels])
    for k in kernels:
        k.close()
    for env in envs:
        env.close()
    return env_ms, kernel_ms


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
