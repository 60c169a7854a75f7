"""Outcome-level rewards on the final turn: gold ``outcome``, and the verifier-free TTRL and EMPO."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from turngym.episode import Episode, EpisodeGroup
from turngym.rewards.base import GroupReward, GroupScores, final_turn_rewards, outcome_score
from turngym.rewards.equivalence import Clustering, StringMatch, cluster_answers, make_equivalence


@dataclass
class OutcomeReward(GroupReward):
    """The env's gold verdict (math ``correct``, QA ``em`` or ``f1``, BFCL ``bfcl_valid``) on the last turn.

    A refused or timed-out answer is graded wrong by the env, so it scores 0 like any wrong answer. An
    ungraded episode (the grader itself failed) scores 0 here too, never the group's mean: the trainer
    leaves it out of its group's statistics and gives it advantage 0 (``diagnostics["ungraded"]`` counts it).
    """

    estimator: ClassVar[str] = "grpo"  # the paired estimator (an episode-level reward: TRL's GRPO)
    scores_single_episodes: ClassVar[bool] = True

    metric: str | None = None
    name: str = "outcome"

    def score_episode(self, episode: Episode) -> list[float]:
        return final_turn_rewards(episode, outcome_score(episode, self.metric))

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if not episodes:
            raise ValueError("score_group needs at least one episode")
        raw = [outcome_score(e, self.metric) for e in episodes]  # NaN: ungraded, rewarded 0
        return GroupScores([final_turn_rewards(e, v) for e, v in zip(episodes, raw, strict=True)],
                           {"outcome": raw, "ungraded": sum(not math.isfinite(v) for v in raw)})


def cluster_group(episodes: Sequence[Episode], equivalence: Any) -> Clustering:
    group = EpisodeGroup.of(episodes)
    backend = make_equivalence(equivalence, group.episodes)
    return cluster_answers(group.question, [e.final_answer for e in group], backend)


VOTE_ON = ("strings", "equivalence")


@dataclass
class TTRLReward(GroupReward):
    """1 on the final turn if the answer agrees with the majority label, else 0.

    ``vote_on="strings"`` (TTRL's code, ``ttt_metrics.py``): the label is the most common extracted answer
    string (``Counter.most_common``: ties go to the string seen first) and a rollout gets 1 when its answer is
    equivalent to the label under ``equivalence`` (TTRL verifies each rollout against the label).
    ``vote_on="equivalence"``: equivalent answers are merged into clusters first and the largest cluster
    (ties: the earliest) wins; its members get 1.

    ``n_votes``: the vote pool per query (TTRL: 64 votes, 32 trained rollouts). In training the
    trainer plays ``n_votes`` rollouts, all of them vote, and the first ``num_generations`` are
    trained; ``score_group(group, vote_pool=extra)`` does the same on saved rollouts. ``None``:
    the scored group is the whole pool. Unanswered rollouts do not vote.
    """

    estimator: ClassVar[str] = "grpo"  # the paired estimator (TTRL trains with GRPO on the voted reward)
    official_estimator: ClassVar[str | None] = "grpo"

    equivalence: Any = "auto"
    n_votes: int | None = None
    vote_on: str = "strings"
    name: str = "ttrl"

    def __post_init__(self) -> None:
        if self.n_votes is not None and self.n_votes < 1:
            raise ValueError(f"n_votes must be >= 1, got {self.n_votes}")
        if self.vote_on not in VOTE_ON:
            raise ValueError(f"vote_on must be one of {VOTE_ON}, got {self.vote_on!r}")

    def vote_pool(self) -> int | None:
        return self.n_votes

    def score_group(self, episodes: Sequence[Episode], vote_pool: Sequence[Episode] | None = None) -> GroupScores:
        voters = [*episodes, *(vote_pool or [])]
        if self.vote_on == "equivalence":
            cl = cluster_group(voters, self.equivalence)
            majority = max(range(len(cl.members)), key=lambda c: len(cl.members[c])) if cl.members else None
            # cl.labels covers every voter; the scored episodes are its first len(episodes) entries
            rewards = [final_turn_rewards(e, float(lab is not None and lab == majority))
                       for e, lab in zip(episodes, cl.labels[:len(episodes)], strict=True)]
            return GroupScores(rewards, {"clusters": cl.to_dict(), "majority": majority, "votes": len(voters)})
        strings = [str(e.final_answer).strip() for e in voters if e.final_answer is not None and str(e.final_answer).strip()]
        label = Counter(strings).most_common(1)[0][0] if strings else None
        wins = [False] * len(episodes)
        if label is not None:
            group = EpisodeGroup.of(voters)
            backend = make_equivalence(self.equivalence, group.episodes)
            verdicts: dict[str, bool] = {}  # the rollout's answer verified against the label, once per string
            for i, e in enumerate(episodes):
                text = "" if e.final_answer is None else str(e.final_answer).strip()
                if text and text not in verdicts:
                    verdicts[text] = bool(backend.matrix(group.question, [label, text])[1][0])
                wins[i] = bool(text) and verdicts[text]
        rewards = [final_turn_rewards(e, float(w)) for e, w in zip(episodes, wins, strict=True)]
        return GroupScores(rewards, {"label": label, "votes": len(voters), "answered_votes": len(strings)})


@dataclass
class EMPOReward(GroupReward):
    """EMPO: the rollout's semantic-cluster probability on the final turn, gated by semantic entropy.

    As in EMPO's code: the K answers are clustered (an unanswered rollout is a cluster of its own
    and gets 0); ``cluster_on="strings"`` (EMPO's math recipe: math-verify's ``verify`` on the extracted
    strings, which compares two strings as strings) or ``"equivalence"`` (``equivalence`` merges
    equivalent answers, e.g. math-verify on parsed expressions); p(c) = |c| / K; H = -Σ p log p; if H is
    not below ``entropy_threshold`` the
    whole group gets 0 (too unreliable to learn from). ``entropy_threshold``: ``"log_k"``
    (default, log K: only a group of all-different answers is zeroed), a number, or ``None`` (no
    gate). ``share_of``: ``"all"`` (p over all K, default) or ``"answered"`` (over answered rollouts).
    """

    estimator: ClassVar[str] = "grpo"  # the paired estimator (EMPO: GRPO on the cluster probability)
    official_estimator: ClassVar[str | None] = "grpo"

    equivalence: Any = "auto"
    entropy_threshold: float | str | None = "log_k"
    share_of: str = "all"
    cluster_on: str = "strings"
    name: str = "empo"

    def __post_init__(self) -> None:
        if self.cluster_on not in VOTE_ON:
            raise ValueError(f"cluster_on must be one of {VOTE_ON}, got {self.cluster_on!r}")
        if self.share_of not in ("all", "answered"):
            raise ValueError(f"share_of must be 'all' or 'answered', got {self.share_of!r}")
        if isinstance(self.entropy_threshold, str) and self.entropy_threshold != "log_k":
            raise ValueError(f"entropy_threshold must be 'log_k', a number or None, got {self.entropy_threshold!r}")

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        cl = cluster_group(episodes, StringMatch() if self.cluster_on == "strings" else self.equivalence)
        k = len(episodes)
        sizes = [len(m) for m in cl.members] + [1] * (k - cl.n_answered)  # unanswered: singleton clusters
        entropy = -sum(n / k * math.log(n / k) for n in sizes)
        threshold = math.log(k) if self.entropy_threshold == "log_k" else self.entropy_threshold
        gated = threshold is not None and not entropy < threshold
        denom = k if self.share_of == "all" else max(1, cl.n_answered)
        share = [len(m) / denom for m in cl.members]
        rewards = [final_turn_rewards(e, 0.0 if gated or lab is None else share[lab])
                   for e, lab in zip(episodes, cl.labels, strict=True)]
        return GroupScores(rewards, {"clusters": cl.to_dict(), "m": share, "semantic_entropy": entropy,
                                     "entropy_threshold": threshold, "gated": gated})
