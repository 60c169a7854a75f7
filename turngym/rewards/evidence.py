"""Evidence backends: how much a rollout's tool observations support an answer, in [0, 1].

r(c) for a cluster is the mean, over its members that have observations, of the mean
observation score for the cluster's answer (0 when no member has any observation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from turngym.episode import Episode
from turngym.evals.qa_metrics import normalize_answer


class Evidence(Protocol):
    name: str

    def scores(self, question: str, answer: str, observations: Sequence[str]) -> list[float]:
        ...


@dataclass
class AnswerInEvidence:
    """Offline default: 1 if the normalised answer occurs (as whole words) in the observation."""

    name: str = "answer_in_evidence"

    def scores(self, question: str, answer: str, observations: Sequence[str]) -> list[float]:
        needle = normalize_answer(answer)
        if not needle:
            return [0.0] * len(observations)
        return [float(f" {needle} " in f" {normalize_answer(o)} ") for o in observations]


@dataclass
class NLIEvidence:
    """Reference setting: P(observation entails "question answer")."""

    nli: Any
    name: str = "nli"

    @classmethod
    def load(cls, model_id_or_path: str, **kwargs: Any) -> "NLIEvidence":
        from turngym.rewards.nli import NLIModel

        return cls(NLIModel.load(model_id_or_path, **kwargs))

    def scores(self, question: str, answer: str, observations: Sequence[str]) -> list[float]:
        return self.nli.entailment([(o, f"{question} {answer}") for o in observations]) if observations else []


def observations_of(episode: Episode) -> list[str]:
    return [t.observation for t in episode.turns if t.observation]


def cluster_evidence(evidence: Evidence, question: str, answer: str, members: Sequence[Episode]) -> float:
    per_member = []
    for ep in members:
        obs = observations_of(ep)
        if obs:
            s = evidence.scores(question, answer, obs)
            per_member.append(sum(s) / len(s))
    return sum(per_member) / len(per_member) if per_member else 0.0


def make_evidence(spec: Any) -> Evidence:
    if not isinstance(spec, str):
        return spec
    if spec in ("auto", "answer_in_evidence"):
        return AnswerInEvidence()
    if spec.startswith("nli:"):
        return NLIEvidence.load(spec[4:])
    raise ValueError(f"unknown evidence backend {spec!r}; use answer_in_evidence or nli:<model>")
