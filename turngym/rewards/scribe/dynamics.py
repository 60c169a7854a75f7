"""Training-dynamics measures for SCRIBE: mid-level uncertainty and plan separability.

SCRIBE's paper reports that uncertainty about mid-level skills falls before high-level
planning improves. Two measures make that checkable on a run, computed over the groups a
reward scored since the trainer last asked (one training step):

* **Step-completion uncertainty** of prototype ``p``: inside each group, the judged scores
  (0-3) of the steps routed to ``p`` form a distribution ``q``; its entropy
  ``H(q) / log 4`` (in [0, 1]: 0 = every such step judged alike, 1 = scores spread evenly
  over the scale) is taken for every group with at least two such steps and averaged over
  groups. Logged per prototype (``scribe/uncertainty/<id>``) and averaged over all
  (group, prototype) cells (``scribe/uncertainty_mean``).
* **Plan separability**: an episode's *plan* is the share of its steps in each skill
  family (a skill counts for its family; unmatched steps have their own slot). With the
  batch's successful (outcome >= 0.5) and failed episodes, each episode gets the score
  ``cos(x, mean of the other successes) - cos(x, mean of the other failures)``
  (leave-one-out), and separability is the ROC AUC of that score for success (0.5 = plans
  say nothing about success, 1 = they separate it fully). Needs at least two successes and
  two failures, else not logged.

Also logged: ``scribe/step_score_mean`` (judged score / 3) and ``scribe/unmatched_rate``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from turngym.rewards.scribe.scoring import StepRecord

UNMATCHED = "<unmatched>"


def normalised_entropy(scores: Sequence[int], levels: int = 4) -> float:
    counts = Counter(scores)
    n = len(scores)
    h = -sum(c / n * math.log(c / n) for c in counts.values())
    return h / math.log(levels)


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """ROC AUC (Mann-Whitney, ties count half); None without both classes."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def plan_vector(steps: Sequence[StepRecord], family_of: dict[str, str], families: Sequence[str]) -> np.ndarray:
    slots = {f: i for i, f in enumerate(list(families) + [UNMATCHED])}
    v = np.zeros(len(slots))
    for s in steps:
        fam = family_of.get(s.prototype, UNMATCHED) if s.prototype else UNMATCHED
        v[slots[fam]] += 1
    return v / v.sum() if v.sum() else v


def plan_separability(plans: np.ndarray, success: Sequence[bool]) -> float | None:
    ys = np.asarray(success, dtype=bool)
    if ys.sum() < 2 or (~ys).sum() < 2:
        return None

    def cos(a: np.ndarray, b: np.ndarray) -> float:
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        return float(a @ b / (na * nb)) if na and nb else 0.0

    scores = []
    for i in range(len(plans)):
        others = np.arange(len(plans)) != i
        mu_s = plans[others & ys].mean(axis=0)
        mu_f = plans[others & ~ys].mean(axis=0)
        scores.append(cos(plans[i], mu_s) - cos(plans[i], mu_f))
    return auc(scores, list(ys))


@dataclass
class DynamicsRecorder:
    """Collects the steps of scored groups; :meth:`metrics` summarises and starts afresh. Without a
    trainer draining it (offline scoring), only the last ``max_groups`` groups are kept."""

    groups: list[list[list[StepRecord]]] = field(default_factory=list)
    outcomes: list[list[float]] = field(default_factory=list)
    family_of: dict[str, str] = field(default_factory=dict)   # prototype id -> family id
    max_groups: int = 4096

    def add_group(self, steps_per_episode: Sequence[Sequence[StepRecord]], outcomes: Sequence[float],
                  family_of: dict[str, str]) -> None:
        self.groups.append([list(s) for s in steps_per_episode])
        self.outcomes.append([float(o) for o in outcomes])
        self.family_of.update(family_of)
        if len(self.groups) > self.max_groups:
            del self.groups[0], self.outcomes[0]

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        per_proto: dict[str, list[float]] = defaultdict(list)
        for group in self.groups:
            scores: dict[str, list[int]] = defaultdict(list)
            for steps in group:
                for s in steps:
                    if s.status == "judged" and s.prototype is not None and s.score is not None:
                        scores[s.prototype].append(s.score)
            for pid, sc in scores.items():
                if len(sc) >= 2:
                    per_proto[pid].append(normalised_entropy(sc))
        for pid, hs in sorted(per_proto.items()):
            out[f"scribe/uncertainty/{pid}"] = float(np.mean(hs))
        cells = [h for hs in per_proto.values() for h in hs]
        if cells:
            out["scribe/uncertainty_mean"] = float(np.mean(cells))
        flat = [s for g in self.groups for steps in g for s in steps]
        judged = [s.score / 3.0 for s in flat if s.status == "judged" and s.score is not None]
        if judged:
            out["scribe/step_score_mean"] = float(np.mean(judged))
        if flat:
            out["scribe/unmatched_rate"] = sum(s.status == "unmatched" for s in flat) / len(flat)
        families = sorted(set(self.family_of.values()))
        episodes = [steps for g in self.groups for steps in g]
        success = [o >= 0.5 for os_ in self.outcomes for o in os_]
        if episodes:
            plans = np.stack([plan_vector(steps, self.family_of, families) for steps in episodes])
            sep = plan_separability(plans, success)
            if sep is not None:
                out["scribe/plan_separability"] = sep
        self.groups, self.outcomes = [], []
        return out
