"""Benchmark metrics over episodes, with 95% confidence intervals.

One rule decides every interval (documented in docs/viewer.md, "Intervals"):

- **The unit** is the episode when every task was sampled once, and the task (its K samples
  averaged) as soon as any task has more than one sample: the K samples of one query are not
  independent, so counting them as K units would make intervals too narrow (pseudo-replication).
  This depends on the sampling design only, never on the outcomes.
- **The method** follows from what the metric scores per unit, by definition:
  binary per unit (correct, EM, BFCL validity, truncated, answered, each over single-sample
  episodes) → the Wilson score interval (``scipy.stats.binomtest(k, n)
  .proportion_ci(method="wilson")``), defined for k = 0, k = n and n = 1;
  fractional per unit (F1, any per-task average of K > 1 samples, pass@k for k > 1, counts
  per episode) → the BCa bootstrap interval of the mean (``scipy.stats.bootstrap``, 2,000
  resamples, seeded: reports are reproducible). An env that gives partial credit (a
  ``correct`` strictly between 0 and 1, e.g. the digits env) makes accuracy fractional.
- A bootstrap needs at least two units that differ. With one unit, or all units equal, the
  sample says nothing about spread: the interval is *undefined* (NaN bounds, ``ci`` says
  why) rather than a false zero width. An empty sample has value NaN.

With a binary ``correct`` (every env but partial-credit ones), accuracy and pass@1 are the same
estimate with the same interval, whatever K is. pass@k uses the unbiased estimator
1 − C(n−c, k)/C(n, k) per task (Chen et al., 2021). An env that gives partial credit (a ``correct``
strictly between 0 and 1 in any episode) declares no success, so pass@k is not reported there:
accuracy is the mean credit.

A refused or timed-out answer is graded wrong by the env and counts as wrong here. Only an
ungraded episode (the grader itself failed, :attr:`Episode.ungraded`) is left out, and counted.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from turngym.episode import Episode, group_episodes

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
NAN = float("nan")


@dataclass
class Estimate:
    """A point value, its 95% interval and how the interval was made (``ci``)."""

    value: float
    low: float
    high: float
    n: int
    ci: str = "wilson"

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "ci95": [self.low, self.high], "n": self.n, "ci": self.ci}

    def __str__(self) -> str:
        if not self.has_interval:
            return f"{self.value:.3f} (n={self.n}; {self.ci})"
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}] (n={self.n})"


def wilson(successes: float, n: int) -> Estimate:
    """Wilson score interval for ``successes`` out of ``n`` (a whole number of successes)."""
    if n == 0:
        return Estimate(NAN, NAN, NAN, 0, "no data")
    from scipy.stats import binomtest

    k = round(successes)
    if abs(successes - k) > 1e-9 or not 0 <= k <= n:
        raise ValueError(f"wilson needs a whole number of successes in [0, {n}], got {successes}")
    ci = binomtest(k, n).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
    p = k / n
    # the bounds are computed in floating point: keep them on the right side of p (k = 0 or n gave 1e-19 overshoots)
    return Estimate(p, min(float(ci.low), p), max(float(ci.high), p), n, "wilson")


def bootstrap_mean(values: Sequence[float], reps: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Estimate:
    """BCa bootstrap interval of the mean; undefined (NaN bounds) where the sample has no spread."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return Estimate(NAN, NAN, NAN, 0, "no data")
    mean = float(arr.mean())
    if arr.size == 1:
        return Estimate(mean, NAN, NAN, 1, "no interval: one unit")
    if np.all(arr == arr[0]):
        return Estimate(mean, NAN, NAN, int(arr.size), "no interval: all values equal")
    from scipy.stats import bootstrap

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples are handled below, not printed
        res = bootstrap((arr,), np.mean, confidence_level=CONFIDENCE, n_resamples=reps, method="BCa",
                        rng=np.random.default_rng(seed), batch=max(1, min(reps, 2_000_000 // arr.size)))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return Estimate(mean, NAN, NAN, int(arr.size), "no interval: degenerate bootstrap")
    return Estimate(mean, lo, hi, int(arr.size), "bootstrap BCa")


def rate(values: Sequence[float], *, binary: bool) -> Estimate:
    """A rate in [0, 1] over units: Wilson when the metric scores each unit 0 or 1 by definition
    (``binary``), else the bootstrap of the mean (the module's rule)."""
    arr = np.asarray(values, dtype=float)
    if not binary:
        return bootstrap_mean(arr)
    if not np.all((arr == 0.0) | (arr == 1.0)):
        raise ValueError("a binary rate needs every unit to score 0 or 1")
    return wilson(float(arr.sum()), int(arr.size))


def units(episodes: Sequence[Episode]) -> list[list[Episode]]:
    """The sampling units: one per task when any task has more than one sample, else one per episode."""
    tasks = group_episodes(episodes)
    if any(len(g) > 1 for g in tasks):
        return list(tasks)
    return [[e] for e in episodes]


def unit_rate(groups: Sequence[Sequence[Episode]], score: Any, binary: bool) -> Estimate:
    """The mean over units of each unit's mean ``score``; binary per unit only for a binary score
    on single-episode units."""
    values = [sum(score(e) for e in u) / len(u) for u in groups]
    return rate(values, binary=binary and all(len(u) == 1 for u in groups))


def unit_mean(groups: Sequence[Sequence[Episode]], score: Any) -> Estimate:
    """The mean over units of each unit's mean ``score`` (a count), with the bootstrap interval."""
    return bootstrap_mean([sum(score(e) for e in u) / len(u) for u in groups])


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with n samples of which c are correct."""
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _binary(ep: Episode, key: str) -> float:
    return float(bool(ep.outcome.get(key)))


def _score(ep: Episode, key: str) -> float:
    return float(ep.outcome.get(key) or 0.0)


def ungraded(episodes: Sequence[Episode]) -> int:
    """Episodes without a verdict because the grader itself failed (no answer caused it; a refused or
    timed-out answer is wrong): left out of every rate, counted and shown instead."""
    return sum(e.ungraded for e in episodes)


def outcome_metrics(episodes: Sequence[Episode], k: int = 1) -> dict[str, Any]:
    """Accuracy-style metrics for whatever outcome fields the episodes carry."""
    out: dict[str, Any] = {}
    episodes = [e for e in episodes if not e.ungraded]  # no verdict: see ``ungraded``
    if not episodes:
        return out
    keys = set().union(*(e.outcome.keys() for e in episodes))
    groups = units(episodes)
    if "correct" in keys:
        scores = [_score(e, "correct") for e in episodes]
        whole = all(v in (0.0, 1.0) for v in scores)  # False only for envs that give partial credit
        out["accuracy"] = unit_rate(groups, lambda e: _score(e, "correct"), binary=whole).to_dict()
        if whole:  # partial credit declares no success: no pass@k there (accuracy is the mean credit)
            per_task_c = [(len(g), sum(_binary(e, "correct") for e in g)) for g in group_episodes(episodes)]
            out["pass@1"] = rate([c / n for n, c in per_task_c], binary=all(n == 1 for n, _ in per_task_c)).to_dict()
            if k > 1 and all(n >= k for n, _ in per_task_c):
                out[f"pass@{k}"] = rate([pass_at_k(n, int(c), k) for n, c in per_task_c], binary=False).to_dict()
    if "em" in keys:
        out["em"] = unit_rate(groups, lambda e: _binary(e, "em"), binary=True).to_dict()
    if "f1" in keys:
        out["f1"] = unit_rate(groups, lambda e: _score(e, "f1"), binary=False).to_dict()
    if "bfcl_valid" in keys:
        out["bfcl_accuracy"] = unit_rate(groups, lambda e: _binary(e, "bfcl_valid"), binary=True).to_dict()
    return out


def behaviour_metrics(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Turns, tool calls, errors, latency and truncation: what the agent did, not how well."""
    if not episodes:
        return {}
    groups = units(episodes)
    gen = [sum(t.latency_ms.get("generate", 0.0) for t in e.turns) for e in episodes]
    tool = [sum(t.latency_ms.get("tool", 0.0) for t in e.turns) for e in episodes]
    return {
        "episodes": len(episodes),
        "turns_per_episode": unit_mean(groups, lambda e: len(e.turns)).to_dict(),
        "tool_calls_per_episode": unit_mean(groups, lambda e: sum(len(t.tool_calls) for t in e.turns)).to_dict(),
        "parse_errors_per_episode": unit_mean(groups, lambda e: sum(t.parse_error is not None for t in e.turns)).to_dict(),
        "truncated_rate": unit_rate(groups, lambda e: float(e.truncated), binary=True).to_dict(),
        "answered_rate": unit_rate(groups, lambda e: float(e.final_answer is not None), binary=True).to_dict(),
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
