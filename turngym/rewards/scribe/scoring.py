"""From judged steps to per-turn rewards (shared by ``scribe`` and ``prm``).

Each step gets a value in [0, 1]:

* judged: ``score / 3``;
* unmatched (no prototype cleared the router's thresholds) or the judge gave no valid JSON:
  ``neutral`` (default 0.5, the middle of the 0-3 scale): the reward cannot tell, so it
  neither punishes nor favours the step; both are counted in the diagnostics.

A turn's process reward ``p_t`` is the ``aggregate`` (default ``mean``; ``min`` = the
weakest step) of its steps' values; a turn with no step (the decomposer found none) gets
``neutral`` and is counted. The reward is ``r_t = (1 - w) * p_t``, plus ``w * outcome`` on
the final turn (``w = outcome_weight``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from turngym.episode import Episode
from turngym.rewards.base import GroupScores, finite, outcome_score

AGGREGATES = ("mean", "min")
NEUTRAL = 0.5


@dataclass
class StepRecord:
    """One step's place, route and verdict, as kept in the reward diagnostics."""

    turn: int
    start: int
    end: int
    subgoal: str
    skill: str
    status: str                    # "judged" | "unmatched" | "judge_failed"
    value: float                   # in [0, 1]
    prototype: str | None = None
    score: int | None = None
    violated: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def step_value(score: int | None, status: str, neutral: float) -> float:
    return score / 3.0 if status == "judged" and score is not None else neutral


def check_scoring(neutral: float, aggregate: str, outcome_weight: float) -> None:
    if not 0.0 <= outcome_weight <= 1.0:
        raise ValueError(f"outcome_weight must be in [0, 1], got {outcome_weight}")
    if not 0.0 <= neutral <= 1.0:
        raise ValueError(f"unmatched_value must be in [0, 1], got {neutral}")
    if aggregate not in AGGREGATES:
        raise ValueError(f"turn_aggregate must be one of {AGGREGATES}, got {aggregate!r}")


def turn_process(n_turns: int, steps: Sequence[StepRecord], neutral: float, aggregate: str) -> list[float]:
    out = []
    for t in range(n_turns):
        values = [s.value for s in steps if s.turn == t]
        if not values:
            out.append(neutral)
        elif aggregate == "min":
            out.append(min(values))
        else:
            out.append(sum(values) / len(values))
    return out


def episode_rewards(ep: Episode, steps: Sequence[StepRecord], neutral: float, aggregate: str,
                    outcome_weight: float, outcome_metric: str | None) -> list[float]:
    r = [(1.0 - outcome_weight) * p for p in turn_process(len(ep.turns), steps, neutral, aggregate)]
    if r:
        r[-1] += outcome_weight * outcome_score(ep, outcome_metric)
    return [finite(x) for x in r]


def step_counts(steps_per_episode: Sequence[Sequence[StepRecord]]) -> dict[str, int]:
    flat = [s for steps in steps_per_episode for s in steps]
    return {"step_count": len(flat), "judged_steps": sum(s.status == "judged" for s in flat),
            "unmatched_steps": sum(s.status == "unmatched" for s in flat),
            "judge_failed_steps": sum(s.status == "judge_failed" for s in flat)}


def group_scores(episodes: Sequence[Episode], decomps: Sequence[Any], per_episode: Sequence[Sequence[StepRecord]], *,
                 neutral: float, aggregate: str, outcome_weight: float, outcome_metric: str | None, judge_calls: int,
                 llm: Any, calls_before: int, **extra: Any) -> GroupScores:
    """Per-turn rewards of judged steps and the diagnostics both step-judged rewards (scribe, prm) report."""
    rewards = [episode_rewards(e, s, neutral, aggregate, outcome_weight, outcome_metric)
               for e, s in zip(episodes, per_episode, strict=True)]
    return GroupScores(rewards, {
        "steps": [[s.to_dict() for s in st] for st in per_episode],
        **step_counts(per_episode),
        "decomposition_failed": [d.failed for d in decomps],
        "dropped_steps": [d.dropped for d in decomps],
        "unstepped_turns": [d.unstepped_turns for d in decomps],
        "decompose_windows": sum(d.windows for d in decomps),
        "judge_calls": judge_calls,
        "llm_calls": llm.stats.calls - calls_before,
        "llm": llm.stats.to_dict(),
        **extra,
    })
