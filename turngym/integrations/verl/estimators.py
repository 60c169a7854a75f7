"""turngym's advantage estimators as verl estimators (``algorithm.adv_estimator=turngym_<name>``).

verl calls a registered estimator with ``token_level_rewards`` and ``response_mask`` (episodes, response tokens),
the group ids ``index`` (verl's ``uid``) and the algorithm config. Turns are read from the mask as SIOP's own
``get_assistant_turn_ranges`` reads them (dl-m9/SIOP ``verl/utils/siop/turn_utils.py``): each run of 1s is one
assistant turn. Turn t's reward is the sum of the token rewards from its first reply token up to the next turn's
first token (the first turn from the response's start, the last to its end), so a reward on the turn's last reply
token, on its observation or (with verl's KL-in-reward) spread over its tokens all count for that turn. The group's
per-turn rewards go through turngym's estimator (:func:`turngym.training.advantages.advantages_per_group`), and turn
t's advantage is put on turn t's reply tokens; ``returns`` are the advantages, as verl's GRPO returns them.

``algorithm.gamma`` is the estimator's gamma; ``algorithm.turngym_options`` (a mapping) its options (e.g.
``{scale: std}`` for ``turn_loo``). An estimator that needs more than the rewards (gigpo's anchor states, egpo's
entropies, vine's branches) cannot be given it through verl's estimator interface: :func:`check_estimator` refuses it
in one line at start-up, and the registered function refuses it if called.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from verl.trainer.ppo import core_algos

from turngym.training.advantages import ESTIMATORS, NEEDS, advantages_per_group, get_estimator

PREFIX = "turngym_"


def turn_ranges(mask: Sequence[int] | torch.Tensor) -> list[tuple[int, int]]:
    """Half-open token ranges of the runs of 1s in one row's ``response_mask``: one per assistant turn."""
    row = mask.tolist() if isinstance(mask, torch.Tensor) else list(mask)
    ranges, start = [], None
    for i, v in enumerate(row):
        if v and start is None:
            start = i
        elif not v and start is not None:
            ranges.append((start, i))
            start = None
    if start is not None:
        ranges.append((start, len(row)))
    return ranges


def turn_rewards(token_rewards: torch.Tensor, ranges: Sequence[tuple[int, int]]) -> list[float]:
    """One row's per-turn rewards: each turn's token rewards, from its first reply token to the next turn's."""
    starts = [0] + [s for s, _ in ranges[1:]]
    ends = [s for s, _ in ranges[1:]] + [token_rewards.shape[-1]]
    return [float(token_rewards[a:b].double().sum()) for a, b in zip(starts, ends, strict=True)]


def unsuppliable(name: str) -> list[str]:
    """What the turngym estimator ``name`` needs beyond per-turn rewards (verl's interface gives nothing more)."""
    return sorted(get_estimator(name).needs - {"rewards"})


def check_estimator(adv_estimator: str) -> None:
    """Refuse, in one line, a ``turngym_<name>`` estimator that is unknown or needs what verl cannot supply;
    any other name (verl's own) passes."""
    if not str(adv_estimator).startswith(PREFIX):
        return
    name = str(adv_estimator)[len(PREFIX):]
    if name not in ESTIMATORS:
        raise ValueError(f"algorithm.adv_estimator={adv_estimator}: turngym has no estimator {name!r}; choose one of "
                         + ", ".join(PREFIX + n for n in sorted(ESTIMATORS) if not unsuppliable(n)))
    missing = unsuppliable(name)
    if missing:
        ok = ", ".join(PREFIX + n for n in sorted(ESTIMATORS) if not unsuppliable(n))
        raise ValueError(f"algorithm.adv_estimator={adv_estimator} needs {'; '.join(NEEDS[m] for m in missing)}, "
                         f"which verl's estimator interface (token_level_rewards, response_mask, uid) does not carry; "
                         f"choose one of {ok}")


def _options(config: Any) -> tuple[float | None, dict[str, Any]]:
    if config is None:
        return None, {}
    gamma = config.get("gamma", None)
    options = config.get("turngym_options", None) or {}
    if not isinstance(options, Mapping):
        options = dict(options)
    return (None if gamma is None else float(gamma)), {str(k): v for k, v in dict(options).items()}


def make_estimator(name: str):
    """The verl estimator ``turngym_<name>``: per-turn rewards from the mask's turns, turngym's advantages back."""

    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                  config: Any = None, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        check_estimator(PREFIX + name)
        if index is None:
            raise ValueError(f"{PREFIX}{name} needs verl's group ids (non_tensor_batch['uid']) to form groups")
        spec = get_estimator(name)
        gamma, options = _options(config)
        spec.check_options(options)
        ranges = [turn_ranges(response_mask[i]) for i in range(response_mask.shape[0])]
        rewards = [turn_rewards(token_level_rewards[i], r) for i, r in enumerate(ranges)]
        groups: dict[str, list[int]] = {}
        for i, uid in enumerate(index):
            groups.setdefault(str(uid), []).append(i)
        kw = {"gamma": gamma} if gamma is not None else {}
        per_turn = advantages_per_group(rewards, list(groups.values()), name, **kw, **spec.function_options(options))
        adv = torch.zeros_like(token_level_rewards, dtype=torch.float32)
        for i, (row, values) in enumerate(zip(ranges, per_turn, strict=True)):
            for (a, b), value in zip(row, values or [], strict=True):
                adv[i, a:b] = value
        return adv, adv.clone()

    estimator.__name__ = f"{PREFIX}{name}"
    return estimator


def register_estimators() -> list[str]:
    """Register every turngym estimator with verl as ``turngym_<name>`` (once per process); returns the names."""
    names = []
    for name in sorted(ESTIMATORS):
        key = PREFIX + name
        if key not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(key)(make_estimator(name))
        names.append(key)
    return names
