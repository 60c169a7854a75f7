"""Rollout throughput: 8 concurrent episodes in one batched generate call per tick vs one at a time.

Both arms play the same tasks with the same model, seeds and sampling, side by side, in
alternating repeats; the figure is the ratio of episodes per second (goal >= 3x).
Usage: python benchmarks/rollout_throughput.py [--model default|DIR] [--episodes 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_setup import load_bench_policy
from turngym.agents.policy import SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.envs.calculator import CalculatorEnv


def run(policy, concurrency: int, episodes: int, max_new_tokens: int, style: str) -> tuple[float, int]:
    runner = RolloutRunner(policy, lambda: CalculatorEnv(max_turns=3, prompt_style=style),
                           SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=0),
                           k=1, concurrency=concurrency)
    start = time.perf_counter()
    eps = runner.run(range(episodes))
    wall = time.perf_counter() - start
    return wall, sum(len(t.action_ids or []) for e in eps for t in e.turns)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()
    policy, style = load_bench_policy(args.model)
    run(policy, 8, 2, 4, style)  # warm-up
    seq, bat = [], []
    for _ in range(args.repeats):
        w1, t1 = run(policy, 1, args.episodes, args.max_new_tokens, style)
        w8, t8 = run(policy, 8, args.episodes, args.max_new_tokens, style)
        seq.append((w1, t1))
        bat.append((w8, t8))
    s_eps = statistics.median(args.episodes / w for w, _ in seq)
    b_eps = statistics.median(args.episodes / w for w, _ in bat)
    s_tok = statistics.median(t / w for w, t in seq)
    b_tok = statistics.median(t / w for w, t in bat)
    print(f"model={args.model} episodes={args.episodes} max_new_tokens={args.max_new_tokens} repeats={args.repeats}")
    print(f"one at a time : {s_eps:7.3f} episodes/s  {s_tok:8.1f} generated tokens/s")
    print(f"8 concurrent  : {b_eps:7.3f} episodes/s  {b_tok:8.1f} generated tokens/s")
    print(f"ratio (episodes/s): {b_eps / s_eps:.2f}x   ratio (tokens/s): {b_tok / s_tok:.2f}x")


if __name__ == "__main__":
    main()
