"""The reward-wrapper interface and registry.

A reward wrapper scores a *group* (the K episodes of one query) and returns one list of
per-turn rewards per episode, in the same order, one value per turn, plus diagnostics
(clusters, q, support per turn) that reports keep.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from turngym.episode import Episode
from turngym.registry import Registry, resolve


@dataclass
class GroupScores:
    rewards: list[list[float]]
    diagnostics: dict[str, Any] = field(default_factory=dict)

    def totals(self) -> list[float]:
        return [sum(r) for r in self.rewards]


class RewardWrapper(Protocol):
    name: str
    estimator: ClassVar[str]  # the advantage estimator it is paired with in training (a run may override it)

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        ...


# Name -> "module:attribute" of the wrapper's factory, imported when first built: building a light
# reward (``outcome``) imports no model code, and this module imports no reward.
REWARDS = Registry("reward", {
    "outcome": "turngym.rewards.outcome:OutcomeReward",
    "ttrl": "turngym.rewards.outcome:TTRLReward",
    "empo": "turngym.rewards.outcome:EMPOReward",
    "siop": "turngym.rewards.siop:SIOPReward",
    "igpo": "turngym.rewards.siop:IGPOReward",
    "igpo_siop": "turngym.rewards.siop:IGPOSIOPReward",
    "scribe": "turngym.rewards.scribe.reward:ScribeReward",
    "prm": "turngym.rewards.prm:PRMReward",
    "funrl": "turngym.rewards.funrl:FunRLReward",
    "toolcall_dense": "turngym.rewards.funrl:ToolCallDenseReward",
    "composite": "turngym.rewards.composite:CompositeReward",
    "env": "turngym.rewards.env_reward:EnvReward",
})
JOINED = "turngym.rewards.composite:composite_from_name"  # builds an ``a+b`` name


def declared_estimator(name: str) -> str:
    """The estimator the reward registered as ``name`` declares (``a+b`` composites: ``CompositeReward``'s)."""
    factory = REWARDS.load("composite" if "+" in name else name)
    estimator = getattr(factory, "estimator", None)
    if not isinstance(estimator, str):
        raise ValueError(f"reward {name!r} declares no paired estimator (a class attribute 'estimator', e.g. 'grpo')")
    return estimator


def register_reward(name: str, factory: str | Callable[..., RewardWrapper]) -> None:
    """Add a reward wrapper under ``name``: its factory or the factory's ``"module:attribute"`` path.
    A name is registered once; a second registration raises ``ValueError``."""
    if "+" in name:
        raise ValueError(f"a reward name cannot hold '+' (it joins the parts of a composite), got {name!r}")
    REWARDS.register(name, factory)


def get_reward(name: str, **config: Any) -> RewardWrapper:
    """A reward wrapper by registry name (``outcome``, ``igpo``, ``ttrl``, ``empo``, ``siop``, ``scribe``, ``funrl``,
    ``toolcall_dense``, ``prm``, ``composite``), or a weighted sum of several named ``a+b``
    (see ``turngym.rewards.composite``)."""
    if "+" in name:
        try:
            return resolve(JOINED)(name, **config)
        except TypeError as exc:
            raise ValueError(f"bad configuration for reward {name!r}: {exc}") from None

    factory = REWARDS.load(name)
    try:
        return factory(**config)
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


def impute_missing(values: Sequence[float]) -> list[float]:
    """Missing outcomes (NaN) replaced by the mean of the group's graded ones (0 if none): an
    ungraded episode then gets no advantage of its own under a group baseline, instead of
    counting as a failure."""
    known = [v for v in values if math.isfinite(v)]
    fill = sum(known) / len(known) if known else 0.0
    return [v if math.isfinite(v) else fill for v in values]


def outcome_score(episode: Episode, metric: str | None = None) -> float:
    """The episode's gold outcome as a number: ``metric`` if given, else the first of
    correct / em / bfcl_valid it has; NaN when no verdict was reached (``outcome["graded"]`` is
    False: a grader timeout or crash, never "incorrect"; see :func:`impute_missing`)."""
    if episode.outcome.get("graded") is False:
        return math.nan
    keys = [metric] if metric else ["correct", "em", "bfcl_valid"]
    for key in keys:
        if key in episode.outcome:
            return float(episode.outcome[key])
    if metric:
        raise KeyError(f"episode {episode.id} has no outcome field {metric!r} (has {sorted(episode.outcome)})")
    return 0.0
