"""The main job's support scoring (SIOP then IGPO on one scorer, as its creditbench and ablation run
them): before (every reward runs each episode's longest-prefix forward itself) vs after (the scorer
keeps that forward, ``prefix_cache_tokens``), and the after arm in bf16, on the same planted groups.

Arms alternate within one process on one loaded model (cast between fp32 and bf16; the weights
are bf16 to begin with, so the casts lose nothing). Reported per arm: wall and process CPU seconds
(on a shared machine the CPU ratio is the load-independent figure), scorer forwards and tokens,
and the largest reward difference from the fp32 "before" arm.
Usage: python benchmarks/mainjob_scoring.py [--groups 1] [--k 4] [--envs searchqa,mathcode] [--arms before,after,after-bf16]
"""

from __future__ import annotations

import argparse
import time

import torch

from turngym.agents.loading import load_policy
from turngym.credit.creditbench import BenchConfig, build
from turngym.rewards import get_reward
from turngym.rewards.support import HFSupportScorer

ARMS = {"before": ("float32", 0), "after": ("float32", 40_000), "after-bf16": ("bfloat16", 40_000)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--envs", default="searchqa,mathcode")
    ap.add_argument("--arms", default="before,after,after-bf16")
    args = ap.parse_args()
    policy = load_policy(args.model)
    built = build(BenchConfig(envs=tuple(args.envs.split(",")), groups=max(args.groups, 2), k=max(args.k, 2), seed=0))
    groups = [g for gs in built.values() for g in gs[: args.groups]]
    n_eps = sum(len(g) for g in groups)
    print(f"{args.model}: {len(groups)} planted groups ({args.envs}), {n_eps} episodes; siop then igpo, tokens='text'",
          flush=True)
    ref = None
    for arm in args.arms.split(","):
        dtype, keep = ARMS[arm]
        policy.model.to(getattr(torch, dtype))
        scorer = HFSupportScorer(policy.model, policy.tokenizer, prefix_cache_tokens=keep)
        start, cpu = time.perf_counter(), time.process_time()
        rewards = [[get_reward(n, scorer=scorer, tokens="text").score_group(g).rewards for g in groups]
                   for n in ("siop", "igpo")]
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        flat = [x for w in rewards for g in w for ep in g for x in ep]
        diff = "" if ref is None else f", max |reward - before| {max(abs(a - b) for a, b in zip(flat, ref, strict=True)):.4f}"
        ref = ref if ref is not None else flat
        print(f"{arm:11s} ({dtype}, keep {keep}): wall {wall:.1f} s, CPU {cpu:.1f} s, forwards {scorer.stats['forwards']}, "
              f"tokens {scorer.stats['tokens']}, prefixes reused {scorer.stats['prefix_reused']}{diff}", flush=True)


if __name__ == "__main__":
    main()
