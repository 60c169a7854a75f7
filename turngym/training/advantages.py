"""Advantage estimators behind one registry: per query group, per-turn rewards in, per-turn advantages out.

Each estimator takes the group's per-turn rewards (one list per episode) and returns one
list of advantages per episode, one value per turn; the trainer puts turn t's value on
turn t's action tokens only.

- ``grpo``: the episode's total reward, z-scored within the group, on every turn (TRL's GRPO).
- ``turn``: all turn rewards of the group z-scored together, then A_t = r̂_t + γ·A_{t+1}.
- ``igpo``: the IGPO repository's GRPO (``core_algos.py`` ``compute_grpo_outcome_advantage``): returns-to-go
  minus their mean at the same position over the group, no std; turngym's position is the turn index.
- ``igpo_siop``: the SIOP repository's ``igpo`` estimator: final-turn rewards and non-zero earlier-turn
  rewards z-scored apart (population std), zero gains left out, then summed backwards over those turns.
- ``igpo_separate``: turngym's own: outcome (final-turn) and process (earlier-turn) rewards z-scored
  separately (unbiased std, zero gains included), then summed backwards as in ``turn``.
- ``egpo``: ``grpo``'s advantage, to which the trainer adds FunRL/EGPO's clipped entropy term
  min(alpha·H, |A|/kappa) on every action token (:func:`entropy_enhanced`).
- ``turn_loo``: each turn's return-to-go minus the mean return-to-go, at the same turn, of the
  group's other episodes still running (optionally one std per group). Unbiased with per-turn rewards and
  varying lengths, where ``turn`` and ``igpo_separate`` are not (docs/estimators.md).
- ``rloo``: the episode's total minus the mean total of the group's other episodes (verl's RLOO).
- ``gigpo``: GiGPO's episode term plus ω times its step term (returns-to-go of turns that share
  an anchor state, centred within that step group), as verl-agent's ``core_gigpo``.

Every estimator refuses a reward that is not finite (``ValueError``): a NaN would otherwise
spread through the group's normalisation into every advantage of the group.

Normalisation: unbiased std; a std below 1e-6 counts as 1; a group with a single reward gets 0;
``eps`` is added to the std. Defaults: ``grpo`` 1e-4 (TRL's, so it reproduces TRL's GRPO
advantages); ``turn``, ``igpo_siop`` and ``igpo_separate`` 1e-6 (the official SIOP / IGPO code).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turngym.registry import Registry, resolve

Rewards = Sequence[Sequence[float]]
Estimator = Callable[..., list[list[float]]]

# What an estimator can need beyond the group's per-turn rewards, and why a saved episode's rewards alone cannot
# give it (the viewer and the scores record say so for the estimators they leave out).
NEEDS: dict[str, str] = {
    "rewards": "the group's per-turn rewards",
    "states": ("an anchor state per turn (TextEnv.anchor_state, which a score file does not carry); from rewards alone "
               "gigpo is its episode term"),
    "branches": ("Monte-Carlo values from continuations the policy plays after every prefix (turngym creditbench "
                 "--oracle mc computes them for saved episodes); rewards alone give none"),
    "entropy": ("the policy's per-token entropies, which a saved episode does not record; from rewards alone egpo is "
                "its base advantage, GRPO's z-scored episode reward (eps 1e-6), which the grpo column already shows"),
}


@dataclass(frozen=True)
class EstimatorSpec:
    """One advantage estimator, declared: the trainer, ablate, creditbench and the viewer read these fields,
    never the estimator's name.

    ``function``: ``(rewards, gamma, eps, **options) -> advantages`` or its ``"module:attribute"`` path.
    ``options``: the options it takes beyond gamma/eps, with their defaults (YAML ``estimator:`` keys);
    ``trainer_options``: those of them the trainer applies itself (per token, or when it rolls out), not passed on.
    ``needs``: keys of :data:`NEEDS` (``rewards`` always; ``states``, ``branches``, ``entropy``).
    ``unbiased``: whether its expected gradient is the policy gradient when episode lengths vary and rewards are
    per turn (None: not measured); ``exact_cosine``: the lowest cos(ĝ, g) it reaches at B = 256 over the four
    exact-oracle settings (docs/estimators.md), the figure a warning quotes. ``official``: the official code it
    reproduces, if any. ``gives``: what a turn receives, in one line (the estimator table of docs/results.md is
    generated from it). ``gamma`` and ``eps`` left out of a call take the function's own defaults.
    """

    name: str
    function: str | Estimator
    gives: str = ""
    unbiased: bool | None = None
    exact_cosine: float | None = None
    official: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    trainer_options: frozenset[str] = frozenset()
    needs: frozenset[str] = frozenset({"rewards"})

    def __post_init__(self) -> None:
        if unknown := set(self.needs) - NEEDS.keys():
            raise ValueError(f"estimator {self.name!r} needs {sorted(unknown)}, which are not among {sorted(NEEDS)}")
        if extra := set(self.trainer_options) - set(self.options):
            raise ValueError(f"estimator {self.name!r}: trainer options {sorted(extra)} are not among its options")

    def __call__(self, rewards: Rewards, gamma: float | None = None, eps: float | None = None,
                 **kw: Any) -> list[list[float]]:
        given = {k: v for k, v in (("gamma", gamma), ("eps", eps)) if v is not None}
        return resolve(self.function)(rewards, **given, **kw)

    @property
    def from_rewards_alone(self) -> bool:
        """A saved episode's per-turn rewards determine its advantages completely."""
        return self.needs == {"rewards"}

    def function_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` less those the trainer applies itself."""
        return {k: v for k, v in options.items() if k not in self.trainer_options}

    def check_options(self, options: Mapping[str, Any]) -> None:
        if unknown := set(options) - set(self.options):
            raise ValueError(f"estimator {self.name!r} takes no options {sorted(unknown)}"
                             + (f"; it takes {sorted(self.options)}" if self.options else ""))


def _spec(name: str, **kw: Any) -> EstimatorSpec:
    return EstimatorSpec(name, f"turngym.training.advantages:{name}", **kw)


EGPO_ALPHA = 0.4  # entropy weight (FunRL/EGPO paper)
EGPO_KAPPA = 2.0  # clip: the entropy term never exceeds |A|/kappa, so it cannot flip A's sign
GIGPO_GAMMA = 0.95  # verl-agent's GiGPO scripts: algorithm.gamma=0.95
GIGPO_OMEGA = 1.0  # algorithm.gigpo.step_advantage_w
GIGPO_MODES = ("mean_norm", "mean_std_norm")  # algorithm.gigpo.mode; the scripts use mean_norm
VINE_ROLLOUTS = 4  # continuations per prefix (VinePPO uses K = 9 on math; turngym's default is cheaper)

# The exact_cosine figures are docs/estimators.md's exact-oracle table (2026-12-01, B = 256, the lowest setting).
ESTIMATORS = Registry("advantage estimator", {spec.name: spec for spec in (
    _spec("grpo", gives="the episode's z-scored total, broadcast to every turn",
          unbiased=True, exact_cosine=1.0000, official="TRL's GRPOTrainer (advantages and loss)"),
    _spec("turn", gives="group z-score of all turn rewards, then a backward sum (γ = 1)",
          unbiased=False, exact_cosine=0.8368,
          official="dl-m9/SIOP verl/trainer/ppo/core_algos.py compute_siop_turn_level_advantage"),
    _spec("igpo_separate", gives="outcome and process rewards z-scored apart, then a backward sum",
          unbiased=False, exact_cosine=0.9264),
    _spec("igpo", gives="return-to-go minus the group's mean return-to-go at the same turn",
          unbiased=True, exact_cosine=1.0000,
          official="GuoqingWang1/IGPO verl/trainer/ppo/core_algos.py compute_grpo_outcome_advantage"),
    _spec("igpo_siop", gives="final reward and non-zero information gains normalised apart, then a backward sum",
          unbiased=False, exact_cosine=0.9264,
          official="dl-m9/SIOP verl/trainer/ppo/core_algos.py compute_igpo_turn_level_advantage"),
    _spec("egpo", gives="GRPO on the episode's reward, plus a clipped per-token entropy term",
          unbiased=None, options={"alpha": EGPO_ALPHA, "kappa": EGPO_KAPPA},
          trainer_options=frozenset({"alpha", "kappa"}), needs=frozenset({"rewards", "entropy"}),
          official="FunRL/EGPO's entropy-enhanced GRPO"),
    _spec("turn_loo", gives="return-to-go minus the mean of the other running episodes' at that turn",
          unbiased=True, exact_cosine=1.0000, options={"scale": "none"}),
    _spec("rloo", gives="the episode's total minus the mean of the group's other totals, on every turn",
          unbiased=True, exact_cosine=1.0000, official="TRL's RLOOTrainer; verl compute_rloo_outcome_advantage"),
    _spec("gigpo", gives="the episode's group advantage plus a step advantage among turns from the same state",
          unbiased=False, exact_cosine=0.9996, options={"omega": GIGPO_OMEGA, "mode": "mean_norm"},
          needs=frozenset({"rewards", "states"}), official="verl-agent gigpo/core_gigpo.py"),
    _spec("vine", gives="the turn's Monte-Carlo value minus its state's, from branched continuations",
          unbiased=True, options={"rollouts": VINE_ROLLOUTS}, trainer_options=frozenset({"rollouts"}),
          needs=frozenset({"rewards", "branches"}), official="VinePPO (Monte-Carlo values per turn)"),
)})
UNBIASED_CHOICES = ("turn_loo", "rloo", "grpo", "igpo")  # what a reward without an official estimator recommends


def register_estimator(name: str, estimator: str | Estimator | EstimatorSpec, **declared: Any) -> None:
    """Add an estimator: an :class:`EstimatorSpec`, or a function ``(rewards, gamma, eps) -> advantages`` (or its
    ``"module:attribute"`` path) declared by ``declared`` (``unbiased=``, ``options=``, ``needs=`` ...). A second
    registration of a name raises ``ValueError``."""
    spec = estimator if isinstance(estimator, EstimatorSpec) else EstimatorSpec(name, estimator, **declared)
    ESTIMATORS.register(name, spec)


def get_estimator(name: str) -> EstimatorSpec:
    """The declared estimator registered as ``name``; call it as ``spec(rewards, gamma=..., eps=..., **options)``."""
    return ESTIMATORS.load(name)


def advantages_per_group(rewards: Sequence[Sequence[float]], groups: Sequence[Sequence[int]], estimator: str,
                         **kw: Any) -> list[list[float] | None]:
    """The one "advantages per group" loop: ``rewards`` per episode, ``groups`` lists of episode positions; each
    group's advantages from ``estimator``; positions in no group get None."""
    est = get_estimator(estimator)
    out: list[list[float] | None] = [None] * len(rewards)
    for members in groups:
        for i, a in zip(members, est([rewards[i] for i in members], **kw), strict=True):
            out[i] = [float(x) for x in a]
    return out


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


def check_finite(rewards: Rewards) -> None:
    """Raise ``ValueError`` naming the first reward that is NaN or infinite."""
    for i, ep in enumerate(rewards):
        for t, r in enumerate(ep):
            if not math.isfinite(r):
                raise ValueError(f"reward {r!r} of episode {i}, turn {t} is not finite; an advantage estimator "
                                 "needs finite rewards (map NaN to a value in the reward first)")


def grpo(rewards: Rewards, gamma: float = 1.0, eps: float = 1e-4) -> list[list[float]]:
    check_finite(rewards)
    totals = [sum(ep) for ep in rewards]
    z = zscore(totals, eps)
    return [[z_i] * len(ep) for z_i, ep in zip(z, rewards, strict=True)]


def turn(rewards: Rewards, gamma: float = 1.0, eps: float = 1e-6) -> list[list[float]]:
    check_finite(rewards)
    flat = [r for ep in rewards for r in ep]
    return [discounted(ep, gamma) for ep in _split(zscore(flat, eps), rewards)]


def igpo_separate(rewards: Rewards, gamma: float = 1.0, eps: float = 1e-6) -> list[list[float]]:
    check_finite(rewards)
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


def igpo(rewards: Rewards, gamma: float = 1.0, eps: float = 1e-6) -> list[list[float]]:
    """The IGPO repository's advantage (``verl/trainer/ppo/core_algos.py`` ``compute_grpo_outcome_advantage``).

    There: token-level returns G (γ = 1; a return does not flow back past a padded position), then
    A = G − mean over the group's rollouts of G at the same token position (padding counts 0), no std.
    Here the position is the turn: G_{i,t} = Σ_{k≥t} γ^{k−t} r_{i,k}; A_{i,t} = G_{i,t} − (1/K) Σ_j G_{j,t}
    over all K episodes of the group, G_{j,t} = 0 for an episode with T_j ≤ t (ended, as padding).
    The repository's reward of turn t sits on the last token of turn t's text, so every token of turn t has
    return G_{i,t}; its positions are token offsets, which line up with turns only when the group's turns
    have equal token lengths (the per-turn interface has no lengths). ``eps`` is unused (no std).
    """
    check_finite(rewards)
    returns = [discounted(ep, gamma) for ep in rewards]
    horizon = max((len(g) for g in returns), default=0)
    k = len(returns)
    mean = [sum(g[t] for g in returns if t < len(g)) / k for t in range(horizon)]
    return [[x - mean[t] for t, x in enumerate(g)] for g in returns]


def _population_stats(values: Sequence[float]) -> tuple[float, float]:
    """The SIOP repository's group statistics: mean and sqrt(population variance + 1e-8); one value or none:
    std 1 (none: mean 0)."""
    n = len(values)
    if n == 0:
        return 0.0, 1.0
    mean = sum(values) / n
    if n <= 1:
        return mean, 1.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / n + 1e-8)


def igpo_siop(rewards: Rewards, gamma: float = 1.0, eps: float = 1e-6) -> list[list[float]]:
    """The SIOP repository's IGPO baseline advantage (dl-m9/SIOP ``verl/trainer/ppo/core_algos.py``
    ``compute_igpo_turn_level_advantage``, ``info_gain_norm_mode="separate"``).

    The final turn's reward (its F1 slot) and the non-zero earlier rewards (information gains) are
    normalised apart within the group: (r − mean)/(std + eps), std = sqrt(population variance + 1e-8),
    std 1 for a single value. A zero earlier reward is no turn boundary: it is left out of the statistics
    and its turn takes the advantage of the next boundary turn. Boundaries b: A_b = r̂_b + γ·A_{b'} (b' the
    next boundary).
    """
    check_finite(rewards)
    f_mean, f_std = _population_stats([ep[-1] for ep in rewards if ep])
    g_mean, g_std = _population_stats([r for ep in rewards for r in ep[:-1] if r != 0])
    out = []
    for ep in rewards:
        adv, acc = [0.0] * len(ep), 0.0
        for t in range(len(ep) - 1, -1, -1):
            if t == len(ep) - 1:
                acc = (ep[t] - f_mean) / (f_std + eps)
            elif ep[t] != 0:
                acc = (ep[t] - g_mean) / (g_std + eps) + gamma * acc
            adv[t] = acc
        out.append(adv)
    return out


# ------------------------------------------------------------------ unbiased turn level, RLOO, GiGPO


def _group_scale(values: Sequence[float], eps: float) -> float:
    """Unbiased std of ``values`` plus ``eps``; 1 when fewer than two values or a std below 1e-6."""
    n = len(values)
    if n <= 1:
        return 1.0
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return (1.0 if std < 1e-6 else std) + eps


def turn_loo(rewards: Rewards, gamma: float = 1.0, eps: float = 1e-6, scale: str = "none") -> list[list[float]]:
    """Unbiased turn-level advantage: return-to-go minus a leave-one-out baseline, one scale per group.

    ``rewards``: per episode i, T_i per-turn rewards r_{i,t}; returns the same shape.
    G_{i,t} = Σ_{k≥t} γ^{k−t} r_{i,k};  R_t = {j ≠ i : T_j > t} (the other episodes still running at t);
    b_{i,t} = mean_{j∈R_t} G_{j,t}, or 0 when R_t is empty (plain REINFORCE on that turn);
    A_{i,t} = (G_{i,t} − b_{i,t}) / σ with σ = 1 (``scale="none"``, the default: exactly unbiased, in reward
    units like ``rloo``) or the unbiased std of every G_{j,t} of the group plus ``eps`` (``scale="std"``; a std
    below 1e-6 counts as 1; σ depends on episode i itself, a small bias in small groups).
    b_{i,t} is a function of the other, independent episodes only, so E[∇log π(a_{i,t}|s_{i,t})·b_{i,t}] = 0
    and the expected gradient is the policy gradient (derivation: docs/estimators.md).
    """
    check_finite(rewards)
    if scale not in ("std", "none"):
        raise ValueError(f"turn_loo: scale must be 'std' or 'none', got {scale!r}")
    returns = [discounted(ep, gamma) for ep in rewards]
    horizon = max((len(g) for g in returns), default=0)
    sums, counts = [0.0] * horizon, [0] * horizon
    for g in returns:
        for t, x in enumerate(g):
            sums[t] += x
            counts[t] += 1
    centred = [[x - ((sums[t] - x) / (counts[t] - 1) if counts[t] > 1 else 0.0) for t, x in enumerate(g)]
               for g in returns]
    sigma = _group_scale([x for g in returns for x in g], eps) if scale == "std" else 1.0
    return [[a / sigma for a in row] for row in centred]


def rloo(rewards: Rewards, gamma: float = 1.0, eps: float = 1e-6) -> list[list[float]]:
    """REINFORCE leave-one-out on episode totals, on every turn (TRL's ``RLOOTrainer`` and verl's
    ``compute_rloo_outcome_advantage``).

    R_i = Σ_t r_{i,t}; A_i = R_i − mean_{j≠i} R_j, not divided by a std (TRL's ``normalize_advantages``
    defaults to False; verl has no std). A group of one gets 0, as TRL (verl keeps the raw total there).
    ``gamma`` and ``eps`` are unused (verl's RLOO takes an epsilon it does not use either).
    """
    check_finite(rewards)
    totals = [sum(ep) for ep in rewards]
    n, total = len(totals), sum(totals)
    adv = [r - (total - r) / (n - 1) for r in totals] if n > 1 else [0.0] * n
    return [[a] * len(ep) for a, ep in zip(adv, rewards, strict=True)]


def _centre(values: Sequence[float], mode: str, eps: float, single_mean: float | None) -> list[float]:
    """verl-agent's group normalisation: x − mean (``mean_norm``) or (x − mean)/(std + eps); a lone value
    has std 1 and mean ``single_mean`` (0 for the episode term, the value itself for the step term)."""
    n = len(values)
    if n == 1:
        mean, std = (values[0] if single_mean is None else single_mean), 1.0
    else:
        mean = sum(values) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return [v - mean if mode == "mean_norm" else (v - mean) / (std + eps) for v in values]


def gigpo(rewards: Rewards, gamma: float = GIGPO_GAMMA, eps: float = 1e-6, states: Sequence[Sequence[Any]] | None = None,
          omega: float = GIGPO_OMEGA, mode: str = "mean_norm") -> list[list[float]]:
    """GiGPO (verl-agent ``gigpo/core_gigpo.py``): A_{i,t} = A^E_i + ω·A^S_{i,t}.

    ``rewards``: per episode, its per-turn rewards; ``states``: the same shape, a hashable anchor-state key
    per turn (None: every turn its own state, so A^S = 0 and GiGPO is its episode term).
    Episode term: R_i = Σ_t r_{i,t} is put on each of the episode's T_i turns and centred (``mean_norm``) or
    z-scored (``mean_std_norm``) over all the group's turns, so a long episode weighs more in the mean
    (verl-agent's ``compute_mean_std_cross_steps=True``). Step term: G_{i,t} = Σ_{k≥t} γ^{k−t} r_{i,k},
    centred (or z-scored) within the turns of the group that share s_{i,t}; a state seen once gets 0.
    """
    check_finite(rewards)
    if mode not in GIGPO_MODES:
        raise ValueError(f"gigpo: mode must be one of {GIGPO_MODES}, got {mode!r}")
    if states is not None and [len(s) for s in states] != [len(ep) for ep in rewards]:
        raise ValueError("gigpo: states must have the shape of rewards (one state key per turn)")
    turns = [(i, t) for i, ep in enumerate(rewards) for t in range(len(ep))]
    totals = [sum(ep) for ep in rewards]
    episode = _split(_centre([totals[i] for i, _ in turns], mode, eps, 0.0) if turns else [], rewards)
    returns = [discounted(ep, gamma) for ep in rewards]
    step = [[0.0] * len(ep) for ep in rewards]
    if states is not None:
        groups: dict[Any, list[tuple[int, int]]] = {}
        for i, t in turns:
            groups.setdefault(states[i][t], []).append((i, t))
        for members in groups.values():
            for (i, t), a in zip(members, _centre([returns[i][t] for i, t in members], mode, eps, None), strict=True):
                step[i][t] = a
    return [[e + omega * s for e, s in zip(er, sr, strict=True)] for er, sr in zip(episode, step, strict=True)]


# ------------------------------------------------------------------ VinePPO, EGPO (FunRL)


def vine(rewards: Rewards, gamma: float = 1.0, eps: float = 1e-6,
         mc: Sequence[Sequence[float | None]] | None = None) -> list[list[float]]:
    """VinePPO's advantage: Â_t = Q̂(s_t, a_t) − V̂(s_t) from branched continuations of each turn
    (:mod:`turngym.agents.branching`), given as ``mc`` (the shape of ``rewards``); a turn without a value
    (its replay differed from the record) gets 0. The estimate is of the env's own return, not of
    ``rewards``: the reward is not used. ``gamma``/``eps`` are accepted for the common signature."""
    check_finite(rewards)
    if mc is None:
        raise ValueError("vine needs Monte-Carlo advantages (mc=...): the trainer branches every episode "
                         "(estimator 'vine'); see turngym.agents.branching")
    if [len(m) for m in mc] != [len(r) for r in rewards]:
        raise ValueError("vine: mc must have the shape of rewards (one advantage per turn)")
    return [[0.0 if a is None or not math.isfinite(a) else float(a) for a in row] for row in mc]


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
