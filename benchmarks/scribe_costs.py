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
       [--unlocated drop|whole_turn] [--locate exact|fuzzy] [--llm-cache FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from turngym.episode import Episode
from turngym.episode.reader import read_episodes
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


def bench_library(n: int, llm: Any) -> dict[str, Any]:
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
    calls = {k: after[k] - before[k] for k in ("calls", "cache_hits", "generated", "repaired", "reasked", "failed")}
    print(f"library build, {n} descriptions: {total:.1f} s total ("
          + ", ".join(f"{k} {v:.2f}" for k, v in timings.items())
          + f"); {lib.clustering['method']} -> {lib.clustering['families']} families, {lib.clustering['skills']} skills "
            f"({lib.failed_distillations} failed distillations); distillation LLM calls {calls['calls']} "
            f"({calls['generated']} generations incl. re-asks; JSON repaired {calls['repaired']}, re-asked "
            f"{calls['reasked']}, failed {calls['failed']})", flush=True)
    return {"descriptions": n, "total_s": total, **timings, "clusters_before_distillation": len(skills),
            "families": lib.clustering["families"], "skills": lib.clustering["skills"],
            "method": lib.clustering["method"], "failed_distillations": lib.failed_distillations,
            "distillation_llm": calls}


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


def judged_episodes(diags: list[dict[str, Any]]) -> int:
    """Episodes with at least one step sent to the judge (judged, or judged without valid JSON)."""
    return sum(any(st["status"] != "unmatched" for st in ep) for d in diags for ep in d["steps"])


def per_judged(calls: int, judged: int) -> float | None:
    return calls / judged if judged else None


def fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def stat_delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """LLM call counts between two ``llm.stats.to_dict()`` readings, with the cache hit rate of that stretch."""
    d = {k: b[k] - a[k] for k in ("calls", "cache_hits", "generated", "repaired", "reasked", "failed")}
    d["cache_hit_rate"] = d["cache_hits"] / d["calls"] if d["calls"] else None
    return d


def bench_judging(episodes: list[Episode], llm: Any, unlocated: str,
                  locate: str = "exact") -> tuple[Any, Any, dict[str, Any]]:
    groups: dict[str, list[Episode]] = {}
    for ep in episodes:
        groups.setdefault(ep.group_key, []).append(ep)
    reward = get_reward("scribe", llm=llm, min_cluster_size=2, unlocated_steps=unlocated, locate_steps=locate)
    f0 = llm.stats.to_dict()
    t0 = time.perf_counter()
    reward.fit(episodes)
    fit_s = time.perf_counter() - t0
    f1 = llm.stats.to_dict()
    decomps = reward.decompose(episodes)  # from the cache
    d_fail = sum(d.failed_windows for d in decomps)
    d_windows = sum(d.windows for d in decomps)
    print(f"fit (decompose + build library): {fit_s:.1f} s, {json.dumps(stat_delta(f0, f1))}; decomposition: "
          f"{d_windows} windows, {d_fail} with no valid JSON, {sum(len(d.items) for d in decomps)} steps: "
          f"{sum(len(d.items) - d.whole_turn_steps for d in decomps)} located by their quote "
          f"({sum(d.fuzzy_located for d in decomps)} quote placements fuzzy, locate={locate}) and "
          f"{sum(d.whole_turn_steps for d in decomps)} whole-turn steps (unlocated={unlocated}); "
          f"{sum(d.dropped for d in decomps)} quotes not found, "
          f"{sum(len(d.unstepped_turns) for d in decomps)} of {sum(len(e.turns) for e in episodes)} turns unstepped",
          flush=True)
    def rate(a, b):
        return (b["cache_hits"] - a["cache_hits"]) / max(1, b["calls"] - a["calls"])

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
    judge_failed = sum(d["judge_failed_steps"] for d in diags)
    judged = judged_episodes(diags)
    print(f"scribe judge: {judge_failed} of {judge_calls} judged steps with no valid JSON (valued neutral, counted); "
          f"{judged} of {len(episodes)} episodes judged, judge calls per judged episode "
          f"{fmt(per_judged(judge_calls, judged))}", flush=True)
    prm = get_reward("prm", llm=llm, unlocated_steps=unlocated, locate_steps=locate)
    p0 = llm.stats.to_dict()
    prm_diags = [prm.score_group(g).diagnostics for g in groups.values()]
    prm_calls = sum(d["judge_calls"] for d in prm_diags)
    p1 = llm.stats.to_dict()
    prm_failed = sum(d["judge_failed_steps"] for d in prm_diags)
    prm_judged = judged_episodes(prm_diags)
    print(f"prm on the same episodes: judge calls per episode {prm_calls / len(episodes):.2f}, per judged episode "
          f"{fmt(per_judged(prm_calls, prm_judged))} ({prm_judged} judged); "
          f"cache hit rate {rate(p0, p1):.2f} (decompositions shared with scribe); {prm_failed} of {prm_calls} "
          f"judged steps with no valid JSON", flush=True)
    print(f"LLM totals: {json.dumps(llm.stats.to_dict())}")
    figures = {
        "episodes": len(episodes), "groups": len(groups), "turns": sum(len(e.turns) for e in episodes),
        "fit_s": fit_s, "fit_llm": stat_delta(f0, f1), "decompose_windows": d_windows,
        "decompose_windows_failed": d_fail, "steps": steps, "unmatched_steps": unmatched,
        "dropped_steps": sum(d.dropped for d in decomps),
        "whole_turn_steps": sum(d.whole_turn_steps for d in decomps), "unlocated": unlocated,
        "fuzzy_located_steps": sum(d.fuzzy_located for d in decomps), "locate": locate,
        "unstepped_turns": sum(len(d.unstepped_turns) for d in decomps),
        "library": None if lib is None else {"families": lib.clustering.get("families"),
                                             "skills": lib.clustering.get("skills"),
                                             "failed_distillations": lib.failed_distillations},
        "library_builds": reward.refreshes,  # each build: items, prototypes, timings; kept_previous when all failed
        "scribe": {"score_s": score_s, "judge_calls_per_episode": judge_calls / len(episodes),
                   "judged_episodes": judged, "judge_calls_per_judged_episode": per_judged(judge_calls, judged),
                   "judge_failed_steps": judge_failed, "scoring_pass_llm": stat_delta(s0, s1),
                   "repeat_pass_llm": stat_delta(s1, s2)},
        "prm": {"judge_calls_per_episode": prm_calls / len(episodes), "judge_failed_steps": prm_failed,
                "judged_episodes": prm_judged, "judge_calls_per_judged_episode": per_judged(prm_calls, prm_judged),
                "llm": stat_delta(p0, p1)},
        "llm_totals": llm.stats.to_dict()}
    return reward, prm, figures


def bench_reliability(episodes: list[Episode], reward: Any, repeats: int, temperature: float,
                      repeat_tokens: int | None) -> dict[str, Any] | None:
    from turngym.credit.ablate import reliability_table
    from turngym.rewards.scribe.diagnostics import reliability

    if reward.library is None:
        why = ("no decomposed steps" if not reward.refreshes else
               f"every distillation failed: {reward.refreshes[-1]['items']} steps clustered, no rubric came back")
        print(f"no library ({why}): no reliability figures")
        return None
    if repeats == 0:
        print("--repeats 0: no reliability figures")
        return None
    t0 = time.perf_counter()
    r = reliability(episodes, reward, repeats=repeats, temperature=temperature, repeat_max_new_tokens=repeat_tokens)
    r["seconds"] = time.perf_counter() - t0
    print(f"reliability ({r['seconds']:.1f} s):", flush=True)
    print("\n".join(reliability_table(r)), flush=True)
    for name, j in r["judges"].items():
        if j["repeat"] is not None:
            print(f"  {name} repeats: judge replies with no valid JSON {j['repeat']['llm']['failed']} of "
                  f"{j['repeat']['llm']['calls']} (repaired {j['repeat']['llm']['repaired']}, re-asked "
                  f"{j['repeat']['llm']['reasked']})", flush=True)
    return r


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


def load_episodes(paths: list[str], limit: int | None) -> list[Episode]:
    """Episodes of every file (at most ``limit`` groups per file, whole groups), ids made unique across files."""
    out: list[Episode] = []
    for path in paths:
        report = read_episodes(path)
        if report.errors:
            print(f"warning: skipped {len(report.errors)} corrupt line(s) in {path} (first: {report.errors[0]})")
        kept: list[str] = []
        for ep in report.episodes:
            g = ep.group_key
            if g not in kept and limit is not None and len(kept) >= limit:
                continue
            if g not in kept:
                kept.append(g)
            if len(paths) > 1:
                ep.id, ep.group = f"{ep.env_id}:{ep.id}", f"{ep.env_id}:{g}"
            out.append(ep)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--llm", default="default")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--episodes", nargs="+", default=None,
                    help="episodes JSONL file(s) (default: MATH500 solutions through MathCode-v0)")
    ap.add_argument("--groups-per-file", type=int, default=None, help="at most this many groups of each file")
    ap.add_argument("--math-items", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="judgements per step for repeat consistency (0: skip)")
    ap.add_argument("--skip-library", action="store_true")
    ap.add_argument("--library-only", action="store_true", help="only the library build for --n descriptions")
    ap.add_argument("--judges-only", action="store_true",
                    help="only repeat consistency of scribe's rubric judge vs prm on hand-made steps (paragraphs)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--unlocated", default="drop", choices=["drop", "whole_turn"],
                    help="a turn none of whose step quotes is found: dropped, or one whole-turn step")
    ap.add_argument("--locate", default="exact", choices=["exact", "fuzzy"],
                    help="a step quote not found verbatim: not located (exact), or placed by word coverage (fuzzy)")
    ap.add_argument("--llm-cache", default=None, help="JSONL cache of LLM replies (greedy calls; reused by reruns)")
    ap.add_argument("--repeat-max-new-tokens", type=int, default=None,
                    help="tokens each repeat judgement generates (a local judge's score is chosen before any)")
    ap.add_argument("--out", default=None, help="write every figure as JSON here")
    ap.add_argument("--ablate-out", default=None,
                    help="also write `turngym ablate`'s report (ablation.md with the reliability table) for scribe "
                         "and prm on these episodes here")
    args = ap.parse_args()
    if args.repeats == 1 or args.repeats < 0 or (args.judges_only and args.repeats < 2):
        ap.error("--repeats must be at least 2 (or 0: no reliability figures, not with --judges-only)")
    from turngym.agents.loading import model_identity

    llm = make_llm(args.llm, max_concurrency=8, max_new_tokens=args.max_new_tokens, cache_path=args.llm_cache)
    results: dict[str, Any] = {"args": vars(args), "judge_model": model_identity(args.llm)}
    print(f"judge model: {llm.name} {json.dumps(results['judge_model'])}", flush=True)

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")

    if args.library_only:
        t0 = time.perf_counter()
        results["library"] = bench_library(args.n, llm)
        results["wall_s"] = time.perf_counter() - t0
        save()
        return

    episodes = load_episodes(args.episodes, args.groups_per_file) if args.episodes else math_episodes(args.math_items)
    if not episodes:
        raise SystemExit(f"no episodes in {args.episodes}")
    chars = [len(t.action) for e in episodes for t in e.turns]
    results["episodes"] = {"count": len(episodes), "turns": len(chars), "action_chars": sum(chars),
                           "longest_turn_chars": max(chars), "envs": sorted({e.env_id for e in episodes})}
    print(f"{len(episodes)} episodes, {sum(chars)} action characters, longest turn {max(chars)} characters", flush=True)

    if args.judges_only:
        bench_judges_only(episodes, llm, args.repeats, args.temperature)
        return
    t0 = time.perf_counter()
    reward, prm, results["judging"] = bench_judging(episodes, llm, args.unlocated, args.locate)
    save()
    results["reliability"] = rel = bench_reliability(episodes, reward, args.repeats, args.temperature,
                                                      args.repeat_max_new_tokens)
    save()
    if args.ablate_out:  # `turngym ablate`'s report on the same rewards (scores and judgements from the cache)
        from turngym.credit.ablate import ablate

        ablate(episodes, {"scribe": reward, "prm": prm}, args.ablate_out, reliability=rel)
        print(f"ablation report: {Path(args.ablate_out) / 'ablation.md'}", flush=True)
    if not args.skip_library:  # last: distilling a 1,000-description library is the longest stage on a CPU
        results["library"] = bench_library(args.n, llm)
    results["wall_s"] = time.perf_counter() - t0
    save()


if __name__ == "__main__":
    main()
