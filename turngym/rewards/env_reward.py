"""The env's own per-step rewards as per-turn rewards (``env``).

``Turn.reward`` is what ``env.step`` returned: the env's per-step reward (Digits-v0's digit share, the
exact-oracle MDPs' process rewards) plus, on the step that ends an episode, the task's score. This
reward hands exactly those to the estimator, so a run can train on the env's dense signal without a
learned or judged reward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from turngym.episode import Episode
from turngym.rewards.base import GroupReward, GroupScores, finite


@dataclass
class EnvReward(GroupReward):
    """Per turn, the reward ``env.step`` returned for it."""

    name: str = "env"
    estimator: ClassVar[str] = "turn_loo"  # per-turn rewards: the unbiased turn-level estimator

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if not episodes:
            raise ValueError("score_group needs at least one episode")
        return GroupScores([[finite(t.reward) for t in e.turns] for e in episodes])
