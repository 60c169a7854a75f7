"""The reward-wrapper interface and registry.

A reward wrapper scores a *group* (the K episodes of one query) and returns one list of
per-turn rewards per episode, in the same order, one value per turn, plus diagnostics
(clusters, q, support per turn) that reports keep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from turngym.episode import Episode


@dataclass
class GroupScores:
    rewards: list[list[float]]
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def totals(self) -> list[float]:
        return [sum(r) for r in self.rewards]


class RewardWrapper(Protocol):
    name: str

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        ...


REWARDS: dict[str, Callable[..., RewardWrapper]] = {}


def register_reward(name: str) -> Callable[[Callable[..., RewardWrapper]], Callable[..., RewardWrapper]]:
    def deco(factory: Callable[..., RewardWrapper]) -> Callable[..., RewardWrapper]:
        REWARDS[name] = factory
        return factory

    return deco


def get_reward(name: str, **config: Any) -> RewardWrapper:
    """A reward wrapper by registry name (``outcome``, ``igpo``, ``ttrl``, ``empo``, ``siop``, ``scribe``, ``funrl``,
    ``toolcall_dense``, ``prm``, ``composite``), or a weighted sum of several named ``a+b``
    (see ``turngym.rewards.composite``)."""
    import turngym.rewards.composite  # noqa: F401
    import turngym.rewards.funrl  # noqa: F401 - registration
    import turngym.rewards.outcome  # noqa: F401
    import turngym.rewards.prm  # noqa: F401
    import turngym.rewards.scribe.reward  # noqa: F401
    import turngym.rewards.siop  # noqa: F401

    if "+" in name:
        from turngym.rewards.composite import composite_from_name

        try:
            return composite_from_name(name, **config)
        except TypeError as exc:
            raise ValueError(f"bad configuration for reward {name!r}: {exc}") from None

    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; choose one of {sorted(REWARDS)}")
    try:
        return REWARDS[name](**config)
    except TypeError as exc:
        raise ValueError(f"bad configuration for reward {name!r}: {exc}") from None


def final_turn_rewards(episode: Episode, value: float) -> list[float]:
    """``value`` on the last turn, 0 elsewhere (no turns: empty list)."""
    out = [0.0] * len(episode.turns)
    if out:
        out[-1] = finite(value)
    return out


def finite(x: float) -> float:
    """NaN and inf become 0 (rewards feed normalisation; one bad value would poison a batch)."""
    x = float(x)
    return x if math.isfinite(x) else 0.0


def outcome_score(episode: Episode, metric: str | None = None) -> float:
    """The episode's gold outcome as a number: ``metric`` if given, else the first of
    correct / em / bfcl_valid it has."""
    keys = [metric] if metric else ["correct", "em", "bfcl_valid"]
    for key in keys:
        if key in episode.outcome:
            return float(episode.outcome[key])
    if metric:
        raise KeyError(f"episode {episode.id} has no outcome field {metric!r} (has {sorted(episode.outcome)})")
    return 0.0


def check_group(episodes: Sequence[Episode]) -> None:
    if not episodes:
        raise ValueError("score_group needs at least one episode")
    questions = {str(e.task.get("question")) for e in episodes}
    if len(questions) > 1:
        raise ValueError(f"a group must hold rollouts of one query; got {len(questions)} different questions")
