"""Credit accuracy: how well the credit a turn's tokens receive separates useful turns from useless ones.

A wrapper's per-turn rewards become per-turn advantages through the estimator it is paired
with in training (declared by the reward: its ``estimator``): episode-level rewards (outcome, TTRL, EMPO)
go through GRPO, which broadcasts the episode's z-scored total to every turn;
turn-level rewards (SIOP, SCRIBE, funrl) through the ``turn`` estimator (group z-score, then a
discounted backward sum); IGPO through ``igpo_separate`` (outcome and process rewards
z-scored apart, as the IGPO paper does). Credit accuracy is then measured against a per-turn
truth (1 useful, 0 not) as the AUC of label 1 vs label 0 and as Spearman's ρ, each with a
group-level bootstrap interval (groups are resampled whole: turns of a group share a
normalisation and are not independent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from turngym.episode import Episode
from turngym.training.advantages import get_estimator

TURN_TRUTH_KEYS = ("retrieval_hit", "feeds_answer", "tool_ok", "bfcl_turn_valid")


def turn_truth(ep: Episode) -> list[float | None]:
    """Each turn's recorded usefulness (1 / 0) from the env's metrics, None where the env records none."""
    out: list[float | None] = []
    for t in ep.turns:
        key = next((k for k in TURN_TRUTH_KEYS if k in t.metrics), None)
        out.append(float(bool(t.metrics[key])) if key else None)
    return out


def group_advantages(estimator: str, group_rewards: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per-turn advantages of one group under ``estimator`` (a wrapper's is its ``estimator`` attribute)."""
    return get_estimator(estimator)(group_rewards)


def auc(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    """P(score of a label-1 turn > score of a label-0 turn), ties counting half (Mann-Whitney)."""
    from scipy.stats import rankdata

    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=int)
    n1, n0 = int((y == 1).sum()), int((y == 0).sum())
    if n1 == 0 or n0 == 0:
        return None
    ranks = rankdata(s)
    return float((ranks[y == 1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    rho = spearmanr(a, b).statistic
    return None if rho is None or not np.isfinite(rho) else float(rho)


@dataclass
class CreditScore:
    auc: float | None
    auc_ci95: tuple[float, float] | None
    spearman: float | None
    spearman_ci95: tuple[float, float] | None
    n_turns: int
    n_positive: int
    n_groups: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def credit_score(groups: Sequence[Sequence[tuple[float, int]]], n_boot: int = 1000, seed: int = 0) -> CreditScore:
    """``groups``: per group, the (credit, label) pairs of its labelled turns."""
    flat = [p for g in groups for p in g]
    xs, ys = [p[0] for p in flat], [p[1] for p in flat]
    point_auc, point_rho = auc(xs, ys), spearman(xs, ys)
    auc_ci = rho_ci = None
    nonempty = [g for g in groups if g]
    if len(nonempty) > 1 and (point_auc is not None or point_rho is not None):
        rng = np.random.default_rng(seed)
        aucs, rhos = [], []
        for _ in range(n_boot):
            pick = [nonempty[i] for i in rng.integers(0, len(nonempty), len(nonempty))]
            bx = [p[0] for g in pick for p in g]
            by = [p[1] for g in pick for p in g]
            if (a := auc(bx, by)) is not None:
                aucs.append(a)
            if (r := spearman(bx, by)) is not None:
                rhos.append(r)
        auc_ci = _interval(aucs) if point_auc is not None else None
        rho_ci = _interval(rhos) if point_rho is not None else None
    return CreditScore(point_auc, auc_ci, point_rho, rho_ci, len(flat), int(sum(ys)), len(nonempty))


def _interval(values: Sequence[float]) -> tuple[float, float] | None:
    if len(values) < 10:
        return None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def labelled_pairs(values: Sequence[Sequence[float]], labels: Sequence[Sequence[int | None]],
                   lag: int = 0) -> list[tuple[float, int]]:
    """(value of turn t + lag, label of turn t) over labelled turns; ``lag=1`` asks whether the credit
    for a turn lands on the turn after it (e.g. a support score taken before the observation)."""
    out = []
    for vals, labs in zip(values, labels, strict=True):
        for t, lab in enumerate(labs):
            if lab is not None and t + lag < len(vals):
                out.append((float(vals[t + lag]), int(lab)))
    return out


def varies(values: Sequence[Sequence[float]]) -> bool:
    flat = [x for v in values for x in v]
    return len(flat) > 1 and float(np.ptp(flat)) > 1e-12
