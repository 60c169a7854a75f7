"""Answer equivalence backends and the clustering of a group's final answers into outcome modes.

Backends decide whether two *answers* to the same question are the same outcome. They see
the answers (and the question), never a rollout's full prompt, so long shared prompts
cannot make different answers look alike. Clustering is greedy in rollout order: an
answer joins the first cluster whose representative (its first member) is equivalent in
both directions, else it opens a new cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from turngym.episode import Episode, RewardNeeds, group_needs
from turngym.grading.calls import canonical_calls
from turngym.grading.qa import normalize_answer


class Equivalence(Protocol):
    name: str

    def matrix(self, question: str, answers: Sequence[str]) -> list[list[bool]]:
        """``m[i][j]``: answer i implies answer j (need not be symmetric)."""
        ...


@dataclass
class NormalizedMatch:
    """QA: equal after SQuAD normalisation, or listed together in an alias group."""

    aliases: Sequence[Sequence[str]] = ()
    name: str = "normalized"

    def __post_init__(self) -> None:
        self._alias_of: dict[str, int] = {}
        for gid, group in enumerate(self.aliases):
            for a in group:
                self._alias_of[normalize_answer(a)] = gid

    def key(self, answer: str) -> str:
        n = normalize_answer(answer)
        return f"alias:{self._alias_of[n]}" if n in self._alias_of else n

    def matrix(self, question: str, answers: Sequence[str]) -> list[list[bool]]:
        keys = [self.key(a) for a in answers]
        return [[ki == kj for kj in keys] for ki in keys]


@dataclass
class StringMatch:
    """The answer strings themselves: equal after stripping white space, never when empty.

    EMPO's clustering compares its extracted strings this way (math-verify's ``verify`` on two strings);
    TTRL's ``Counter`` vote counts equal strings. Both first normalise the strings
    (:mod:`turngym.grading.official_math`)."""

    name: str = "strings"

    def matrix(self, question: str, answers: Sequence[str]) -> list[list[bool]]:
        keys = [a.strip() for a in answers]
        return [[bool(ki) and ki == kj for kj in keys] for ki in keys]


@dataclass
class MathEquivalence:
    """Math: math-verify equivalence (checked both ways), after a cheap normalised match."""

    timeout_s: float = 5.0
    name: str = "math"

    def matrix(self, question: str, answers: Sequence[str]) -> list[list[bool]]:
        from turngym.grading.math_answers import grade_answer

        n = len(answers)
        return [[i == j or grade_answer(answers[j], [answers[i]], self.timeout_s).correct for j in range(n)]
                for i in range(n)]


@dataclass
class PRM800KMatch:
    """Math: TTRL's grader (``qwen/math_grade.py``'s ``grade_answer``, PRM800K's), run in a grader process.
    ``m[i][j]``: answer i graded correct against answer j as the ground truth. A check that reaches no verdict
    (timed out twice) is False and counted in ``no_verdict``."""

    timeout_s: float = 5.0
    name: str = "prm800k"
    no_verdict: int = 0

    def check(self, answer: str, truth: str) -> bool:
        """``answer`` graded correct against ``truth`` (one direction: what TTRL checks against its label)."""
        from turngym.grading.official_math import ttrl_equal

        verdict = ttrl_equal(answer, truth, self.timeout_s)
        self.no_verdict += verdict is None
        return bool(verdict)

    def matrix(self, question: str, answers: Sequence[str]) -> list[list[bool]]:
        return [[self.check(a, b) for b in answers] for a in answers]


@dataclass
class CallMatch:
    """Function calling: the same calls (``turngym.grading.calls``)."""

    name: str = "calls"

    def matrix(self, question: str, answers: Sequence[str]) -> list[list[bool]]:
        keys = [canonical_calls(a) for a in answers]
        return [[ki == kj for kj in keys] for ki in keys]


@dataclass
class NLIEquivalence:
    """Reference setting: strict entailment, premise "question answer_i" → hypothesis "question answer_j".

    All ordered pairs of distinct answers go through the model in batches.
    """

    nli: Any
    name: str = "nli"

    @classmethod
    def load(cls, model_id_or_path: str, **kwargs: Any) -> NLIEquivalence:
        from turngym.rewards.nli import NLIModel

        return cls(NLIModel.load(model_id_or_path, **kwargs))

    def matrix(self, question: str, answers: Sequence[str]) -> list[list[bool]]:
        n = len(answers)
        pairs = [(i, j) for i in range(n) for j in range(n) if i != j and answers[i] != answers[j]]
        texts = [(f"{question} {answers[i]}", f"{question} {answers[j]}") for i, j in pairs]
        verdicts = dict(zip(pairs, self.nli.entails(texts), strict=True)) if texts else {}
        return [[i == j or answers[i] == answers[j] or verdicts[(i, j)] for j in range(n)] for i in range(n)]


@dataclass
class Clustering:
    """Cluster ids per rollout (None for unanswered) and members per cluster."""

    labels: list[int | None]
    members: list[list[int]] = field(default_factory=list)

    @property
    def n_answered(self) -> int:
        return sum(lab is not None for lab in self.labels)

    def share(self, cluster: int) -> float:
        """m(c): the cluster's share of the *answered* rollouts."""
        return len(self.members[cluster]) / self.n_answered if self.n_answered else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"labels": self.labels, "members": self.members}


def cluster_answers(question: str, answers: Sequence[str | None], equivalence: Equivalence) -> Clustering:
    answered = [i for i, a in enumerate(answers) if a is not None and str(a).strip()]
    texts = [str(answers[i]).strip() for i in answered]
    mat = equivalence.matrix(question, texts) if texts else []
    labels: list[int | None] = [None] * len(answers)
    members: list[list[int]] = []
    reps: list[int] = []  # position in ``texts`` of each cluster's first member
    for pos, idx in enumerate(answered):
        for cid, rep in enumerate(reps):
            if mat[pos][rep] and mat[rep][pos]:
                labels[idx] = cid
                members[cid].append(idx)
                break
        else:
            labels[idx] = len(members)
            members.append([idx])
            reps.append(pos)
    return Clustering(labels, members)


def equivalence_for(needs: RewardNeeds) -> Equivalence:
    """The offline default for the answer kind an env declares (an env without answers: any match,
    there is nothing to cluster)."""
    if needs.answer_kind == "math":
        return MathEquivalence()
    if needs.answer_kind == "calls":
        return CallMatch()
    return NormalizedMatch()


AUTO_HINT = "Pass equivalence='normalized', 'math', 'calls' or 'nli:<model>' instead of 'auto'."


def make_equivalence(spec: Any, episodes: Sequence[Episode]) -> Equivalence:
    """``auto`` (the offline default for the answer kind the episodes' env declares), ``strings``, ``normalized``,
    ``math``, ``prm800k``, ``calls``, ``nli:<model id or path>``, or a ready backend object."""
    if not isinstance(spec, str):
        return spec
    if spec == "auto":
        return equivalence_for(group_needs(episodes, AUTO_HINT))
    if spec.startswith("nli:"):
        return NLIEquivalence.load(spec[4:])
    table = {"normalized": NormalizedMatch, "math": MathEquivalence, "calls": CallMatch, "strings": StringMatch,
             "prm800k": PRM800KMatch}
    if spec not in table:
        raise ValueError(f"unknown equivalence {spec!r}; use auto, strings, normalized, math, prm800k, calls or "
                         "nli:<model>")
    return table[spec]()
