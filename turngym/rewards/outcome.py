"""Outcome-level rewards on the final turn: gold ``outcome``, and the verifier-free TTRL and EMPO."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from turngym.episode import Episode
from turngym.rewards.base import GroupScores, check_group, final_turn_rewards, outcome_score, register_reward
from turngym.rewards.equivalence import Clustering, cluster_answers, make_equivalence


@register_reward("outcome")
@dataclass
class OutcomeReward:
    """The env's gold verdict (math ``correct``, QA ``em`` or ``f1``, BFCL ``bfcl_valid``) on the last turn."""

    metric: str | None = None
    name: str = "outcome"

    def score_episode(self, episode: Episode) -> list[float]:
        return final_turn_rewards(episode, outcome_score(episode, self.metric))

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if not episodes:
            raise ValueError("score_group needs at least one episode")
        return GroupScores([self.score_episode(e) for e in episodes],
                           {"outcome": [outcome_score(e, self.metric) for e in episodes]})


def cluster_group(episodes: Sequence[Episode], equivalence: Any) -> Clustering:
    check_group(episodes)
    backend = make_equivalence(equivalence, episodes[0].env_id)
    return cluster_answers(str(episodes[0].task.get("question", "")), [e.final_answer for e in episodes], backend)


@register_reward("ttrl")
@dataclass
class TTRLReward:
    """1 on the final turn if the answer is in the majority cluster (ties: the earliest), else 0."""

    equivalence: Any = "auto"
    name: str = "ttrl"

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        cl = cluster_group(episodes, self.equivalence)
        majority = max(range(len(cl.members)), key=lambda c: len(cl.members[c])) if cl.members else None
        rewards = [final_turn_rewards(e, float(lab is not None and lab == majority))
                   for e, lab in zip(episodes, cl.labels)]
        return GroupScores(rewards, {"clusters": cl.to_dict(), "majority": majority})


@register_reward("empo")
@dataclass
class EMPOReward:
    """The rollout's cluster share m(c) on the final turn (semantic-entropy minimisation); unanswered 0."""

    equivalence: Any = "auto"
    name: str = "empo"

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        cl = cluster_group(episodes, self.equivalence)
        rewards = [final_turn_rewards(e, cl.share(lab) if lab is not None else 0.0)
                   for e, lab in zip(episodes, cl.labels)]
        return GroupScores(rewards, {"clusters": cl.to_dict(), "m": [cl.share(c) for c in range(len(cl.members))]})
