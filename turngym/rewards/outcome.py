"""Outcome-level rewards on the final turn: gold ``outcome``, and the verifier-free TTRL and EMPO."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from turngym.episode import Episode, EpisodeGroup, group_needs
from turngym.rewards.base import GroupReward, GroupScores, final_turn_rewards, outcome_score
from turngym.rewards.equivalence import (
    AUTO_HINT,
    Clustering,
    MathEquivalence,
    PRM800KMatch,
    StringMatch,
    cluster_answers,
    make_equivalence,
)


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
NORMALISE = ("official", "none")
UNANSWERED = ("vote", "abstain")
MATH_BACKENDS = ("math", "prm800k")


def _is_math(episodes: Sequence[Episode], equivalence: Any) -> bool:
    """The answers are math: as the episodes' env declares; for episodes that predate the declaration, as an
    explicit ``equivalence`` says (``auto``/``official`` on such episodes: the declaration's message)."""
    if any(e.reward_needs is None for e in episodes) and not (isinstance(equivalence, str) and equivalence in (
            "auto", "official")):
        return equivalence in MATH_BACKENDS or isinstance(equivalence, (MathEquivalence, PRM800KMatch))
    return group_needs(EpisodeGroup.of(episodes).episodes, AUTO_HINT).answer_kind == "math"


def _raw_key(answer: str | None) -> str:
    return "" if answer is None else str(answer).strip()


@dataclass
class TTRLReward(GroupReward):
    """1 on the final turn if the rollout's answer checks equal to the majority label, else 0.

    Defaults are TTRL's code (``PRIME-RL/TTRL``, ``ttt_metrics.py`` lines 18-27): every voter's answer is
    reduced to a key (``normalise="official"``: for math answers the string TTRL's ``extract_answer`` returns,
    :func:`turngym.grading.official_math.ttrl_answer`; other answers stripped), the label is the most common
    key (``Counter.most_common``: ties go to the key seen first), and each rollout's key is checked against it
    (``equivalence="official"``: TTRL's grader, ``prm800k``, for math; ``auto`` otherwise).
    ``unanswered="vote"`` (official): a rollout without an answer votes ``""``, and when ``""`` wins every
    unanswered rollout gets 1; ``"abstain"``: unanswered rollouts do not vote and get 0.
    ``normalise="none"``: the stripped answer strings. ``vote_on="equivalence"``: the raw answers are merged
    into clusters by ``equivalence`` first and the largest cluster (ties: the earliest) wins; its members get 1.

    ``n_votes``: the vote pool per query (TTRL: 64 votes, 32 trained rollouts). In training the
    trainer plays ``n_votes`` rollouts, all of them vote, and the first ``num_generations`` are
    trained; ``score_group(group, vote_pool=extra)`` does the same on saved rollouts. ``None``:
    the scored group is the whole pool.
    """

    estimator: ClassVar[str] = "grpo"  # the paired estimator (TTRL trains with GRPO on the voted reward)
    official_estimator: ClassVar[str | None] = "grpo"

    equivalence: Any = "official"
    n_votes: int | None = None
    vote_on: str = "strings"
    normalise: str = "official"
    unanswered: str = "vote"
    name: str = "ttrl"

    def __post_init__(self) -> None:
        if self.n_votes is not None and self.n_votes < 1:
            raise ValueError(f"n_votes must be >= 1, got {self.n_votes}")
        for field_name, allowed in (("vote_on", VOTE_ON), ("normalise", NORMALISE), ("unanswered", UNANSWERED)):
            if getattr(self, field_name) not in allowed:
                raise ValueError(f"{field_name} must be one of {allowed}, got {getattr(self, field_name)!r}")

    def vote_pool(self) -> int | None:
        return self.n_votes

    def _backend(self, voters: Sequence[Episode]) -> Any:
        if self.equivalence == "official":
            return make_equivalence("prm800k" if _is_math(voters, self.equivalence) else "auto", voters)
        return make_equivalence(self.equivalence, voters)

    def keys(self, voters: Sequence[Episode]) -> list[str]:
        """What each voter votes with; ``""``: no answer."""
        if self.normalise == "official" and _is_math(voters, self.equivalence):
            from turngym.grading.official_math import ttrl_answer

            return [ttrl_answer(e.final_answer) for e in voters]
        return [_raw_key(e.final_answer) for e in voters]

    def score_group(self, episodes: Sequence[Episode], vote_pool: Sequence[Episode] | None = None) -> GroupScores:
        voters = [*episodes, *(vote_pool or [])]
        backend = self._backend(voters)
        if self.vote_on == "equivalence":
            return self._score_clusters(episodes, voters, backend)
        keys = self.keys(voters)
        counted = keys if self.unanswered == "vote" else [k for k in keys if k]
        label = Counter(counted).most_common(1)[0][0] if counted else None
        question = EpisodeGroup.of(voters).question
        verdicts: dict[str, bool] = {}  # each distinct key checked against the label once
        for k in keys[:len(episodes)]:
            if label is not None and k not in verdicts:
                verdicts[k] = k == label or self._check(backend, question, k, label)
        wins = [label is not None and verdicts[k] and (bool(k) or self.unanswered == "vote") for k in keys[:len(episodes)]]
        rewards = [final_turn_rewards(e, float(w)) for e, w in zip(episodes, wins, strict=True)]
        return GroupScores(rewards, {"label": label, "votes": len(counted), "answered_votes": sum(map(bool, keys)),
                                     "keys": keys[:len(episodes)], "no_verdict": getattr(backend, "no_verdict", 0)})

    @staticmethod
    def _check(backend: Any, question: str, key: str, label: str) -> bool:
        """The rollout's key checked against the label: TTRL's grader one way (an empty key too, as TTRL
        grades it), any other backend through its matrix (an empty key never matches a label)."""
        if isinstance(backend, PRM800KMatch):
            return backend.check(key, label)
        return bool(key) and bool(label) and bool(backend.matrix(question, [label, key])[1][0])

    def _score_clusters(self, episodes: Sequence[Episode], voters: Sequence[Episode], backend: Any) -> GroupScores:
        cl = cluster_group(voters, backend)
        # (size, -first member) per cluster; unanswered voters form one more when they vote
        sizes = [(len(m), -m[0]) for m in cl.members]
        silent = [i for i, lab in enumerate(cl.labels) if lab is None]
        if self.unanswered == "vote" and silent:
            sizes.append((len(silent), -silent[0]))
        majority = max(range(len(sizes)), key=lambda c: sizes[c]) if sizes else None
        unanswered_won = majority is not None and majority == len(cl.members)
        # cl.labels covers every voter; the scored episodes are its first len(episodes) entries
        wins = [(lab is None and unanswered_won) or (lab is not None and lab == majority)
                for lab in cl.labels[:len(episodes)]]
        rewards = [final_turn_rewards(e, float(w)) for e, w in zip(episodes, wins, strict=True)]
        return GroupScores(rewards, {"clusters": cl.to_dict(), "majority": None if unanswered_won else majority,
                                     "unanswered_won": unanswered_won, "votes": len(voters)})


@dataclass
class EMPOReward(GroupReward):
    """EMPO: the rollout's semantic-cluster probability on the final turn, gated by semantic entropy.

    As in EMPO's code (``QingyangZhang/EMPO``, ``trl/src/open_r1/rewards.py`` lines 150-215): the K answers
    are reduced to keys (``normalise="official"``: for math answers the string math-verify extracts with
    EMPO's settings, :func:`turngym.grading.official_math.empo_answer`, ``""`` when it extracts nothing;
    other answers stripped; ``"none"``: the stripped strings), equal keys form a cluster
    (``cluster_on="strings"``) and an unanswered rollout is a cluster of its own that gets 0;
    ``cluster_on="equivalence"``: the raw answers are clustered by ``equivalence`` instead (e.g.
    math-verify on parsed expressions). p(c) = |c| / K; H = -Σ p log p; if H is not below
    ``entropy_threshold`` the whole group gets 0 (too unreliable to learn from). ``entropy_threshold``:
    ``"log_k"`` (default, log K: only a group of all-different answers is zeroed), a number, or ``None`` (no
    gate). ``share_of``: ``"all"`` (p over all K, default) or ``"answered"`` (over answered rollouts).
    """

    estimator: ClassVar[str] = "grpo"  # the paired estimator (EMPO: GRPO on the cluster probability)
    official_estimator: ClassVar[str | None] = "grpo"

    equivalence: Any = "auto"
    entropy_threshold: float | str | None = "log_k"
    share_of: str = "all"
    cluster_on: str = "strings"
    normalise: str = "official"
    name: str = "empo"

    def __post_init__(self) -> None:
        if self.cluster_on not in VOTE_ON:
            raise ValueError(f"cluster_on must be one of {VOTE_ON}, got {self.cluster_on!r}")
        if self.normalise not in NORMALISE:
            raise ValueError(f"normalise must be one of {NORMALISE}, got {self.normalise!r}")
        if self.share_of not in ("all", "answered"):
            raise ValueError(f"share_of must be 'all' or 'answered', got {self.share_of!r}")
        if isinstance(self.entropy_threshold, str) and self.entropy_threshold != "log_k":
            raise ValueError(f"entropy_threshold must be 'log_k', a number or None, got {self.entropy_threshold!r}")

    def keys(self, episodes: Sequence[Episode]) -> tuple[list[str], int]:
        """What each rollout is clustered by (``""``: no answer) and how many keys could not be computed."""
        if self.normalise == "official" and _is_math(episodes, self.equivalence):
            from turngym.grading.official_math import empo_answer

            found = [empo_answer(e.final_answer) for e in episodes]
            return [k or "" for k in found], sum(k is None for k in found)
        return [_raw_key(e.final_answer) for e in episodes], 0

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if self.cluster_on == "strings":
            keys, no_key = self.keys(episodes)
            cl = cluster_answers(EpisodeGroup.of(episodes).question, keys, StringMatch())
        else:
            keys, no_key = [], 0
            cl = cluster_group(episodes, self.equivalence)
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
                                     "entropy_threshold": threshold, "gated": gated, "keys": keys, "no_key": no_key})
