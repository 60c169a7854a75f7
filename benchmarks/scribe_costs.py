"""SCRIBE costs and judge reliability with real components.

1. Library build for N step descriptions (default 1,000): embedding (all-MiniLM-L6-v2),
   two-level clustering (HDBSCAN / K-means skills, average-linkage families) and prototype
   distillation by the LLM, timed per stage. The descriptions come from 20 skill families x
   phrasing variants.
2. Judge calls per episode and cache hit rate, scoring episodes with ``scribe`` and ``prm``:
   a fit pass (decompose + build the library), a scoring pass (decompositions from the
   cache), and a repeat pass (all from the cache, as when a trainer re-scores unchanged content).
3. Repeat and cross-instance consistency of ``scribe`` vs ``prm`` on the same routed steps.
   ``--judges-only``: repeat consistency of the two judges alone, on hand-made steps (each
   paragraph of a turn) all graded against one hand-written math rubric, for a judge model too
   small to decompose (the default Gemma 3 270M base quotes no step it can be held to).

Episodes: ``--episodes FILE`` (e.g. the main job's), or, without one, episodes played through
the real MathCode-v0 env from MATH500 reference solutions: per item one rollout is the
solution (correct) and one is the same solution with a wrong boxed answer (incorrect), so each
turn is a long multi-step reasoning turn.

Usage: python benchmarks/scribe_costs.py [--n 1000] [--llm default] [--episodes FILE]
       [--math-items 4] [--repeats 3] [--max-new-tokens 256] [--judges-only [--temperature 0.7]]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time
from typing import Any

import numpy as np

from turngym.episode import Episode, read_episodes
from turngym.rewards import get_reward
from turngym.rewards.scribe.embed import SentenceEmbedder
from turngym.rewards.scribe.library import SkillItem, SkillPrototype, build_library
from turngym.rewards.scribe.reward import make_llm

FAMILIES = [
    ("solve", "a linear equation for x"), ("factor", "a quadratic polynomial"), ("state", "the integer bound of an inequality"),
    ("search", "for a person's birthplace"), ("search", "for the release year of a film"), ("compare", "two retrieved dates"),
    ("write", "python code that sums a list"), ("debug", "a python traceback"), ("print", "an intermediate value"),
    ("call", "a file system function to list files"), ("move", "a file into a folder"), ("book", "a flight with a travel API"),
    ("check", "an account balance before trading"), ("convert", "units of temperature"), ("count", "outcomes of a dice roll"),
    ("simplify", "a fraction to lowest terms"), ("verify", "an answer by substitution"),
    ("extract", "the answer span from a passage"),
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
        out.append(SkillItem(subgoal=text, skill=text))
    return out


def bench_library(n: int, llm: Any) -> None:
    """Embedding and clustering are timed and printed before distillation starts (the LLM stage is
    by far the slowest on a CPU)."""
    from turngym.rewards.scribe.cluster import cluster_skills
    from turngym.rewards.scribe.library import group_families

    embedder = SentenceEmbedder("default")
    embedder.embed(["warm up"])
    items = descriptions(n)
    t0 = time.perf_counter()
    vectors = embedder.embed([it.text for it in items])
    embed_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    clusters = cluster_skills(vectors, min_cluster_size=10)
    skills = [idx for _, idx in sorted(clusters.groups.items())]
    centroids = np.stack([vectors[idx].mean(axis=0) for idx in skills])
    families = group_families(centroids / np.linalg.norm(centroids, axis=1, keepdims=True), 0.3)
    cluster_s = time.perf_counter() - t0
    print(f"library for {n} descriptions, before distillation: embed {embed_s:.2f} s, two-level clustering "
          f"{cluster_s:.2f} s; {clusters.method} -> {len(skills)} skills in {len(set(families))} families", flush=True)
    before = llm.stats.to_dict()
    t0 = time.perf_counter()
    lib, timings = build_library(items, embedder, llm, min_cluster_size=10)
    total = time.perf_counter() - t0
    after = llm.stats.to_dict()
    print(f"library build, {n} descriptions: {total:.1f} s total ("
          + ", ".join(f"{k} {v:.2f}" for k, v in timings.items())
          + f"); {lib.clustering['method']} -> {lib.clustering['families']} families, {lib.clustering['skills']} skills "
            f"({lib.failed_distillations} failed distillations); distillation calls {after['calls'] - before['calls']}, "
            f"failed JSON {after['failed'] - before['failed']}", flush=True)


def wrong_boxed(text: str) -> str:
    """The same text with its last \\boxed{...} answer replaced by a wrong one."""
    at = text.rfind("\\boxed{")
    if at < 0:
        return text + " \\boxed{0}"
    depth, i = 0, at + len("\\boxed{") - 1
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            break
        i += 1
    answer = text[at + len("\\boxed{"):i]
    return text[:at] + "\\boxed{" + ("1" if answer.strip() == "0" else "0") + "}" + text[i + 1:]


def math_episodes(items: int) -> list[Episode]:
    import gymnasium

    import turngym  # noqa: F401 - registration
    from turngym.corpora.datasets import BUNDLED, _bundled_path, _read_rows

    rows = _read_rows(_bundled_path(BUNDLED["math500"].relpath))  # raw rows: the reference solutions
    chosen = [i for i, r in enumerate(rows) if 1000 <= len(r.get("solution", "")) <= 2500][:items]
    out = []
    for i in chosen:
        for k, text in enumerate([rows[i]["solution"], wrong_boxed(rows[i]["solution"])]):
            env = gymnasium.make("turngym/MathCode-v0", dataset="math500")
            env.reset(seed=0, options={"index": i})
            env.step(text)
            ep = env.unwrapped.episode
            ep.id, ep.group = f"math500-{i}-{k}", f"math500-{i}"
            out.append(ep)
            env.close()
    return out


def bench_judging(episodes: list[Episode], llm: Any) -> Any:
    groups: dict[str, list[Episode]] = {}
    for ep in episodes:
        groups.setdefault(ep.group or ep.id, []).append(ep)
    reward = get_reward("scribe", llm=llm, min_cluster_size=2)
    t0 = time.perf_counter()
    reward.fit(episodes)
    fit_s = time.perf_counter() - t0
    rate = lambda a, b: (b["cache_hits"] - a["cache_hits"]) / max(1, b["calls"] - a["calls"])  # noqa: E731
    s0 = llm.stats.to_dict()
    judge_calls, steps, t0 = 0, 0, time.perf_counter()
    diags = []
    for g in groups.values():
        d = reward.score_group(g).diagnostics
        judge_calls += d["judge_calls"]
        steps += d["step_count"]
        diags.append(d)
    score_s = time.perf_counter() - t0
    s1 = llm.stats.to_dict()
    for g in groups.values():
        reward.score_group(g)
    s2 = llm.stats.to_dict()
    lib = reward.library
    unmatched = sum(d["unmatched_steps"] for d in diags)
    print(f"scribe on {len(episodes)} episodes in {len(groups)} groups: fit {fit_s:.1f} s, scoring pass {score_s:.1f} s; "
          f"library {0 if lib is None else lib.clustering.get('families')} families / "
          f"{0 if lib is None else lib.clustering.get('skills')} skills; steps per episode {steps / len(episodes):.2f} "
          f"({unmatched} unmatched); judge calls per episode {judge_calls / len(episodes):.2f}; "
          f"LLM calls per episode (scoring pass) {(s1['calls'] - s0['calls']) / len(episodes):.2f}; "
          f"cache hit rate: scoring pass {rate(s0, s1):.2f}, repeat pass {rate(s1, s2):.2f}", flush=True)
    prm = get_reward("prm", llm=llm)
    p0 = llm.stats.to_dict()
    prm_calls = sum(prm.score_group(g).diagnostics["judge_calls"] for g in groups.values())
    p1 = llm.stats.to_dict()
    print(f"prm on the same episodes: judge calls per episode {prm_calls / len(episodes):.2f}; "
          f"cache hit rate {rate(p0, p1):.2f} (decompositions shared with scribe)", flush=True)
    print(f"LLM totals: {json.dumps(llm.stats.to_dict())}")
    return reward


def bench_reliability(episodes: list[Episode], reward: Any, repeats: int) -> None:
    from turngym.evals.ablate import reliability_table
    from turngym.rewards.scribe.diagnostics import reliability

    if reward.library is None:
        print("no library was built (no decomposed steps): no reliability figures")
        return
    t0 = time.perf_counter()
    r = reliability(episodes, reward, repeats=repeats)
    print(f"reliability ({time.perf_counter() - t0:.1f} s):", flush=True)
    print("\n".join(reliability_table(r)), flush=True)


MATH_STEP = SkillPrototype(
    id="hand", name="derive one step of a competition math solution",
    when_to_use="a step that transforms given quantities into a new fact on the way to the answer",
    checklist=["each equation follows from what was given or derived before", "every quantity used was defined",
               "the arithmetic and algebra are correct", "a final answer matches the question asked"],
    pitfalls=[{"mistake": "an arithmetic slip", "score": 1}, {"mistake": "a boundary or case left implicit", "score": 2},
              {"mistake": "an answer that does not follow from the work", "score": 0}])


def paragraph_jobs(episodes: list[Episode]) -> list[tuple[Episode, SkillItem, SkillPrototype]]:
    """Hand-made steps: the paragraphs of each turn (blank-line separated), all routed to MATH_STEP."""
    import re

    jobs = []
    for ep in episodes:
        for t in ep.turns:
            for m in re.finditer(r"(?:[^\n]|\n(?!\n))+", t.action):
                if m.group().strip():
                    jobs.append((ep, SkillItem(m.group()[:80], MATH_STEP.name, t.index, m.start(), m.end(), ep.id,
                                               m.group()), MATH_STEP))
    return jobs


def bench_judges_only(episodes: list[Episode], llm: Any, repeats: int, temperature: float) -> None:
    """Repeat consistency of the rubric judge vs the open PRM judge on hand-made steps: isolates the judge
    from the decomposer and the library (for a judge too small to decompose)."""
    from turngym.rewards.scribe.diagnostics import repeat_consistency
    from turngym.rewards.scribe.steps import judge_prompts, open_prompts

    jobs = paragraph_jobs(episodes)
    print(f"judge-only: {len(jobs)} hand-made steps (paragraphs) of {len(episodes)} episodes, {repeats} repeats "
          f"at temperature {temperature}", flush=True)
    for name, prompts in (("scribe", judge_prompts(jobs, llm)), ("prm", open_prompts([(e, it) for e, it, _ in jobs], llm))):
        t0 = time.perf_counter()
        r = repeat_consistency(prompts, llm, repeats, temperature)
        print(f"  {name}: exact agreement {r['exact_agreement']}, pairwise agreement {r['pairwise_agreement']}, "
              f"mean score range {r['mean_score_range']}, mean score std {r['mean_score_std']}, "
              f"judged every time {r['judged_every_time']}/{r['steps']} ({time.perf_counter() - t0:.0f} s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--llm", default="default")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--episodes", default=None, help="episodes JSONL (default: MATH500 solutions through MathCode-v0)")
    ap.add_argument("--math-items", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-library", action="store_true")
    ap.add_argument("--judges-only", action="store_true",
                    help="only repeat consistency of scribe's rubric judge vs prm on hand-made steps (paragraphs)")
    ap.add_argument("--temperature", type=float, default=0.7)
    args = ap.parse_args()
    llm = make_llm(args.llm, max_concurrency=8, max_new_tokens=args.max_new_tokens)
    print(f"judge model: {llm.name}", flush=True)
    episodes = read_episodes(args.episodes).episodes if args.episodes else math_episodes(args.math_items)
    if not episodes:
        raise SystemExit(f"no episodes in {args.episodes}")
    chars = [len(t.action) for e in episodes for t in e.turns]
    print(f"{len(episodes)} episodes, {sum(chars)} action characters, longest turn {max(chars)} characters", flush=True)
    if args.judges_only:
        bench_judges_only(episodes, llm, args.repeats, args.temperature)
        return
    reward = bench_judging(episodes, llm)
    bench_reliability(episodes, reward, args.repeats)
    if not args.skip_library:  # last: distilling a 1,000-description library is the longest stage on a CPU
        bench_library(args.n, llm)

if __name__ == "__main__":
    main()
