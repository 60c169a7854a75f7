"""Evidence backends: how much a rollout's tool results support an answer, in [0, 1].

Official SIOP (``siop_process_reward.py``, the calibration block): every non-empty tool response
counts, tool errors ("No results found", "Error when executing tool: ...") included, stripped
and cut to its first 2,000 characters (``source="tool_responses"``). r(c) for a cluster is the
mean, over its members that have tool responses, of the mean score of their responses for the
cluster's answer (0 when no member has any). ``source="tool_results"`` leaves out tool errors
(by the failure metrics the env declares; turngym's earlier default); ``"observations"`` counts
every observation (invalid-action messages too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from turngym.episode import Episode, RewardNeeds, Turn
from turngym.grading.qa import normalize_answer

PREMISE_CHARS = 2000
EVIDENCE_SOURCES = ("tool_responses", "tool_results", "observations")


class Evidence(Protocol):
    name: str

    def scores(self, question: str, answer: str, observations: Sequence[str]) -> list[float]:
        ...


@dataclass
class AnswerInEvidence:
    """Offline default: 1 if the normalised answer occurs (as whole words) in the tool result."""

    name: str = "answer_in_evidence"

    def scores(self, question: str, answer: str, observations: Sequence[str]) -> list[float]:
        needle = normalize_answer(answer)
        if not needle:
            return [0.0] * len(observations)
        return [float(f" {needle} " in f" {normalize_answer(o)} ") for o in observations]


@dataclass
class NLIEvidence:
    """Reference setting: P(tool result entails the answer).

    ``hypothesis="answer"`` (official SIOP) uses the answer alone; ``"question_answer"``
    the question followed by the answer (the earlier turngym variant).
    """

    nli: Any
    hypothesis: str = "answer"
    name: str = "nli"

    def __post_init__(self) -> None:
        if self.hypothesis not in ("answer", "question_answer"):
            raise ValueError(f"hypothesis must be 'answer' or 'question_answer', got {self.hypothesis!r}")

    @classmethod
    def load(cls, model_id_or_path: str, hypothesis: str = "answer", **kwargs: Any) -> NLIEvidence:
        from turngym.rewards.nli import NLIModel

        return cls(NLIModel.load(model_id_or_path, **kwargs), hypothesis=hypothesis)

    def scores(self, question: str, answer: str, observations: Sequence[str]) -> list[float]:
        hyp = answer if self.hypothesis == "answer" else f"{question} {answer}"
        return self.nli.entailment([(o, hyp) for o in observations]) if observations else []


def is_tool_result(turn: Turn, needs: RewardNeeds) -> bool:
    """The turn ran a tool and its observation is that tool's output (not an error or a user message),
    by the failure metrics the env declares in ``needs``."""
    if not turn.observation or not turn.tool_calls or turn.parse_error:
        return False
    return not needs.tool_failed(turn.metrics)


def is_tool_response(turn: Turn) -> bool:
    """The turn ran a tool call and its observation, stripped, is not empty (errors included)."""
    return bool(turn.tool_calls) and not turn.parse_error and bool((turn.observation or "").strip())


def evidence_texts(episode: Episode, source: str = "tool_responses", premise_chars: int | None = PREMISE_CHARS) -> list[str]:
    if source not in EVIDENCE_SOURCES:
        raise ValueError(f"evidence source must be one of {EVIDENCE_SOURCES}, got {source!r}")
    if source == "observations":
        texts = [t.observation for t in episode.turns if t.observation]
    elif source == "tool_responses":
        texts = [t.observation.strip() for t in episode.turns if is_tool_response(t)]
    else:
        needs = episode.needs("Its tool results cannot be told from error messages; "
                              "pass evidence_source='observations' to count every observation.")
        texts = [t.observation for t in episode.turns if is_tool_result(t, needs)]
    return [x[:premise_chars] for x in texts] if premise_chars is not None else texts


def cluster_evidence(evidence: Evidence, question: str, answer: str, members: Sequence[Episode],
                     source: str = "tool_responses", premise_chars: int | None = PREMISE_CHARS) -> float:
    per_member = []
    for ep in members:
        obs = evidence_texts(ep, source, premise_chars)
        if obs:
            s = evidence.scores(question, answer, obs)
            per_member.append(sum(s) / len(s))
    return sum(per_member) / len(per_member) if per_member else 0.0


def make_evidence(spec: Any) -> Evidence:
    """``answer_in_evidence`` (``auto``), ``nli:<model>`` (hypothesis = the answer), or an object."""
    if not isinstance(spec, str):
        return spec
    if spec in ("auto", "answer_in_evidence"):
        return AnswerInEvidence()
    if spec.startswith("nli:"):
        return NLIEvidence.load(spec[4:])
    raise ValueError(f"unknown evidence backend {spec!r}; use answer_in_evidence or nli:<model>")
