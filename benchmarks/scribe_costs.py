"""SCRIBE costs with real components.

1. Library build for N skill descriptions (default 1,000): embedding (all-MiniLM-L6-v2),
   clustering (HDBSCAN, K-means fallback) and prototype distillation by the LLM, timed
   per stage. The descriptions are made from 20 skill families x phrasing variants.
2. Judge calls per episode and cache hit rate, scoring saved episodes with the
   ``scribe`` reward: a fit pass (decompose + build the library), a scoring pass (the
   decompositions come from the cache), and a second scoring pass (all from the cache,
   as when a trainer re-scores unchanged content).

Usage: python benchmarks/scribe_costs.py [--n 1000] [--llm default]
       [--episodes runs/main/searchqa-hotpotqa/episodes.jsonl]   (from `bash scripts/main.sh`)
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time
from pathlib import Path

from turngym.episode import read_episodes
from turngym.rewards import get_reward
from turngym.rewards.scribe.embed import SentenceEmbedder
from turngym.rewards.scribe.library import SkillItem, build_library
from turngym.rewards.scribe.reward import make_llm

FAMILIES = [
    ("solve", "a linear equation for x"), ("factor", "a quadratic polynomial"), ("state", "the integer bound of an inequality"),
    ("search", "for a person's birthplace"), ("search", "for the release year of a film"), ("compare", "two retrieved dates"),
    ("write", "python code that sums a list"), ("debug", "a python traceback"), ("print", "an intermediate value"),
    ("call", "a file system function to list files"), ("move", "a file into a folder"), ("book", "a flight with a travel API"),
    ("check", "an account balance before trading"), ("convert", "units of temperature"), ("count", "outcomes of a dice roll"),
    ("simplify", "a fraction to lowest terms"), ("verify", "an answer by substitution"), ("extract", "the answer span from a passage"),
    ("post", "a message with a messaging API"), ("cite", "the passage that supports an answer"),
]
FRAMES = ["{v} {o}", "{v} {o} carefully", "first {v} {o}", "{v} {o} step by step", "then {v} {o}",
          "{v} {o} to make progress", "try to {v} {o}", "{v} {o} before answering", "{v} {o} again", "quickly {v} {o}"]
CONTEXTS = ["", " for this task", " given the question", " using the tool", " from the observation"]


def descriptions(n: int, seed: int = 0) -> list[SkillItem]:
    combos = [(f, fr, c) for f in FAMILIES for fr in FRAMES for c in CONTEXTS]
    rng = random.Random(seed)
    rng.shuffle(combos)
    out = []
    for (v, o), fr, c in itertools.islice(itertools.cycle(combos), n):
        text = fr.format(v=v, o=o) + c
        out.append(SkillItem(subgoal=text, skill=text, first_turn=0, last_turn=0))
    return out


def bench_library(n: int, llm_spec: str) -> None:
    llm = make_llm(llm_spec, max_concurrency=8)
    embedder = SentenceEmbedder("default")
    embedder.embed(["warm up"])
    t0 = time.perf_counter()
    lib, timings = build_library(descriptions(n), embedder, llm, min_cluster_size=10)
    total = time.perf_counter() - t0
    print(f"library build, {n} descriptions: {total:.1f} s total "
          + ", ".join(f"{k} {v:.2f}" for k, v in timings.items())
          + f"; {lib.clustering.get('method')} -> {len(lib.prototypes)} prototypes "
            f"({lib.failed_distillations} failed distillations); llm {json.dumps(llm.stats.to_dict())}")


def bench_judging(path: str, llm_spec: str) -> None:
    report = read_episodes(path)
    episodes = report.episodes
    if not episodes:
        raise SystemExit(f"no episodes in {path}; run `bash scripts/main.sh` first")
    groups: dict[str, list] = {}
    for ep in episodes:
        groups.setdefault(ep.group or ep.id, []).append(ep)
    reward = get_reward("scribe", llm=llm_spec, min_cluster_size=2)
    t0 = time.perf_counter()
    reward.fit(episodes)
    fit_s = time.perf_counter() - t0
    s0 = reward.llm.stats.to_dict()
    judge_calls = 0
    t0 = time.perf_counter()
    for g in groups.values():
        judge_calls += reward.score_group(g).diagnostics["judge_calls"]
    score_s = time.perf_counter() - t0
    s1 = reward.llm.stats.to_dict()
    for g in groups.values():
        reward.score_group(g)
    s2 = reward.llm.stats.to_dict()
    rate = lambda a, b: (b["cache_hits"] - a["cache_hits"]) / max(1, b["calls"] - a["calls"])  # noqa: E731
    lib = reward.library
    print(f"judging {len(episodes)} episodes in {len(groups)} groups: fit {fit_s:.1f} s, scoring pass {score_s:.1f} s; "
          f"library {0 if lib is None else len(lib.prototypes)} prototypes; "
          f"judge calls per episode {judge_calls / len(episodes):.2f}; "
          f"LLM calls per episode (scoring pass) {(s1['calls'] - s0['calls']) / len(episodes):.2f}; "
          f"cache hit rate: scoring pass {rate(s0, s1):.2f}, repeat pass {rate(s1, s2):.2f}, "
          f"overall {s2['cache_hit_rate']:.2f}; failed JSON {s2['failed']} of {s2['calls'] - s2['cache_hits']} generated calls")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--llm", default="default")
    ap.add_argument("--episodes", default="runs/main/searchqa-hotpotqa/episodes.jsonl")
    ap.add_argument("--skip-library", action="store_true")
    args = ap.parse_args()
    if not args.skip_library:
        bench_library(args.n, args.llm)
    if Path(args.episodes).is_file():
        bench_judging(args.episodes, args.llm)
    else:
        print(f"skipping the judging figures: {args.episodes} not found (run `bash scripts/main.sh`)")


if __name__ == "__main__":
    main()
