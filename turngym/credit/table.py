"""Credit tables: every reward × estimator beside label-free baselines, in one table.

A pooled AUC mixes two questions: does the credit rank useful turns above useless ones
*inside an episode* (turn-level credit), and do useless turns sit in episodes that score lower
(between-episode correlation, which any episode-level reward gets for free)? A label-free
"−(turns remaining)" already reaches a pooled AUC above many rewards on real labels. So each
table shows, per reward × estimator, the pooled AUC (the headline), the within-episode AUC and
Spearman ρ, and as rows in the same table the label-free baselines:

- ``position``: relative position t/(T−1) (0 for a one-turn episode);
- ``remaining``: −(turns remaining), −(T−1−t);
- ``outcome``: the episode's gold outcome on every turn (an ungraded outcome counts 0).

A reward whose point estimate is not above the best baseline's in a column is marked there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from turngym.credit.accuracy import credit_score, episode_pairs, group_advantages
from turngym.episode import Episode

BASELINES = {"position": "relative position t/(T−1)", "remaining": "−(turns remaining)",
             "outcome": "raw outcome broadcast"}
COMPARED = ("auc", "within_auc")  # the columns a reward must beat the best baseline in
MARK = "†"


def baseline_values(ep: Episode) -> dict[str, list[float]]:
    """Each label-free baseline's per-turn score for one episode."""
    from turngym.rewards.base import outcome_score

    n = len(ep.turns)
    out = outcome_score(ep)
    out = 0.0 if math.isnan(out) else out
    return {"position": [t / (n - 1) if n > 1 else 0.0 for t in range(n)],
            "remaining": [-float(n - 1 - t) for t in range(n)],
            "outcome": [out] * n}


def baseline_scores(groups: Sequence[Sequence[Episode]], labels: Sequence[Sequence[Sequence[int | None]]],
                    n_boot: int = 1000, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Credit scores of every label-free baseline on the same groups and labels as the rewards."""
    values = [[baseline_values(e) for e in g] for g in groups]
    return {name: credit_score([episode_pairs([v[name] for v in vg], lab) for vg, lab in zip(values, labels, strict=True)],
                               n_boot, seed).to_dict()
            for name in BASELINES}


def estimators_for(reward: Any, extra: Sequence[str] = ()) -> list[str]:
    """The reward's declared estimator first, then each of ``extra`` not already in."""
    out = [reward.estimator]
    return out + [e for e in extra if e not in out]


def parse_estimators(text: str | None) -> list[str]:
    """``--estimators a,b``: names checked against the estimator registry (one clear message for an unknown one)."""
    from turngym.training.advantages import ESTIMATORS

    names = [e.strip() for e in (text or "").split(",") if e.strip()]
    unknown = [n for n in names if n not in ESTIMATORS]
    if unknown:
        raise ValueError(f"unknown estimator(s) {unknown} in --estimators; choose from {sorted(ESTIMATORS)}")
    return names


def estimator_scores(rewards: Sequence[Sequence[Sequence[float]]], labels: Sequence[Sequence[Sequence[int | None]]],
                     estimators: Sequence[str], n_boot: int = 1000, seed: int = 0) -> dict[str, dict[str, Any]]:
    """``rewards``: per group, per episode, per-turn rewards. Per estimator: the credit score of its
    advantages, or ``{"error": ...}`` when it cannot run on rewards alone."""
    out: dict[str, dict[str, Any]] = {}
    for est in estimators:
        try:
            adv = [group_advantages(est, r) for r in rewards]
        except Exception as exc:  # noqa: BLE001 - one estimator that needs more (states, rollouts) must not sink the table
            out[est] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out[est] = credit_score([episode_pairs(a, lab) for a, lab in zip(adv, labels, strict=True)], n_boot, seed).to_dict()
    return out


def best_baseline(baselines: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """Per compared column, the best label-free baseline: ``{"name", "value"}`` (None when none scored)."""
    out: dict[str, dict[str, Any] | None] = {}
    for col in COMPARED:
        scored = [(b[col], name) for name, b in baselines.items() if b.get(col) is not None]
        out[col] = {"name": max(scored)[1], "value": max(scored)[0]} if scored else None
    return out


def mark_against(score: dict[str, Any], best: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """``score`` with ``beats_label_free``: per compared column, True when its point estimate is above the
    best baseline's, False when not, None when either is missing."""
    if "error" in score:
        return score
    beats = {col: None if score.get(col) is None or best.get(col) is None else bool(score[col] > best[col]["value"])
             for col in COMPARED}
    return {**score, "beats_label_free": beats}


def _cell(score: dict[str, Any] | None, key: str, digits: int = 3) -> str:
    if not score or score.get(key) is None:
        return "–"
    ci = score.get(f"{key}_ci95")
    text = f"{score[key]:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")
    if (score.get("beats_label_free") or {}).get(key) is False:
        text += f" {MARK}"
    return text


HEADER = ("| reward | estimator | AUC (advantage) [95% CI] | within-episode AUC [95% CI] | ρ [95% CI] "
          "| labelled turns (useful) / within-episode pairs |")


def table(rows: Sequence[tuple[str, str, dict[str, Any]]], baselines: dict[str, dict[str, Any]],
          extra_headers: Sequence[str] = (), extra: dict[tuple[str, str], Sequence[str]] | None = None,
          digits: int = 3) -> list[str]:
    """Markdown lines: one row per (reward, estimator, score), then one per label-free baseline.
    ``extra`` holds further cells per (reward, estimator), and per ``("baseline", name)``, under ``extra_headers``."""
    extra = extra or {}
    head = HEADER + "".join(f" {h} |" for h in extra_headers)
    lines = [head, "|" + " --- |" * (6 + len(extra_headers))]
    for name, est, s in rows:
        more = "".join(f" {c} |" for c in extra.get((name, est), ["–"] * len(extra_headers)))
        if "error" in s:
            lines.append(f"| {name} | {est} | failed: {s['error']} | | | |" + more)
            continue
        lines.append(f"| {name} | {est} | {_cell(s, 'auc', digits)} | {_cell(s, 'within_auc', digits)} | "
                     f"{_cell(s, 'spearman', digits)} | {s['n_turns']} ({s['n_positive']}) / {s['n_within_pairs']} |" + more)
    for name, s in baselines.items():
        lines.append(f"| *label-free: {BASELINES[name]}* | – | {_cell(s, 'auc', digits)} | {_cell(s, 'within_auc', digits)} | "
                     f"{_cell(s, 'spearman', digits)} | {s['n_turns']} ({s['n_positive']}) / {s['n_within_pairs']} |"
                     + "".join(f" {c} |" for c in extra.get(("baseline", name), [""] * len(extra_headers))))
    return lines


LEGEND = (f"{MARK}: not above the best label-free baseline in that column (point estimates). Pooled AUC compares any "
          "useful turn with any useless one; within-episode AUC only turns of one episode (an episode-level credit "
          "scores exactly 0.5 there); ρ is Spearman's over all labelled turns; intervals resample groups whole.")
