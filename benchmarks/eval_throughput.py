"""Eval throughput: `turngym eval` with 8 concurrent episodes (one batched generate call per tick)
vs one episode at a time, same model, items, sampling and seed (goal >= 3x). The arms alternate; each
run's figure is printed as soon as it is measured, and the ratio is of the arms' medians.
Usage: python benchmarks/eval_throughput.py [--model default] [--items 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from turngym.agents.loading import load_hf_policy
from turngym.evals.harness import EvalSpec, run_eval


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each arm (alternating)")
    args = ap.parse_args()
    policy = load_hf_policy(args.model)
    figures = {}
    for concurrency in (1, 8) * args.repeats:  # alternating arms
        spec = EvalSpec(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 3, "prompt_style": "base"},
                        limit=args.items, concurrency=concurrency, max_new_tokens=args.max_new_tokens, temperature=0.0)
        start = time.perf_counter()
        res = run_eval(spec, tempfile.mkdtemp(), policy=policy)
        wall = time.perf_counter() - start
        figures.setdefault(concurrency, []).append(res["episodes"] / wall)
        print(f"concurrency {concurrency}: {res['episodes']} episodes in {wall:.1f} s, {figures[concurrency][-1]:.3f} ep/s",
              flush=True)
    one, eight = statistics.median(figures[1]), statistics.median(figures[8])
    print(f"model={args.model}: one at a time {one:.3f} ep/s, 8 concurrent {eight:.3f} ep/s, ratio {eight / one:.2f}x "
          f"(medians of {args.repeats})")


if __name__ == "__main__":
    main()
