"""Credit accuracy: how well the credit a turn's tokens receive separates useful turns from useless ones.

A reward's per-turn rewards become per-turn advantages through the estimator it is paired
with in training (declared by the reward: its ``estimator``): episode-level rewards (outcome, TTRL, EMPO)
go through GRPO, which broadcasts the episode's z-scored total to every turn;
turn-level rewards (SIOP, SCRIBE, funrl) through the ``turn`` estimator (group z-score, then a
discounted backward sum); IGPO through ``igpo_separate`` (outcome and process rewards
z-scored apart, as the IGPO paper does). Credit accuracy is then measured against a per-turn
truth (1 useful, 0 not; read from ``Turn.truth`` only, see :mod:`turngym.truth`) as the pooled
AUC of label 1 vs label 0, the within-episode AUC (pairs of turns of one episode only: what
an episode-level credit cannot separate, it scores exactly 0.5) and Spearman's ρ, each with a
group-level bootstrap interval (groups are resampled whole: turns of a group share a
normalisation and are not independent). :mod:`turngym.credit.table` puts them in tables
beside label-free baselines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from turngym.episode import Episode, turn_labels
from turngym.training.advantages import get_estimator
from turngym.truth import TruthMap


def turn_truth(ep: Episode, key: str | None = None, mapping: TruthMap | None = None) -> list[int | None]:
    """Each turn's label (1 / 0, None where unlabelled) from the turn's truth namespace only
    (:func:`turngym.episode.turn_labels`): never from metrics, never cast with ``bool()``."""
    return turn_labels(ep, key, mapping)


def group_advantages(estimator: str, group_rewards: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per-turn advantages of one group under ``estimator`` (a reward's is its ``estimator`` attribute)."""
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


Pairs = Sequence[tuple[float, int]]


@dataclass
class CreditScore:
    """Pooled AUC (any useful turn vs any useless one), within-episode AUC (pairs inside one episode only:
    an episode-level credit scores exactly 0.5) and Spearman ρ, with group-bootstrap intervals."""

    auc: float | None
    auc_ci95: tuple[float, float] | None
    spearman: float | None
    spearman_ci95: tuple[float, float] | None
    n_turns: int
    n_positive: int
    n_groups: int
    within_auc: float | None = None
    within_auc_ci95: tuple[float, float] | None = None
    n_within_pairs: int = 0  # (useful, useless) turn pairs inside one episode

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def within_counts(episode: Pairs) -> tuple[float, int]:
    """(wins, pairs) over (useful, useless) turn pairs of one episode: a win is the useful turn scoring
    higher, a tie counts half."""
    s = np.asarray([p[0] for p in episode], dtype=float)
    y = np.asarray([p[1] for p in episode], dtype=int)
    pos, neg = s[y == 1], s[y == 0]
    if not len(pos) or not len(neg):
        return 0.0, 0
    diff = pos[:, None] - neg[None, :]
    return float((diff > 0).sum() + 0.5 * (diff == 0).sum()), int(diff.size)


def within_auc(episodes: Sequence[Pairs]) -> float | None:
    """P(useful turn > useless turn of the same episode), ties half, over all such pairs; None without any."""
    wins, pairs = 0.0, 0
    for ep in episodes:
        w, n = within_counts(ep)
        wins, pairs = wins + w, pairs + n
    return wins / pairs if pairs else None


def credit_score(groups: Sequence[Sequence[Pairs]], n_boot: int = 1000, seed: int = 0) -> CreditScore:
    """``groups``: per group, per episode, the (credit, label) pairs of its labelled turns
    (:func:`episode_pairs`). Groups are resampled whole for the intervals."""
    flat = [p for g in groups for ep in g for p in ep]
    xs, ys = [p[0] for p in flat], [p[1] for p in flat]
    point_auc, point_rho = auc(xs, ys), spearman(xs, ys)
    # within-episode AUC pools (wins, pairs) counts, not per-episode AUCs: an episode with one labelled pair must
    # weigh one pair, not as much as an episode with twenty
    counts = [[within_counts(ep) for ep in g] for g in groups]
    g_wins = [sum(c[0] for c in g) for g in counts]
    g_pairs = [sum(c[1] for c in g) for g in counts]
    n_within = sum(g_pairs)
    point_within = sum(g_wins) / n_within if n_within else None
    auc_ci = rho_ci = within_ci = None
    # the group is the unit of resampling: its K episodes share a query (and, for group-normalised credit, a baseline),
    # so turns are not independent and a per-turn bootstrap would give intervals that are too narrow
    nonempty = [i for i, g in enumerate(groups) if any(g)]
    if len(nonempty) > 1 and (point_auc is not None or point_rho is not None or point_within is not None):
        rng = np.random.default_rng(seed)
        per_group = [([p[0] for ep in groups[i] for p in ep], [p[1] for ep in groups[i] for p in ep]) for i in nonempty]
        aucs, rhos, withins = [], [], []
        for _ in range(n_boot):
            pick = rng.integers(0, len(nonempty), len(nonempty))
            bx = [x for i in pick for x in per_group[i][0]]
            by = [y for i in pick for y in per_group[i][1]]
            # a resample with one label class has no AUC: it is left out (not counted as 0.5), so the interval
            # describes the resamples where the statistic exists
            if point_auc is not None and (a := auc(bx, by)) is not None:
                aucs.append(a)
            if point_rho is not None and (r := spearman(bx, by)) is not None:
                rhos.append(r)
            n = sum(g_pairs[nonempty[i]] for i in pick)
            if n:
                withins.append(sum(g_wins[nonempty[i]] for i in pick) / n)
        auc_ci = _interval(aucs) if point_auc is not None else None
        rho_ci = _interval(rhos) if point_rho is not None else None
        within_ci = _interval(withins) if point_within is not None else None
    return CreditScore(point_auc, auc_ci, point_rho, rho_ci, len(flat), int(sum(ys)), len(nonempty),
                       point_within, within_ci, n_within)


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


def episode_pairs(values: Sequence[Sequence[float]], labels: Sequence[Sequence[int | None]],
                  lag: int = 0) -> list[list[tuple[float, int]]]:
    """:func:`labelled_pairs` kept per episode (what :func:`credit_score` takes for one group)."""
    return [labelled_pairs([v], [lab], lag) for v, lab in zip(values, labels, strict=True)]


def varies(values: Sequence[Sequence[float]]) -> bool:
    flat = [x for v in values for x in v]
    return len(flat) > 1 and float(np.ptp(flat)) > 1e-12
