"""SIOP support scoring for one group, with the extra scoring point τ_T: K=4 episodes x 4 turns
(5 scoring points: τ_0..τ_4) x 3 references in the official pseudo-answer, scored with the
tree scorer (the longest prefix once, from the group's shared prompt as SIOP and IGPO score a group,
then every (point, reference) continuation in one forward under a tree-shaped attention mask) vs one
full forward per (point, reference); also the tree scorer with each episode scored alone.
Goal >= 4x (issue 13) / >= 5x (issue 17), same scores within 1e-4. A third arm is the baseline a user
would write with a KV cache (``kv-crop``: the longest prefix once, then per (point, reference) its cache
cropped to the point and one forward of the continuation); goal: tree >= 3x kv-crop with scores equal
within 1e-5 nats. The arms are timed interleaved in one process (medians). Also reported: the scores of a bf16 scorer against
the fp32 ones (the scorer ``dtype`` option), and peak memory of each arm in a fresh
subprocess (resident memory sampled while it runs, above the level before it).

Usage: python benchmarks/support_scoring.py [--model tiny|default|DIR] [--repeats 3] [--k 4] [--no-memory]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext

import numpy as np

REFERENCES = ["Paris", "the city of Paris", "Lyon"]


def load(model: str, dtype: str = "float32"):
    from turngym.agents.loading import load_hf_policy
    from turngym.agents.tiny import tiny_model_dir

    if model == "tiny":
        return load_hf_policy(str(tiny_model_dir(chat=True, hidden_size=256, num_layers=4)), dtype=dtype, device="cpu")
    return load_hf_policy(model, dtype=dtype, device="cpu")


def workload(tokenizer, k=4, turns=4, prompt_len=200, action_len=40, obs_len=150, seed=0):
    """Scoring points of K episodes (τ_0..τ_T, T = ``turns``) and the references' continuations."""
    from turngym.rewards.support import PseudoAnswer, continuation, end_of_turn_text

    rng = np.random.default_rng(seed)
    vocab = min(len(tokenizer), 30000)
    prompt = rng.integers(10, vocab, prompt_len).tolist()
    groups = []
    for _ in range(k):
        ids, points = list(prompt), [list(prompt)]
        for t in range(turns):
            ids += rng.integers(10, vocab, action_len).tolist()
            points.append(list(ids))  # before the observation (official SIOP); the last is τ_T
            if t < turns - 1:
                ids += rng.integers(10, vocab, obs_len).tolist()
        groups.append(points)
    eot = end_of_turn_text(tokenizer)
    conts = [continuation(tokenizer, PseudoAnswer(), r, eot) for r in REFERENCES]
    return groups, conts


def run_arm(model, tokenizer, method: str, groups, conts, share: bool = True) -> tuple[float, list]:
    """The group scored as SIOP and IGPO score one (``share``: inside the scorer's prompt-sharing scope, so the
    tree scorer runs the episodes' common prompt once), or each episode on its own."""
    from turngym.rewards.support import HFSupportScorer

    scorer = HFSupportScorer(model, tokenizer, method=method)
    start = time.perf_counter()
    with scorer.sharing_prompt() if share else nullcontext():
        scores = [scorer.mean_logprobs(points, conts) for points in groups]
    return time.perf_counter() - start, scores


def kv_crop_scores(model, points, conts) -> list[list[float]]:
    """Mean log-probabilities of each reference after each point, the KV-cache way: the longest point is run
    once with its cache kept; each (point, reference) then gets that cache cut to the point (slices, no copy: a
    forward appends new tensors and leaves the prefix's intact) and one forward of the continuation. The point's
    last id is fed again, so its logits (which predict the reference's first token) come from this forward."""
    import inspect

    import torch
    from transformers import DynamicCache

    arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # renamed in 5.x
    device = next(model.parameters()).device
    full = DynamicCache()  # full layers, sliding ones included: the masks apply each layer's window
    with torch.inference_mode():
        model(input_ids=torch.tensor([list(points[-1])], device=device), use_cache=True, logits_to_keep=1,
              **{arg: full})
        layers = [(layer.keys, layer.values) for layer in full.layers]
        out = []
        for point in points:
            n = len(point) - 1
            row = []
            for c in conts:
                cache = DynamicCache(ddp_cache_data=[(k[:, :, :n], v[:, :, :n]) for k, v in layers])
                ids = [point[-1], *c.ids[: c.end]]
                logits = model(input_ids=torch.tensor([ids], device=device),
                               position_ids=torch.arange(n, n + len(ids), device=device)[None], use_cache=True,
                               logits_to_keep=c.end - c.start + 1, **{arg: cache}).logits[0, :-1]
                lp = torch.log_softmax(logits.float(), dim=-1)
                targets = torch.tensor(c.ids[c.start:c.end], device=device)
                row.append(float(lp[torch.arange(len(targets), device=device), targets].mean()))
            out.append(row)
    return out


def run_kv_crop(model, groups, conts) -> tuple[float, list]:
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    scores = [kv_crop_scores(model, points, conts) for points in groups]
    elapsed = time.perf_counter() - start
    model.train(was_training)
    return elapsed, scores


def _abs_diffs(a, b) -> list[float]:
    """|x - y| over groups, rows and values of two equally shaped score tables."""
    return [abs(x - y) for ga, gb in zip(a, b, strict=True) for ra, rb in zip(ga, gb, strict=True)
            for x, y in zip(ra, rb, strict=True)]


def max_diff(a, b) -> float:
    return max(_abs_diffs(a, b))


def mean_diff(a, b) -> float:
    d = _abs_diffs(a, b)
    return sum(d) / len(d)


def child(model: str, arm: str) -> None:
    """Peak resident memory while the arm runs, sampled every 2 ms, above the level before it."""
    import threading

    import psutil

    policy = load(model)
    groups, conts = workload(policy.tokenizer)
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
    run_arm(policy.model, policy.tokenizer, arm, groups, conts)
    done.set()
    t.join()
    print(json.dumps({"extra_peak_mib": (peak[0] - base) / 2**20, "peak_mib": peak[0] / 2**20}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", choices=["tree", "naive"])
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--k", type=int, default=4, help="episodes in the group")
    args = ap.parse_args()
    if args.child:
        return child(args.model, args.child)
    policy = load(args.model)
    groups, conts = workload(policy.tokenizer, k=args.k)
    run_arm(policy.model, policy.tokenizer, "tree", groups[:1], conts)  # warm-up
    run_kv_crop(policy.model, groups[:1], conts)
    tree_t, alone_t, naive_t, crop_t = [], [], [], []
    for repeat in range(args.repeats):  # interleaved so machine noise hits every arm
        t, tree_scores = run_arm(policy.model, policy.tokenizer, "tree", groups, conts)
        tree_t.append(t)
        print(f"run {repeat + 1}/{args.repeats}: tree {t:.3f} s", end="", flush=True)
        t, alone_scores = run_arm(policy.model, policy.tokenizer, "tree", groups, conts, share=False)
        alone_t.append(t)
        print(f", tree without the shared prompt {t:.3f} s", end="", flush=True)
        t, crop_scores = run_kv_crop(policy.model, groups, conts)
        crop_t.append(t)
        print(f", kv-crop {t:.3f} s", end="", flush=True)
        t, naive_scores = run_arm(policy.model, policy.tokenizer, "naive", groups, conts)
        naive_t.append(t)
        print(f", one forward per (point, ref) {t:.3f} s", flush=True)
    c, n, k = statistics.median(tree_t), statistics.median(naive_t), statistics.median(crop_t)
    a = statistics.median(alone_t)
    lens = [len(p) for p in groups[0]]
    print(f"model={args.model}: K={len(groups)} episodes x {len(groups[0])} scoring points (τ_0..τ_T, "
          f"{lens[0]}..{lens[-1]} tokens) x {len(conts)} references, official pseudo-answer, fp32")
    print(f"tree (prefix once + one masked forward): {c:.3f} s   one forward per (point, ref): {n:.3f} s   "
          f"speed-up {n / c:.2f}x (medians of {args.repeats})", flush=True)
    print(f"tree vs kv-crop: {k / c:.2f}x (kv-crop {k:.3f} s); each episode alone (no shared prompt) {a:.3f} s: "
          f"{k / a:.2f}x kv-crop, the shared prompt {a / c:.2f}x", flush=True)
    print(f"max |score difference| tree vs naive (fp32): {max_diff(tree_scores, naive_scores):.2e} nats; "
          f"shared prompt vs each episode alone {max_diff(tree_scores, alone_scores):.2e}; "
          f"tree vs kv-crop {max_diff(tree_scores, crop_scores):.2e}; kv-crop vs naive "
          f"{max_diff(crop_scores, naive_scores):.2e}", flush=True)
    bf16 = load(args.model, dtype="bfloat16")
    _, bf16_tree = run_arm(bf16.model, bf16.tokenizer, "tree", groups, conts)
    _, bf16_alone = run_arm(bf16.model, bf16.tokenizer, "tree", groups, conts, share=False)
    print(f"dtype=bfloat16 (tree) vs float32 (naive): max |score difference| {max_diff(bf16_tree, naive_scores):.3f} nats, "
          f"mean {mean_diff(bf16_tree, naive_scores):.3f} nats; each episode alone {max_diff(bf16_alone, naive_scores):.3f}, "
          f"mean {mean_diff(bf16_alone, naive_scores):.3f}; shared prompt vs alone (bf16) max "
          f"{max_diff(bf16_tree, bf16_alone):.3f} nats", flush=True)
    del bf16
    if args.no_memory:
        return
    for arm in ("tree", "naive"):
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--child", arm],
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        mem = json.loads(out)
        print(f"peak memory {arm:6s}: {mem['peak_mib']:.0f} MiB total, {mem['extra_peak_mib']:.0f} MiB above the loaded model",
              flush=True)


if __name__ == "__main__":
    main()
