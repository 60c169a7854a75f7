"""64 concurrent MathCode-v0 envs in one process: grader processes and resident memory (this process and its
children) once the envs are made and before the first episode, then the first burst: every env resets and runs
one code cell, stepped one after another as the rollout runner steps them (cell p50/p99 from each turn's tool
latency), then answers (graded by math-verify). Run it on two trees side by side to compare:

    PYTHONPATH=OLD_TREE python benchmarks/mathcode_burst.py
    PYTHONPATH=NEW_TREE python benchmarks/mathcode_burst.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

CELL = "```python\nimport math\nprint(math.comb(10, 3))\n```"


def tree_rss_mb() -> tuple[float, int]:
    """RSS of this process and all its children (MB), and how many of them are grader processes."""
    import psutil

    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    rss = 0
    graders = 0
    for p in procs:
        try:
            rss += p.memory_info().rss
            graders += "_grader_worker" in " ".join(p.cmdline())
        except psutil.Error:
            pass
    return rss / 2**20, graders


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--settle-s", type=float, default=20.0, help="wait for background graders to start")
    args = ap.parse_args()
    from turngym.envs.math_code import MathCodeEnv

    start = time.perf_counter()
    envs = [MathCodeEnv(max_turns=3) for _ in range(args.envs)]
    made_s = time.perf_counter() - start
    time.sleep(args.settle_s)
    rss, graders = tree_rss_mb()
    cells = []
    burst = time.perf_counter()
    for i, env in enumerate(envs):
        env.reset(seed=i, options={"index": i % env.num_items()})
    for env in envs:
        env.step(CELL)
        cells.append(env.episode.turns[-1].latency_ms["tool"])
    for env in envs:
        env.step("The answer is \\boxed{120}.")
    burst_s = time.perf_counter() - burst
    _, graders_after = tree_rss_mb()
    q = statistics.quantiles(cells, n=100)
    out = {"envs": args.envs, "made_s": round(made_s, 2), "grader_processes_before": graders, "rss_mb_before": round(rss),
           "cell_p50_ms": round(q[49], 1), "cell_p99_ms": round(q[98], 1), "burst_s": round(burst_s, 2),
           "grader_processes_after": graders_after}
    print(json.dumps(out), flush=True)
    for env in envs:
        env.close()


if __name__ == "__main__":
    main()
