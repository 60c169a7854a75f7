"""Branching: continuations of recorded episodes from the state after each of their turns, and the
Monte-Carlo turn values they give (the MC credit oracle, the ``vine`` estimator).

For a recorded episode with turns 0..T−1 and Gymnasium rewards r_t (the step that ends an episode
returns the task's score), the env is restored after its first ``a`` turns (``turngym.envs.base.restore``:
replay, the recorded token ids reused by the rollout runner) and the policy continues it N times, for
every a = 0..T. The return-to-go from turn t of a branch is G_t = Σ_{k≥t} r_k (the replayed turns'
rewards recomputed, the continuation's sampled). Then, as in VinePPO:

- V̂(s_t) = mean G_t over the branches restored after t turns (turn t is sampled afresh);
- Q̂(s_t, a_t) = mean G_t over the branches restored after t + 1 turns (turn t is the recorded one);
- Â_t = Q̂ − V̂, with standard errors √(s²/N) and √(se_Q² + se_V²).

A turn whose replay showed another observation than the record (a tool that is not deterministic) is
flagged untrusted. Cost: N·(T + 1) continuations per episode (the last prefix only replays).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from turngym.agents.runner import RolloutTask
from turngym.episode import Episode


@dataclass
class TurnValue:
    """The oracle's figures for one turn of one recorded episode."""

    episode_id: str
    turn: int
    v: float | None
    v_se: float | None
    q: float | None
    q_se: float | None
    advantage: float | None
    advantage_se: float | None
    n_v: int
    n_q: int
    trusted: bool  # no replay of the turns it rests on showed another observation than the record

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def sign(self) -> int | None:
        """+1 / −1 where |Â| exceeds twice its standard error, else None (the oracle cannot tell)."""
        if not self.trusted or self.advantage is None or self.advantage_se is None:
            return None
        if abs(self.advantage) <= 2.0 * self.advantage_se:
            return None
        return 1 if self.advantage > 0 else -1


def branch_tasks(episodes: Sequence[Episode], rollouts: int) -> list[RolloutTask]:
    """N continuations after each prefix 0..T of every episode."""
    return [RolloutTask(branch=ep, after=a, k=rollouts) for ep in episodes for a in range(len(ep.turns) + 1)]


def _mean_se(xs: Sequence[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    arr = np.asarray(xs, dtype=float)
    se = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else 0.0
    return float(arr.mean()), se


def turn_values(episodes: Sequence[Episode], branches: Sequence[Episode]) -> dict[str, list[TurnValue]]:
    """Per recorded episode, V̂, Q̂ and Â of each turn from its branches (``meta["branch"]``)."""
    by: dict[tuple[str, int], list[Episode]] = {}
    for b in branches:
        info = b.meta.get("branch") or {}
        by.setdefault((info.get("of"), int(info.get("after", -1))), []).append(b)
    out: dict[str, list[TurnValue]] = {}
    for ep in episodes:
        rows = []
        for t in range(len(ep.turns)):
            v_set, q_set = by.get((ep.id, t), []), by.get((ep.id, t + 1), [])
            v, v_se = _mean_se([sum(x.reward for x in b.turns[t:]) for b in v_set])
            q, q_se = _mean_se([sum(x.reward for x in b.turns[t:]) for b in q_set])
            trusted = not any(b.meta["branch"]["replay_differs"] for b in (*v_set, *q_set))
            adv = None if v is None or q is None else q - v
            adv_se = None if v_se is None or q_se is None else math.sqrt(v_se ** 2 + q_se ** 2)
            rows.append(TurnValue(ep.id, t, v, v_se, q, q_se, adv, adv_se, len(v_set), len(q_set), trusted))
        out[ep.id] = rows
    return out


