"""Weighted sums of rewards, by configuration: SCRIBE's additivity experiment as one config.

``r_t = sum_i w_i * r_{i,t}`` for every turn t, where ``r_i`` are the parts' per-turn
rewards on the same group (each part keeps its own definition, outcome term included).
Two ways to ask for one::

    get_reward("scribe+funrl", weights={"scribe": 1.0, "funrl": 0.5}, scribe={"llm": ...})
    get_reward("composite", parts=[{"name": "scribe", "weight": 1.0, "llm": ...},
                                   {"name": "egpo", "weight": 0.5}])

In a ``name+name`` form each part's configuration is the keyword named after it and a
missing weight is 1.0. The diagnostics keep every part's rewards and diagnostics. The
trainer hooks (``observe``, ``training_metrics``) are forwarded to every part (no-ops where a part has none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from turngym.episode import Episode
from turngym.rewards.base import GroupReward, GroupScores, finite, get_reward


@dataclass
class CompositeReward(GroupReward):
    estimator: ClassVar[str] = "turn_loo"  # a sum of per-turn rewards: the unbiased turn-level estimator
    scores_single_episodes: ClassVar[bool] = True
    parts: list[dict[str, Any]]
    name: str = "composite"
    members: dict[str, GroupReward] = field(default_factory=dict, init=False)
    weights: dict[str, float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("a composite reward needs at least one part")
        for spec in self.parts:
            spec = dict(spec)
            weight = float(spec.pop("weight", 1.0))
            if "reward" in spec:  # an already-built reward (e.g. sharing one judge model)
                part = spec.pop("reward")
                if not isinstance(part, GroupReward):
                    raise TypeError(f"a built part must be a GroupReward, got {type(part).__name__}")
                key = spec.pop("name", part.name)
                if spec:
                    raise ValueError(f"part {key!r}: a built reward takes no configuration, got {sorted(spec)}")
            else:
                if "name" not in spec:
                    raise ValueError(f"each part needs a 'name' (or a built 'reward'), got {sorted(spec)}")
                key = spec.pop("name")
                part = get_reward(key, **spec)
            unique, n = key, 2
            while unique in self.members:
                unique, n = f"{key}#{n}", n + 1
            self.members[unique] = part
            self.weights[unique] = weight
        if not self.name or self.name == "composite":
            self.name = "+".join(self.members)

    def score_episode(self, episode: Episode) -> list[float]:
        return self.score_group([episode]).rewards[0]

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if not episodes:
            raise ValueError("score_group needs at least one episode")
        parts = {k: w.score_group(episodes) for k, w in self.members.items()}
        totals = []
        for i, ep in enumerate(episodes):
            row = [0.0] * len(ep.turns)
            for k, scores in parts.items():
                r = scores.rewards[i]
                if len(r) != len(ep.turns):
                    raise ValueError(f"part {k!r} gave {len(r)} rewards for episode {ep.id} with {len(ep.turns)} turns")
                row = [a + self.weights[k] * b for a, b in zip(row, r, strict=True)]
            totals.append([finite(x) for x in row])
        return GroupScores(totals, {"weights": dict(self.weights),
                                    "part_rewards": {k: s.rewards for k, s in parts.items()},
                                    "parts": {k: s.diagnostics for k, s in parts.items()}})

    def observe(self, step: int, episodes: Sequence[Episode] | None = None) -> None:
        for w in self.members.values():
            w.observe(step, episodes)

    def training_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for w in self.members.values():
            out.update(w.training_metrics())
        return out


def composite_from_name(name: str, weights: dict[str, float] | None = None, **configs: Any) -> CompositeReward:
    """``"scribe+funrl"`` with ``weights`` and one configuration keyword per part."""
    keys = [k.strip() for k in name.split("+")]
    if len(keys) < 2 or not all(keys):
        raise ValueError(f"a composite name joins reward names with '+', got {name!r}")
    weights = dict(weights or {})
    unknown = (set(weights) | set(configs)) - set(keys)
    if unknown:
        raise ValueError(f"{name!r}: weights/configuration given for {sorted(unknown)}, which are not among its parts")
    parts = []
    for k in keys:
        cfg = configs.get(k) or {}
        if not isinstance(cfg, dict):
            raise ValueError(f"{name!r}: the configuration of part {k!r} must be a mapping")
        parts.append({"name": k, "weight": weights.get(k, 1.0), **cfg})
    return CompositeReward(parts, name=name)
