"""What rewards need to know about an env's episodes (:class:`RewardNeeds`), declared by the env and carried
in every episode, so no reward guesses it from the env id."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turngym.episode.encoding import known_fields

ANSWER_KINDS = ("math", "qa_text", "calls", "none")
ANSWER_CUES = ("answer_tag", "boxed")


@dataclass(frozen=True)
class RewardNeeds:
    """What rewards need to know about an env's episodes, declared by the env that played them,
    so that no reward guesses it from the env id.

    - ``answer_kind``: how two final answers are compared: ``math`` (math-verify), ``qa_text``
      (SQuAD-normalised text), ``calls`` (function calls as canonical JSON), ``none`` (the env
      has no final answer).
    - ``answer_cue``: how the env asks for the final answer, the cue SIOP / IGPO's pseudo-answer
      uses under ``pseudo_answer="auto"``: ``answer_tag`` (``<answer>y</answer>``, the official
      pseudo-answer) or ``boxed`` (``\\boxed{y}``).
    - ``tool_ok_metrics``: the per-turn metrics that say a turn's tool calls ran (True) or failed
      (False); the env records one on every turn whose calls it ran (None or absent: no verdict,
      e.g. SearchQA's answer call). ``toolcall_dense`` reads them (:meth:`tool_succeeded`); an env
      whose turns make tool calls must declare at least one.
    - which observations are tool results (evidence): the observation of a turn that made tool
      calls and parsed, unless one of ``tool_ok_metrics`` is False or one of
      ``tool_error_metrics`` holds an error in the turn's metrics (then it is an error message).
    - a checker's verdict, at most one of: ``checker_metric``, the per-turn metric holding the
      verdict on the turns the env checked (True / False; absent or None: not checked), or
      ``checker_outcome``, the outcome field holding one verdict on the whole episode, which counts
      on its last turn. ``toolcall_dense`` reads it (:meth:`checker_verdict`).
    - ``user_turn_metric``: the per-turn metric an env records on every step of a conversation
      with several user turns; there a step that makes no call attempt is a reply to the user, so
      it is well-formed though it parsed no call (:meth:`is_reply`).

    ``predates`` lists the fields above that the file this declaration was read from did not have
    (written by an older turngym); a reward that reads one of them refuses the episode
    (:meth:`Episode.needs`) rather than read "none declared" into it.
    """

    answer_kind: str
    answer_cue: str
    tool_ok_metrics: tuple[str, ...] = ()
    tool_error_metrics: tuple[str, ...] = ()
    checker_metric: str | None = None
    checker_outcome: str | None = None
    user_turn_metric: str | None = None
    predates: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.answer_kind not in ANSWER_KINDS:
            raise ValueError(f"answer_kind must be one of {ANSWER_KINDS}, got {self.answer_kind!r}")
        if self.answer_cue not in ANSWER_CUES:
            raise ValueError(f"answer_cue must be one of {ANSWER_CUES}, got {self.answer_cue!r}")
        for name in ("tool_ok_metrics", "tool_error_metrics"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(m, str) and m for m in value):
                raise ValueError(f"{name} must be a sequence of metric names, got {value!r}")
            object.__setattr__(self, name, tuple(value))  # lists read back from JSON
        for name in ("checker_metric", "checker_outcome", "user_turn_metric"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"{name} must be a metric name or None, got {value!r}")
        if self.checker_metric is not None and self.checker_outcome is not None:
            raise ValueError("declare checker_metric (a verdict per checked turn) or checker_outcome (one verdict "
                             "on the episode, counted on its last turn), not both")
        unknown = sorted(set(self.predates) - set(LATER_NEEDS))
        if unknown:
            raise ValueError(f"predates names fields of the declaration: {LATER_NEEDS}, got {unknown}")
        object.__setattr__(self, "predates", tuple(self.predates))

    def tool_succeeded(self, metrics: dict[str, Any]) -> bool | None:
        """The declared verdict on a turn's tool calls: True when every declared ``tool_ok_metrics`` the
        turn records is true, False when one is false, None when it records none of them."""
        verdicts = [bool(metrics[m]) for m in self.tool_ok_metrics if metrics.get(m) is not None]
        return all(verdicts) if verdicts else None

    def tool_failed(self, metrics: dict[str, Any]) -> bool:
        """The turn's metrics say its tool call failed (its observation is an error, not a result)."""
        return self.tool_succeeded(metrics) is False or any(bool(metrics.get(m)) for m in self.tool_error_metrics)

    def checker_verdict(self, turn_metrics: dict[str, Any], outcome: dict[str, Any], last: bool) -> bool | None:
        """The declared checker's verdict on a turn (``last``: the episode's last turn); None: no verdict on it."""
        if self.checker_metric is not None:
            verdict = turn_metrics.get(self.checker_metric)
            return None if verdict is None else bool(verdict)
        if self.checker_outcome is not None and last and self.checker_outcome in outcome:
            return bool(outcome[self.checker_outcome])
        return None

    def is_reply(self, turn_metrics: dict[str, Any]) -> bool:
        """The turn is a step of a conversation with several user turns (where plain text replies to the user)."""
        return self.user_turn_metric is not None and self.user_turn_metric in turn_metrics

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RewardNeeds:
        if not isinstance(d, dict):
            raise ValueError(f"reward_needs must be a mapping, got {type(d).__name__}")
        kwargs = known_fields(cls, d)
        kwargs["predates"] = tuple(sorted(set(kwargs.get("predates", ())) | {f for f in LATER_NEEDS if f not in d}))
        return cls(**kwargs)


# the declaration's fields added after episodes first carried it: a file without them predates them
LATER_NEEDS = ("checker_metric", "checker_outcome", "user_turn_metric")


# What an episode built in code (not played by an env) declares unless given its own: text answers
# in answer tags, tool failures marked by any of the failure metrics turngym's envs record.
DEFAULT_REWARD_NEEDS = RewardNeeds(answer_kind="qa_text", answer_cue="answer_tag",
                                   tool_ok_metrics=("tool_ok", "exec_ok", "search_ok"),
                                   tool_error_metrics=("retrieval_error",))


class MissingRewardNeeds(ValueError):
    """An episode read from a file written before episodes carried ``reward_needs``, scored by a
    reward that needs the declaration."""
