"""Gradient validity of advantage estimators against an exact oracle (``turngym creditbench --oracle exact``).

For each setting (a small MDP and a tabular softmax policy, :mod:`turngym.envs.credit_mdps`) the exact policy
gradient g is known (:func:`turngym.oracles.mdp.solve`). An estimator's expected gradient ĝ is measured
by sampling ``batches`` independent batches of B episodes, splitting each batch into groups of G
(default: the whole batch is one group), applying the estimator to each group's per-turn rewards and
taking ĝ_b = (1/B) Σ_i Σ_t ∇_θ log π(a_{i,t}|s_{i,t})·Â_{i,t}; ĝ = mean_b ĝ_b. Reported:

- ``cosine``: cos(ĝ, g), scale-free; an unbiased estimator tends to 1 as batches are added, a floor
  below 1 is bias (Monte-Carlo error alone shrinks like 1/√(batches·B)).
- ``rel_error``: ‖ĝ − g‖/‖g‖ in the estimator's own units (only meaningful for unscaled estimators).
- ``rel_variance``: mean_b ‖ĝ_b − ĝ‖² / ‖ĝ‖² (scale-free).
- ``sign_accuracy``: share of turns with A^π ≠ 0 whose credit has A^π's sign (scale-free).
- ``leakage``: mean |Â| on turns with A^π = 0 over mean |Â| on turns with A^π ≠ 0 (scale-free); turns
  with a single legal action are left out (no choice, no credit question).
- ``turn_bias``: per turn t, mean(κ·Â − A^π) with κ = ⟨ĝ, g⟩/‖ĝ‖² (one scale per estimator that maps
  ĝ onto g's length, so a normalisation scale is undone); ``rel_bias`` = max_t |turn_bias_t| / RMS(A^π).

Follows AgentCreditBench's gradient-validity protocol (github hectopascal/agent-credit-bench, MIT).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from turngym.envs import credit_mdps as envs
from turngym.oracles.mdp import ExactValues, TabularMDP, Trajectories, sample, solve
from turngym.training.advantages import ESTIMATORS as REGISTERED
from turngym.training.advantages import get_estimator

# every estimator registered by entry point that the oracle can feed: it has rewards and states, not branched
# continuations (egpo runs as its base advantage: the entropy term needs a policy); a function registered at run time
# (an --external one) is scored when named
ESTIMATORS = tuple(n for n, spec in REGISTERED.items() if isinstance(spec.function, str) and "branches" not in spec.needs)
ORACLE = "oracle"  # A^π as the credit


@dataclass(frozen=True)
class Setting:
    name: str
    mdp: TabularMDP
    logits: np.ndarray = field(repr=False)


def settings(policy_seed: int = 0, policy_scale: float = 0.5) -> list[Setting]:
    """The four settings: each MDP under a fixed random softmax policy (logits ~ N(0, policy_scale²))."""
    mdps = [("delayed_effect", envs.delayed_effect()), ("recovery", envs.recovery()),
            ("variable_horizon", envs.variable_horizon()),
            ("variable_horizon_dense", envs.variable_horizon(continue_rewards=(0.4, -0.3, 0.6, -0.2)))]
    rng = np.random.default_rng(policy_seed)
    return [Setting(name, m, rng.normal(0.0, policy_scale, m.num_params)) for name, m in mdps]


@dataclass
class Row:
    setting: str
    estimator: str
    batch_size: int
    group_size: int
    batches: int
    cosine: float | None
    rel_error: float | None
    rel_variance: float | None
    sign_accuracy: float | None
    leakage: float | None
    rel_bias: float | None
    turn_bias: list[float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def credits(traj: Trajectories, estimator: str, group_size: int, options: dict[str, Any] | None = None,
            exact: ExactValues | None = None) -> np.ndarray:
    """The estimator's per-turn credit for every sampled turn, groups of ``group_size`` consecutive episodes;
    ``"oracle"`` is A^π itself (from ``exact``), the reference an estimator should match."""
    if estimator == ORACLE:
        return np.where(traj.node >= 0, exact.a[np.maximum(traj.node, 0), traj.action], 0.0)
    est = get_estimator(estimator)
    out = np.zeros(traj.reward.shape)
    n = len(traj.length)
    for start in range(0, n, group_size):
        rows = slice(start, min(start + group_size, n))
        kw = dict(options or {})
        if "states" in est.needs:
            kw["states"] = traj.states(rows)
        for j, a in enumerate(est(traj.rewards(rows), **kw), start=start):
            out[j, :len(a)] = a
    return out


def batch_gradients(mdp: TabularMDP, exact: ExactValues, traj: Trajectories, credit: np.ndarray,
                    batch_size: int) -> np.ndarray:
    """ĝ_b for each batch b of ``batch_size`` consecutive episodes: shape (batches, num_params)."""
    n_batches = len(traj.length) // batch_size
    j, t = np.nonzero(traj.node >= 0)
    s, a, c = traj.node[j, t], traj.action[j, t], credit[j, t]
    width = exact.probs.shape[1]
    score = -exact.probs[s] * c[:, None]  # c·(e_a − π(·|s))
    score[np.arange(len(s)), a] += c
    offsets = mdp.offsets
    n_act = np.array([len(nd.actions) for nd in mdp.nodes])
    cols = offsets[s][:, None] + np.arange(width)[None, :]
    keep = np.arange(width)[None, :] < n_act[s][:, None]
    grads = np.zeros((n_batches, mdp.num_params))
    b = np.broadcast_to((j // batch_size)[:, None], cols.shape)
    np.add.at(grads, (b[keep], cols[keep]), score[keep])
    return grads / batch_size


def _cos(x: np.ndarray, y: np.ndarray) -> float | None:
    nx, ny = np.linalg.norm(x), np.linalg.norm(y)
    return None if nx == 0 or ny == 0 else float(x @ y / (nx * ny))


def evaluate(setting: Setting, estimator: str, batch_size: int, batches: int, group_size: int | None = None,
             seed: int = 0, options: dict[str, Any] | None = None) -> Row:
    """One row of the gradient-validity table (see the module docstring for the metrics)."""
    g_size = batch_size if group_size is None else group_size
    if g_size < 1 or batch_size % g_size:
        raise ValueError(f"batch size {batch_size} is not a multiple of the group size {g_size}")
    mdp = setting.mdp
    exact = solve(mdp, setting.logits)
    traj = sample(mdp, setting.logits, batch_size * batches, np.random.default_rng(seed))
    credit = credits(traj, estimator, g_size, options, exact)
    grads = batch_gradients(mdp, exact, traj, credit, batch_size)
    g, g_hat = exact.gradient, grads.mean(axis=0)
    norm_hat = float(g_hat @ g_hat)
    j, t = np.nonzero(traj.node >= 0)
    s, a, c = traj.node[j, t], traj.action[j, t], credit[j, t]
    true = exact.a[s, a]
    choice = np.array([len(nd.actions) > 1 for nd in mdp.nodes])[s]
    nonzero = np.abs(true) > 1e-9
    zero = ~nonzero & choice
    sign = float(np.mean(np.sign(c[nonzero]) == np.sign(true[nonzero]))) if nonzero.any() else None
    scale_nz = float(np.mean(np.abs(c[nonzero]))) if nonzero.any() else 0.0
    leak = float(np.mean(np.abs(c[zero])) / scale_nz) if zero.any() and scale_nz > 0 else None
    kappa = float(g_hat @ g) / norm_hat if norm_hat > 0 else 0.0
    turn_bias = [float(np.mean(kappa * c[t == k] - true[t == k])) for k in range(mdp.horizon) if (t == k).any()]
    rms = float(np.sqrt(np.mean(true ** 2)))
    return Row(setting.name, estimator, batch_size, g_size, batches, _cos(g_hat, g),
               float(np.linalg.norm(g_hat - g) / np.linalg.norm(g)),
               float(np.mean(np.sum((grads - g_hat) ** 2, axis=1)) / norm_hat) if norm_hat > 0 else None,
               sign, leak, max(abs(x) for x in turn_bias) / rms if rms > 0 else None, turn_bias)


def run_exact(batch_sizes: Sequence[int] = (4, 32, 256), batches: int = 200, group_size: int | None = None,
              estimators: Sequence[str] = ESTIMATORS, seed: int = 0, policy_seed: int = 0,
              out_dir: str | Path | None = None) -> dict[str, Any]:
    """Every estimator × setting × batch size; written to ``out_dir`` as exact.json and exact.md when given."""
    start = time.perf_counter()
    rows = []
    for st in settings(policy_seed):
        for b in batch_sizes:
            for est in estimators:  # the same seed: every estimator sees the same episodes
                rows.append(evaluate(st, est, b, batches, group_size, seed=seed + 7919 * b))
    summary = {"config": {"batch_sizes": list(batch_sizes), "batches": batches, "group_size": group_size,
                          "seed": seed, "policy_seed": policy_seed, "estimators": list(estimators),
                          "settings": {st.name: st.mdp.description for st in settings(policy_seed)}},
               "rows": [r.to_dict() for r in rows], "wall_s": round(time.perf_counter() - start, 2)}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "exact.json").write_text(json.dumps(summary, indent=1))
        (out / "exact.md").write_text(markdown(summary))
    return summary


def _f(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def markdown(summary: dict[str, Any]) -> str:
    c = summary["config"]
    group = "the whole batch" if c["group_size"] is None else str(c["group_size"])
    lines = ["# Gradient validity against the exact oracle", "",
             f"{c['batches']} batches per batch size, groups of {group}, seed {c['seed']}, policy seed "
             f"{c['policy_seed']}. cos = cos(ĝ, g); rel. err = ‖ĝ − g‖/‖g‖ (estimator's own units); rel. var = "
             "mean ‖ĝ_b − ĝ‖²/‖ĝ‖²; sign = sign accuracy on turns with A^π ≠ 0; leak = mean |Â| on A^π = 0 turns "
             "over mean |Â| elsewhere; rel. bias = max_t |mean(κÂ − A^π)| / RMS(A^π), κ fitted on the gradient.", ""]
    for name, desc in c["settings"].items():
        lines += [f"## {name}", "", f"{desc}.", "",
                  "| estimator | B | cos | rel. err | rel. var | sign | leak | rel. bias |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in summary["rows"]:
            if r["setting"] == name:
                lines.append(f"| {r['estimator']} | {r['batch_size']} | {_f(r['cosine'], 4)} | {_f(r['rel_error'])} | "
                             f"{_f(r['rel_variance'])} | {_f(r['sign_accuracy'])} | {_f(r['leakage'])} | "
                             f"{_f(r['rel_bias'])} |")
        lines.append("")
    return "\n".join(lines)
