"""Another framework's advantage code, scored on the exact oracle (``turngym creditbench --oracle exact --external``).

A researcher points turngym at an advantage function (``module:function``) and a declared *form*: how the function
takes a group's per-turn rewards and episode boundaries, and what it returns. The adapter turns it into an
:class:`~turngym.training.advantages.EstimatorSpec` (``unbiased=None``: that is what the oracle measures), so the
exact oracle scores it beside turngym's own estimators on the same sampled episodes: cos(ĝ, g), sign accuracy,
leakage and bias by batch size.

Forms (:data:`FORMS`):

- ``turns``: ``f(rewards) -> advantages``, per-turn lists in, per-turn lists out (turngym's own estimator form).
- ``verl``: verl's ``core_algos`` contract, ``f(token_level_rewards, response_mask, index, config=...)`` returning
  ``(advantages, returns)`` tensors of shape (episodes, length). Each turn is one token carrying its reward
  (r_{i,t} at position t, the mask 1 on the episode's T_i positions), ``index`` is the group's id for every
  episode, ``config`` is ``verl.trainer.config.AlgoConfig(gamma=1.0, lam=1.0)``; turn t's advantage is the value at
  position t. A function whose advantage depends on how many tokens a turn has is scored with one token per turn.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

from turngym.registry import Registry
from turngym.training.advantages import ESTIMATORS, EstimatorSpec, register_estimator

PerTurn = list[list[float]]
PROBE: list[list[float]] = [[0.0, 1.0], [1.0], [0.0, 0.0, 1.0], [0.5]]  # one group: lengths 1-3, a tie at 1.0


class ExternalAdvantageError(ValueError):
    """An external advantage function that does not import, or answers in the wrong shape or with non-finite values."""


def _check(spec: str, out: Any, rewards: Sequence[Sequence[float]]) -> PerTurn:
    want = [len(ep) for ep in rewards]
    try:
        rows = [[float(x) for x in row] for row in out]
    except (TypeError, ValueError) as exc:
        raise ExternalAdvantageError(f"external advantage {spec!r} returned {type(out).__name__}, not one list of "
                                     f"numbers per episode ({exc})") from None
    if [len(r) for r in rows] != want:
        raise ExternalAdvantageError(f"external advantage {spec!r} returned lengths {[len(r) for r in rows]} for "
                                     f"episodes of {want} turns")
    if any(not math.isfinite(x) for r in rows for x in r):
        raise ExternalAdvantageError(f"external advantage {spec!r} returned a non-finite value: {rows}")
    return rows


def turns_form(spec: str, fn: Callable[..., Any]) -> Callable[..., PerTurn]:
    def estimator(rewards: Sequence[Sequence[float]], gamma: float | None = None, eps: float | None = None) -> PerTurn:
        return _check(spec, fn([list(ep) for ep in rewards]), rewards)

    return estimator


def verl_form(spec: str, fn: Callable[..., Any]) -> Callable[..., PerTurn]:
    import numpy as np
    import torch

    try:
        from verl.trainer.config import AlgoConfig
    except ImportError as exc:
        raise ExternalAdvantageError(f"external advantage {spec!r} (form verl) needs verl ({exc}): pip install "
                                     "'turngym[conformance]' && pip install --no-deps verl==0.9.1") from None

    def estimator(rewards: Sequence[Sequence[float]], gamma: float | None = None, eps: float | None = None) -> PerTurn:
        n, width = len(rewards), max((len(ep) for ep in rewards), default=0)
        scores = torch.zeros((n, max(width, 1)), dtype=torch.float32)
        mask = torch.zeros_like(scores)
        for i, ep in enumerate(rewards):
            scores[i, :len(ep)] = torch.tensor(ep, dtype=torch.float32)
            mask[i, :len(ep)] = 1.0
        out = fn(token_level_rewards=scores, response_mask=mask, index=np.array(["group"] * n, dtype=object),
                 config=AlgoConfig(gamma=1.0, lam=1.0))
        adv = out[0] if isinstance(out, tuple) else out
        if not isinstance(adv, torch.Tensor) or tuple(adv.shape) != tuple(scores.shape):
            shape = tuple(adv.shape) if isinstance(adv, torch.Tensor) else type(adv).__name__
            raise ExternalAdvantageError(f"external advantage {spec!r} returned {shape}, expected a tensor of shape "
                                         f"{tuple(scores.shape)} (episodes, turns)")
        return _check(spec, [adv[i, :len(ep)].tolist() for i, ep in enumerate(rewards)], rewards)

    return estimator


# form name -> adapter(spec, function) -> a per-turn estimator function
FORMS = Registry("external advantage form", {"turns": turns_form, "verl": verl_form})


def load_function(spec: str) -> Callable[..., Any]:
    module, colon, attr = spec.partition(":")
    if not colon or not module or not attr:
        raise ExternalAdvantageError(f"external advantage {spec!r}: write module:function")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ExternalAdvantageError(f"external advantage {spec!r} does not import: {exc}") from None
    if not callable(fn):
        raise ExternalAdvantageError(f"external advantage {spec!r} is a {type(fn).__name__}, not a function")
    return fn


def register_external(spec: str, form: str = "turns") -> str:
    """Register ``module:function`` through ``form`` as the estimator ``external:<form>:<spec>`` (once), after one
    probe call on a small group of unequal lengths, so a bad function is refused before any oracle work."""
    name = f"external:{form}:{spec}"
    if name in ESTIMATORS:
        return name
    if form not in FORMS:
        raise ExternalAdvantageError(f"unknown external advantage form {form!r}; choose one of {sorted(FORMS)}")
    estimator = FORMS.load(form)(spec, load_function(spec))
    try:
        estimator(PROBE)
    except ExternalAdvantageError:
        raise
    except Exception as exc:  # the function's own failure on a valid group: the user's to see, in one line
        raise ExternalAdvantageError(f"external advantage {spec!r} failed on a group of {len(PROBE)} episodes "
                                     f"({type(exc).__name__}: {exc})") from None
    register_estimator(name, EstimatorSpec(name, estimator, unbiased=None, official=spec))
    return name
