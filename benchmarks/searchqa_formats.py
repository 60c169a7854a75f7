"""Which SearchQA-v0 tool format makes the embedded instruct model search?

Plays the same HotpotQA items greedily in the Search-R1 tag format and in the native
function-tool format (Hermes ``<tool_call>``), with one loaded model, and prints per format:
searches per episode, share of episodes that searched, retrieval hits, answered rate, EM, F1.
Usage: python benchmarks/searchqa_formats.py [--model qwen2.5-coder-0.5b-instruct] [--limit 8]
"""

from __future__ import annotations

import argparse
import time

import gymnasium

import turngym  # noqa: F401
from turngym.agents.loading import load_policy
from turngym.agents.policy import SamplingParams
from turngym.agents.runner import RolloutRunner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--dataset", default="hotpotqa")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--formats", default="tags,native")
    args = ap.parse_args()
    policy = load_policy(args.model)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    for fmt in args.formats.split(","):

        def make(fmt: str = fmt):
            return gymnasium.make("turngym/SearchQA-v0", dataset=args.dataset, tool_format=fmt, max_turns=3)

        runner = RolloutRunner(policy, make, sampling, k=1, concurrency=8, run_tag=fmt)
        start = time.perf_counter()
        eps = runner.run(range(args.limit))
        wall = time.perf_counter() - start
        searches = [sum(t.metrics.get("action") == "search" for t in e.turns) for e in eps]
        hits = sum(bool(t.metrics.get("retrieval_hit")) for e in eps for t in e.turns)
        n = len(eps)
        print(f"{fmt:7s} n={n} searched={sum(s > 0 for s in searches)}/{n} searches/ep={sum(searches) / n:.2f} "
              f"hits={hits} answered={sum(e.final_answer is not None for e in eps)}/{n} "
              f"EM={sum(e.outcome['em'] for e in eps) / n:.3f} F1={sum(e.outcome['f1'] for e in eps) / n:.3f} "
              f"wall={wall:.0f}s", flush=True)
        for e in eps[:2]:
            print("  example:", repr(e.turns[0].action[:200]))


if __name__ == "__main__":
    main()
