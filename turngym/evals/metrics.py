"""Benchmark metrics over episodes, with confidence intervals.

Binary outcomes get Wilson 95% intervals; means of continuous scores (F1) and pass@k get
percentile bootstrap intervals over tasks (seeded, so a report is reproducible). pass@k uses
the unbiased estimator 1 − C(n−c, k)/C(n, k) per task (Chen et al., 2021).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from turngym.episode import Episode


@dataclass
class Estimate:
    value: float
    low: float
    high: float
    n: int

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "ci95": [self.low, self.high], "n": self.n}

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}] (n={self.n})"


def wilson(successes: float, n: int, z: float = 1.959964) -> Estimate:
    if n == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)


def bootstrap_mean(values: Sequence[float], reps: int = 2000, seed: int = 0) -> Estimate:
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, arr.size, size=(reps, arr.size))].mean(axis=1)
    return Estimate(float(arr.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)), int(arr.size))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with n samples of which c are correct."""
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def group_by_task(episodes: Iterable[Episode]) -> dict[str, list[Episode]]:
    groups: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        groups[ep.group or ep.id].append(ep)
    return dict(groups)


def _binary(ep: Episode, key: str) -> float:
    return float(bool(ep.outcome.get(key)))


def outcome_metrics(episodes: Sequence[Episode], k: int = 1) -> dict[str, Any]:
    """Accuracy-style metrics for whatever outcome fields the episodes carry."""
    out: dict[str, Any] = {}
    if not episodes:
        return out
    keys = set().union(*(e.outcome.keys() for e in episodes))
    if "correct" in keys:
        values = [float(e.outcome.get("correct") or 0.0) for e in episodes]
        if all(v in (0.0, 1.0) for v in values):
            out["accuracy"] = wilson(sum(values), len(values)).to_dict()
        else:
            out["accuracy"] = bootstrap_mean(values).to_dict()
        tasks = group_by_task(episodes)
        per_task_c = [(len(g), sum(_binary(e, "correct") for e in g)) for g in tasks.values()]
        out["pass@1"] = bootstrap_mean([c / n for n, c in per_task_c]).to_dict()
        for kk in sorted({1, k}):
            if kk > 1 and all(n >= kk for n, _ in per_task_c):
                out[f"pass@{kk}"] = bootstrap_mean([pass_at_k(n, int(c), kk) for n, c in per_task_c]).to_dict()
    for key in ("em", "f1"):
        if key in keys:
            out[key] = bootstrap_mean([float(e.outcome.get(key) or 0.0) for e in episodes]).to_dict()
    if "bfcl_valid" in keys:
        out["bfcl_accuracy"] = wilson(sum(_binary(e, "bfcl_valid") for e in episodes), len(episodes)).to_dict()
    return out


def behaviour_metrics(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Turns, tool calls, errors, latency and truncation: what the agent did, not how well."""
    if not episodes:
        return {}
    turns = [len(e.turns) for e in episodes]
    calls = [sum(len(t.tool_calls) for t in e.turns) for e in episodes]
    errors = [sum(t.parse_error is not None for t in e.turns) for e in episodes]
    gen = [sum(t.latency_ms.get("generate", 0.0) for t in e.turns) for e in episodes]
    tool = [sum(t.latency_ms.get("tool", 0.0) for t in e.turns) for e in episodes]
    return {
        "episodes": len(episodes),
        "turns_per_episode": bootstrap_mean(turns).to_dict(),
        "tool_calls_per_episode": bootstrap_mean(calls).to_dict(),
        "parse_errors_per_episode": bootstrap_mean(errors).to_dict(),
        "truncated_rate": wilson(sum(e.truncated for e in episodes), len(episodes)).to_dict(),
        "answered_rate": wilson(sum(e.final_answer is not None for e in episodes), len(episodes)).to_dict(),
        "latency_ms": {"generate_mean": float(np.mean(gen)), "tool_mean": float(np.mean(tool)),
                       "episode_p50": float(np.percentile([e.meta.get("wall_ms", 0.0) for e in episodes], 50)),
                       "episode_p95": float(np.percentile([e.meta.get("wall_ms", 0.0) for e in episodes], 95))},
    }


def per_dataset(episodes: Sequence[Episode], k: int = 1) -> dict[str, Any]:
    by: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        by[str(ep.task.get("dataset", "unknown"))].append(ep)
    table = {name: outcome_metrics(eps, k) for name, eps in sorted(by.items())}
    for key in ("em", "f1", "accuracy"):
        vals = [m[key]["value"] for m in table.values() if key in m]
        if len(vals) > 1:
            table.setdefault("_average", {})[key] = float(np.mean(vals))
    return table
