"""SIOP support scoring for one group: K=4 episodes x 4 turns x 3 references, scored with the
cached scorer (one KV cache per episode, only cue + reference run per (point, reference)) vs
one full forward per (point, reference). Goal >= 3x. Peak memory of each arm is measured in a
fresh subprocess (resident memory sampled while it runs, above the level before it).

Usage: python benchmarks/support_scoring.py [--model tiny|default|DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np


def load(model: str):
    from turngym.agents.loading import load_hf_policy
    from turngym.agents.tiny import tiny_model_dir

    if model == "tiny":
        return load_hf_policy(str(tiny_model_dir(chat=True, hidden_size=256, num_layers=4)), dtype="float32", device="cpu")
    return load_hf_policy(model, dtype="float32", device="cpu")


def workload(tokenizer, k=4, turns=4, prompt_len=200, action_len=40, obs_len=150, seed=0):
    rng = np.random.default_rng(seed)
    vocab = min(len(tokenizer), 30000)
    prompt = rng.integers(10, vocab, prompt_len).tolist()
    groups = []
    for _ in range(k):
        ids, points = list(prompt), [list(prompt)]
        for _ in range(turns - 1):
            ids += rng.integers(10, vocab, action_len + obs_len).tolist()
            points.append(list(ids))
        groups.append(points)
    cue = tokenizer("<answer>", add_special_tokens=False)["input_ids"]
    refs = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in ["Paris", "the city of Paris", "Lyon"]]
    return groups, cue, refs


def run_arm(policy, cached: bool, groups, cue, refs) -> float:
    from turngym.rewards.support import HFSupportScorer

    scorer = HFSupportScorer(policy.model, policy.tokenizer, cached=cached)
    start = time.perf_counter()
    for points in groups:
        scorer.mean_logprobs(points, cue, refs)
    return time.perf_counter() - start


def child(model: str, arm: str) -> None:
    """Peak resident memory while the arm runs, sampled every 2 ms, above the level before it."""
    import threading

    import psutil

    policy = load(model)
    groups, cue, refs = workload(policy.tokenizer)
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    t = threading.Thread(target=sample)
    t.start()
    run_arm(policy, arm == "cached", groups, cue, refs)
    done.set()
    t.join()
    print(json.dumps({"extra_peak_mib": (peak[0] - base) / 2**20, "peak_mib": peak[0] / 2**20}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", choices=["cached", "naive"])
    args = ap.parse_args()
    if args.child:
        return child(args.model, args.child)
    policy = load(args.model)
    groups, cue, refs = workload(policy.tokenizer)
    run_arm(policy, True, groups[:1], cue, refs)  # warm-up
    cached, naive = [], []
    for _ in range(args.repeats):  # interleaved so machine noise hits both arms
        cached.append(run_arm(policy, True, groups, cue, refs))
        naive.append(run_arm(policy, False, groups, cue, refs))
    c, n = statistics.median(cached), statistics.median(naive)
    print(f"model={args.model}: K=4 x 4 points x 3 references, prompt 200 + 3 x 190 tokens per episode")
    print(f"cached (shared prefix): {c:.3f} s   one forward per (point, ref): {n:.3f} s   speed-up {n / c:.2f}x")
    for arm in ("cached", "naive"):
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--child", arm],
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        mem = json.loads(out)
        print(f"peak memory {arm:6s}: {mem['peak_mib']:.0f} MiB total, {mem['extra_peak_mib']:.0f} MiB above the loaded model")


if __name__ == "__main__":
    main()
