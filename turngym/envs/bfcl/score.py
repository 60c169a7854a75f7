"""BFCL accuracy per category and the V4 overall score, as bfcl-eval's leaderboard computes it.

The formula follows ``generate_leaderboard_csv`` in bfcl-eval 2026.3.23
(``eval_checker/eval_runner_helper.py``):

* non-live = unweighted mean of simple (itself the mean of Python, Java, JavaScript),
  multiple, parallel, parallel_multiple;
* live = mean of live simple / multiple / parallel / parallel_multiple weighted by
  their entry counts;
* irrelevance = unweighted mean of irrelevance and live_irrelevance;
* multi-turn = unweighted mean of base, miss_func, miss_param, long_context;
* agentic = unweighted mean of web search (base, no_snippet) and memory (kv, vector,
  rec_sum);
* overall = 10% non-live + 10% live + 10% irrelevance + 30% multi-turn + 40% agentic.

A category that was not evaluated counts as 0, exactly as on the leaderboard, and is
listed under ``missing``. Web search needs a live search API and memory_vector a hub
model, so BFCL-v0 cannot run them offline: an offline overall is at most 0.6 + 0.4 x 1/3
(memory kv and rec_sum only) = 0.733.
This module needs no bfcl-eval install; a test checks it against bfcl-eval's functions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from turngym.envs.bfcl.categories import IRRELEVANCE, LIVE_AST, MEMORY_V4, MULTI_TURN, NON_LIVE_AST, SIMPLE, V4_COUNTS, WEB_SEARCH
from turngym.episode import Episode
from turngym.grading.metrics import wilson

V4_WEIGHTS = {"non_live": 10, "live": 10, "irrelevance": 10, "multi_turn": 30, "agentic": 40}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def v4_summary(accuracy: dict[str, float], counts: dict[str, int] | None = None) -> dict[str, Any]:
    """Group scores and the weighted overall from per-category accuracies (0..1)."""
    counts = {**V4_COUNTS, **(counts or {})}
    acc = lambda c: float(accuracy.get(c, 0.0))  # noqa: E731 - missing counts as 0, as on the leaderboard
    simple = _mean([acc(c) for c in SIMPLE])
    non_live = _mean([simple] + [acc(c) for c in NON_LIVE_AST if c not in SIMPLE])
    live = sum(acc(c) * counts[c] for c in LIVE_AST) / sum(counts[c] for c in LIVE_AST)
    irrelevance = _mean([acc(c) for c in IRRELEVANCE])
    multi_turn = _mean([acc(c) for c in MULTI_TURN])
    agentic = _mean([_mean([acc(c) for c in WEB_SEARCH]), _mean([acc(c) for c in MEMORY_V4])])
    groups = {"non_live": non_live, "live": live, "irrelevance": irrelevance, "multi_turn": multi_turn,
              "agentic": agentic}
    total = sum(V4_WEIGHTS.values())
    overall = sum(groups[g] * w / total for g, w in V4_WEIGHTS.items())
    return {"groups": groups, "overall_v4": overall, "relevance": acc("live_relevance"),
            "missing": [c for c in V4_COUNTS if c not in accuracy]}


def bfcl_metrics(episodes: Iterable[Episode]) -> dict[str, Any]:
    """Per-category accuracy (Wilson 95% CI) and the V4 summary for episodes with ``bfcl_valid``."""
    by_cat: dict[str, list[bool]] = defaultdict(list)
    items: dict[str, set[str]] = defaultdict(set)
    for ep in episodes:
        if "bfcl_valid" in ep.outcome:
            cat = str(ep.outcome.get("category") or ep.task.get("dataset") or "?")
            by_cat[cat].append(bool(ep.outcome["bfcl_valid"]))
            items[cat].add(str(ep.task.get("id", ep.id)))
    if not by_cat:
        return {}
    per_category = {c: wilson(sum(v), len(v)).to_dict() for c, v in sorted(by_cat.items())}
    accuracy = {c: sum(v) / len(v) for c, v in by_cat.items() if c in V4_COUNTS}
    summary = v4_summary(accuracy)
    subsets = {c: len(items[c]) for c in by_cat if c in V4_COUNTS and len(items[c]) < V4_COUNTS[c]}
    return {"per_category": per_category, **summary, "episodes_per_category": {c: len(v) for c, v in by_cat.items()},
            "partial_categories": subsets,  # category -> items evaluated, where fewer than all
            "note": "missing categories count as 0 (leaderboard rule); web search and memory_vector cannot run "
                    "offline, so an offline overall is at most 0.733"}
