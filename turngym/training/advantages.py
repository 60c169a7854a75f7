"""Advantage estimators behind one registry: per query group, per-turn rewards in, per-turn advantages out.

Each estimator takes the group's per-turn rewards (one list per episode) and returns one
list of advantages per episode, one value per turn; the trainer puts turn t's value on
turn t's action tokens only.

- ``grpo``: the episode's total reward, z-scored within the group, on every turn (TRL's GRPO).
- ``turn``: all turn rewards of the group z-scored together, then A_t = r̂_t + γ·A_{t+1}.
- ``igpo_separate``: outcome (final-turn) rewards and process (earlier-turn) rewards are
  z-scored separately within the group, then summed backwards as in ``turn`` (IGPO).
- ``egpo``: ``grpo``'s advantage, to which the trainer adds FunRL/EGPO's clipped entropy term
  min(alpha·H, |A|/kappa) on every action token (:func:`entropy_enhanced`).

Normalisation: unbiased std; a std below 1e-6 counts as 1; a group with a single reward gets 0;
``eps`` is added to the std. Defaults: ``grpo`` 1e-4 (TRL's, so it reproduces TRL's GRPO
advantages); ``turn`` and ``igpo_separate`` 1e-6 (the official SIOP / IGPO code).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from turngym.registry import Registry

Rewards = Sequence[Sequence[float]]
Estimator = Callable[..., list[list[float]]]
# Name -> "module:attribute", resolved on use; ``register_estimator`` adds one (a name once only).
ESTIMATORS = Registry("advantage estimator", {
    "grpo": "turngym.training.advantages:grpo",
    "turn": "turngym.training.advantages:turn",
    "igpo_separate": "turngym.training.advantages:igpo_separate",
    "egpo": "turngym.training.advantages:egpo",
})


def register_estimator(name: str, estimator: str | Estimator) -> None:
    """Add an estimator: a function ``(rewards, gamma, eps) -> advantages`` or its ``"module:attribute"``
    path. A second registration of a name raises ``ValueError``."""
    ESTIMATORS.register(name, estimator)


def get_estimator(name: str) -> Estimator:
    return ESTIMATORS.load(name)


def zscore(values: Sequence[float], eps: float = 1e-6) -> list[float]:
    n = len(values)
    if n <= 1:
        return [0.0] * n
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    if std < 1e-6:
        std = 1.0
    return [(v - mean) / (std + eps) for v in values]


def discounted(per_turn: Sequence[float], gamma: float) -> list[float]:
    out, acc = [0.0] * len(per_turn), 0.0
    for t in range(len(per_turn) - 1, -1, -1):
        acc = per_turn[t] + gamma * acc
        out[t] = acc
    return out


def _split(flat: list[float], shape: Rewards) -> list[list[float]]:
    out, i = [], 0
    for ep in shape:
        out.append(flat[i:i + len(ep)])
        i += len(ep)
    return out


def grpo(rewards: Rewards, gamma: float = 1.0, eps: float = 1e-4) -> list[list[float]]:
    totals = [sum(ep) for ep in rewards]
    z = zscore(totals, eps)
    return [[z_i] * len(ep) for z_i, ep in zip(z, rewards, strict=True)]


def turn(rewards: Rewards, gamma: float = 1.0, eps: float = 1e-6) -> list[list[float]]:
    flat = [r for ep in rewards for r in ep]
    return [discounted(ep, gamma) for ep in _split(zscore(flat, eps), rewards)]


def igpo_separate(rewards: Rewards, gamma: float = 1.0, eps: float = 1e-6) -> list[list[float]]:
    outcome = zscore([ep[-1] for ep in rewards if ep], eps)
    process = zscore([r for ep in rewards for r in ep[:-1]], eps)
    out, oi, pi = [], 0, 0
    for ep in rewards:
        if not ep:
            out.append([])
            continue
        normed = process[pi:pi + len(ep) - 1] + [outcome[oi]]
        pi += len(ep) - 1
        oi += 1
        out.append(discounted(normed, gamma))
    return out


# ------------------------------------------------------------------ EGPO (FunRL)
# Options an estimator takes beyond gamma/eps (YAML ``estimator:`` keys).
ESTIMATOR_OPTIONS: dict[str, set[str]] = {"egpo": {"alpha", "kappa"}}
EGPO_ALPHA = 0.4  # entropy weight (FunRL/EGPO paper)
EGPO_KAPPA = 2.0  # clip: the entropy term never exceeds |A|/kappa, so it cannot flip A's sign


def egpo(rewards: Rewards, gamma: float = 1.0, eps: float = 1e-6) -> list[list[float]]:
    """EGPO's base advantage: GRPO on the episode's (binary) reward, on every turn. The entropy term
    is per token and the trainer adds it with :func:`entropy_enhanced` (it needs the policy)."""
    return grpo(rewards, gamma, eps)


def entropy_enhanced(advantages, entropies, alpha: float = EGPO_ALPHA, kappa: float = EGPO_KAPPA):
    """EGPO's entropy-enhanced advantage per token: A + min(alpha·H, |A|/kappa), H detached.

    ``advantages`` and ``entropies`` are tensors of the same shape; a token with A = 0 (an
    observation, padding, or a group without reward variance) gets no bonus.
    """
    import torch

    if kappa <= 0 or alpha < 0:
        raise ValueError(f"egpo needs alpha >= 0 and kappa > 0, got alpha={alpha}, kappa={kappa}")
    return advantages + torch.minimum(alpha * entropies.detach(), advantages.abs() / kappa)
