"""What credit does to training: learning curves under each advantage estimator, with exact returns.

Tabular softmax policies on the exact-oracle MDPs (``turngym.oracles``: DelayedEffect, Recovery,
VariableHorizon with and without dense per-turn rewards) are trained by policy-gradient ascent
whose per-turn credit is each registered estimator's advantage on sampled groups (the same
computation ``TurnGRPOTrainer`` applies per token), plus ``oracle`` (the exact A^π: the ceiling).
The policy's expected return J(θ) is computed exactly after every step, so a curve has no
evaluation noise: only the estimator's. Each step takes one group of ``--group`` episodes and a
normalised gradient step (θ += lr·ĝ/‖ĝ‖), so estimators are compared on the direction of their
gradient, not its scale (z-scored and raw returns differ in scale by construction).

Per setting × estimator: the mean J over ``--seeds`` seeds at every step with a 95% interval
(t over seeds), the final J (mean of the last 10 steps), and the steps until the curve first closes
90% of the gap between the start policy's J and the optimal J*. Writes CSV, JSON, a markdown table
and one PNG (all to ``--out``).

``--trainer-steps N`` adds the same comparison through ``TurnGRPOTrainer`` itself: a tiny random
chat model on Digits-v0 (two turns; reply with digits), trained with the outcome reward (the mean digit
share, on the last turn) or the env's per-turn rewards (``env``: each turn's digit share), under
several estimators, ``--trainer-seeds`` seeds each; the mean outcome per step with a 95% interval.

Usage: python benchmarks/credit_learning.py [--steps 300] [--seeds 40] [--seed-start 0] [--holdout-seeds 10]
       [--group 8] [--out docs]
       [--trainer-steps 30 --trainer-seeds 5]
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np

from turngym.credit.exact_oracle import ORACLE, batch_gradients, credits, settings
from turngym.oracles.mdp import TabularMDP, sample, solve

CSV_EVERY = 5
KEEP_MARKER = "<!-- written by hand below: kept when the table above is rewritten -->"  # the LM section
ESTIMATORS = ("turn", "igpo_separate", "igpo_siop", "igpo", "turn_loo", "grpo", "rloo", "gigpo", ORACLE)


def optimal_value(mdp: TabularMDP) -> float:
    """J* of the MDP: backward induction with a max over actions."""
    v = np.zeros(len(mdp.nodes))
    for i in range(len(mdp.nodes) - 1, -1, -1):
        v[i] = max(sum(o.prob * (o.reward + (v[o.next] if o.next is not None else 0.0)) for o in outs)
                   for outs in mdp.nodes[i].outcomes)
    return float(v[mdp.start])


def curve(mdp: TabularMDP, start: np.ndarray, estimator: str, steps: int, group: int, lr: float, seed: int) -> np.ndarray:
    """J(θ_k) for k = 0..steps under one estimator and seed."""
    rng = np.random.default_rng(seed)
    theta = start.copy()
    out = np.empty(steps + 1)
    for k in range(steps + 1):
        exact = solve(mdp, theta)
        out[k] = exact.v[mdp.start]
        if k == steps:
            break
        traj = sample(mdp, theta, group, rng)
        g = batch_gradients(mdp, exact, traj, credits(traj, estimator, group, exact=exact), group)[0]
        norm = float(np.linalg.norm(g))
        if norm > 0:
            theta += lr * g / norm
    return out


def t_quantile(n: int) -> float:
    """t(0.975, n − 1): the two-sided 95% quantile for a mean over n seeds."""
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1)) if n > 1 else 0.0


def seed_steps_to_90(curve_j: np.ndarray, j_star: float) -> int | None:
    """The first step at which one seed's curve closes 90% of the gap from its start J to J*."""
    reached = np.nonzero(curve_j >= curve_j[0] + 0.9 * (j_star - curve_j[0]))[0]
    return int(reached[0]) if len(reached) else None


def summarise(curves: np.ndarray, j_star: float, seeds: list[int], holdout: np.ndarray | None = None) -> dict:
    """Per step: the mean J and its 95% interval (t over seeds). Per arm: the final J (mean of the last 10 steps)
    with the 95% interval of its mean and the range a new seed lands in (the lowest and highest final J over the
    n seeds: a distribution-free prediction interval of coverage (n − 1)/(n + 1), 95.1% at 40 seeds, which holds
    when the finals are bimodal, as a stuck seed makes them); steps until the mean curve first closes 90% of the
    gap; and the stuck seeds: those whose own curve never closes 90% of it. ``holdout``: the final J of seeds not
    used for the interval, and how many of them it covers."""
    n = curves.shape[0]
    t = t_quantile(n)
    mean = curves.mean(axis=0)
    half = t * curves.std(axis=0, ddof=1) / np.sqrt(n) if n > 1 else np.zeros_like(mean)
    target = mean[0] + 0.9 * (j_star - mean[0])
    reached = np.nonzero(mean >= target)[0]
    finals = curves[:, -10:].mean(axis=1)
    per_seed = [seed_steps_to_90(c, j_star) for c in curves]
    out = {"mean": mean.tolist(), "half": half.tolist(), "final": float(finals.mean()),
           "final_half": float(t * finals.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
           "new_seed_range": [float(finals.min()), float(finals.max())],
           "prediction_coverage": (n - 1) / (n + 1),
           "steps_to_90": int(reached[0]) if len(reached) else None,
           "seed_median_steps_to_90": float(np.median([k for k in per_seed if k is not None])) if any(
               k is not None for k in per_seed) else None,
           "stuck": [{"seed": s, "final": round(float(f), 4)} for s, f, k in zip(seeds, finals, per_seed, strict=True)
                     if k is None]}
    if holdout is not None:
        lo, hi = out["new_seed_range"]
        out["holdout_finals"] = [round(float(f), 4) for f in holdout]
        out["holdout_covered"] = int(sum(lo - 1e-9 <= f <= hi + 1e-9 for f in holdout))
    return out


TRAINER_ARMS = (("outcome", "grpo"), ("outcome", "turn"), ("env", "turn"), ("env", "turn_loo"))


def trainer_curve(reward: str, estimator: str, steps: int, seed: int) -> list[float]:
    """Digits-v0 outcome per step of TurnGRPOTrainer (tiny random chat model, 8 rollouts per step)."""
    import os
    import tempfile

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from turngym.agents.tiny import tiny_model_dir
    from turngym.envs.digits import DigitsEnv
    from turngym.rewards import get_reward
    from turngym.training.trainer import TurnGRPOTrainer, task_dataset

    d = str(tiny_model_dir(chat=True))
    torch.manual_seed(seed)
    model, tok = AutoModelForCausalLM.from_pretrained(d), AutoTokenizer.from_pretrained(d)
    args = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, num_generations=8,
                      max_completion_length=24, max_steps=steps, logging_steps=1, report_to="none", use_cpu=True,
                      learning_rate=3e-3, save_strategy="no", seed=seed, temperature=1.0, beta=0.0, disable_tqdm=True)
    tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: DigitsEnv(max_turns=2),
                         reward=get_reward(reward), args=args, train_dataset=task_dataset(range(1000)),
                         estimator=estimator, max_episode_tokens=48, stop=())
    tr.train()
    return [h["turngym/outcome"] for h in tr.state.log_history if "turngym/outcome" in h][:steps]


def run_trainer_arms(steps: int, seeds: int, out: Path) -> dict:
    results = {}
    for reward, est in TRAINER_ARMS:
        curves = np.stack([np.asarray(trainer_curve(reward, est, steps, seed)) for seed in range(seeds)])
        n = curves.shape[0]
        mean = curves.mean(axis=0)
        t = t_quantile(n)
        half = t * curves.std(axis=0, ddof=1) / np.sqrt(n) if n > 1 else np.zeros_like(mean)
        last = curves[:, -5:].mean(axis=1)
        results[f"{reward} + {est}"] = {"mean": mean.tolist(), "half": half.tolist(), "final": float(last.mean()),
                                       "final_half": float(t * last.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
                                       "first": float(curves[:, :3].mean())}
        r = results[f"{reward} + {est}"]
        print(f"Digits-v0 {reward:>7} + {est:<9}: outcome {r['first']:.3f} (first 3 steps) -> {r['final']:.3f} "
              f"± {r['final_half']:.3f} (last 5)", flush=True)
    (out / "credit_learning_trainer.json").write_text(json.dumps({"steps": steps, "seeds": seeds, "arms": results}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for name, a in results.items():
        m, h = np.asarray(a["mean"]), np.asarray(a["half"])
        ax.plot(np.arange(len(m)), m, label=name, linewidth=1.3)
        ax.fill_between(np.arange(len(m)), m - h, m + h, alpha=0.15)
    ax.set_xlabel("training step")
    ax.set_ylabel("Digits-v0 outcome (mean digit share)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "credit_learning_trainer.png", dpi=110)
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--seed-start", type=int, default=0, help="the first seed (seeds are seed-start .. seed-start+seeds-1)")
    ap.add_argument("--holdout-seeds", type=int, default=10,
                    help="seeds after those, left out of the intervals, to check what a new seed gives (0: none)")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.3)
    ap.add_argument("--out", default="docs")
    ap.add_argument("--trainer-steps", type=int, default=0, help="also train a tiny model on Digits-v0 (0: skip)")
    ap.add_argument("--trainer-seeds", type=int, default=5)
    ap.add_argument("--skip-tabular", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.trainer_steps:
        run_trainer_arms(args.trainer_steps, args.trainer_seeds, out)
    if args.skip_tabular:
        return
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    held = list(range(seeds[-1] + 1, seeds[-1] + 1 + args.holdout_seeds))
    results: dict = {"steps": args.steps, "seeds": seeds, "holdout_seeds": held, "group": args.group, "lr": args.lr,
                     "settings": {}}
    start_time = time.perf_counter()
    for setting in settings():
        j_star = optimal_value(setting.mdp)
        row = {"j_star": j_star, "j_start": float(solve(setting.mdp, setting.logits).v[setting.mdp.start]), "arms": {}}
        for est in ESTIMATORS:
            def run(seed_list, est=est, mdp=setting.mdp, logits=setting.logits):
                return np.stack([curve(mdp, logits, est, args.steps, args.group, args.lr, seed) for seed in seed_list])
            holdout = run(held)[:, -10:].mean(axis=1) if held else None
            row["arms"][est] = summarise(run(seeds), j_star, seeds, holdout)
            a = row["arms"][est]
            lo, hi = a["new_seed_range"]
            print(f"{setting.name:>24} {est:>14}: final J {a['final']:.3f} ± {a['final_half']:.3f} "
                  f"(a new seed: {lo:.3f}..{hi:.3f}; J* {j_star:.3f}), steps to 90% {a['steps_to_90']}, "
                  f"stuck {len(a['stuck'])}/{len(seeds)}"
                  + (f", held-out seeds covered {a['holdout_covered']}/{len(held)}" if held else "")
                  + f"  [{time.perf_counter() - start_time:.0f} s]", flush=True)
        results["settings"][setting.name] = row
    summary = {**results, "settings": {name: {**row, "arms": {e: {k: v for k, v in a.items() if k not in ("mean", "half")}
                                                                for e, a in row["arms"].items()}}
                                       for name, row in results["settings"].items()}}
    (out / "credit_learning.json").write_text(json.dumps(summary, indent=1))
    with (out / "credit_learning.csv").open("w", newline="") as fh:  # the curves, every CSV_EVERY steps
        w = csv.writer(fh)
        w.writerow(["setting", "estimator", "step", "mean_return", "ci95_half"])
        for name, row in results["settings"].items():
            for est, a in row["arms"].items():
                for k, (m, h) in enumerate(zip(a["mean"], a["half"], strict=True)):
                    if k % CSV_EVERY == 0 or k == len(a["mean"]) - 1:
                        w.writerow([name, est, k, f"{m:.4f}", f"{h:.4f}"])
    lines = table_lines(results)
    md = out / "credit_learning.md"
    kept = md.read_text().partition(KEEP_MARKER) if md.exists() else ("", "", "")
    md.write_text("\n".join(lines) + "\n" + (f"\n{KEEP_MARKER}{kept[2]}" if kept[1] else ""))
    print("\n".join(lines))
    plot(results, out / "credit_learning.png")


def cell(a: dict) -> str:
    """final ± interval of the mean [the range a new seed lands in] (steps to 90%; stuck seeds)."""
    lo, hi = a["new_seed_range"]
    steps = a["steps_to_90"] if a["steps_to_90"] is not None else "—"
    if a.get("seed_median_steps_to_90") is not None and a["stuck"]:
        steps = f"{steps}, median seed {a['seed_median_steps_to_90']:.0f}"
    stuck = f"; {len(a['stuck'])} stuck" if a["stuck"] else ""
    return f"{a['final']:.3f} ± {a['final_half']:.3f} [{lo:.2f}, {hi:.2f}] ({steps}{stuck})"


def table_lines(results: dict) -> list[str]:
    seeds, held = results["seeds"], results["holdout_seeds"]
    n = len(seeds)
    lines = [f"Steps {results['steps']}, {n} seeds ({seeds[0]}–{seeds[-1]}), groups of {results['group']}, normalised "
             f"steps of {results['lr']}. Each cell: final J (mean of the last 10 steps) ± the 95% interval of its mean "
             f"over seeds; in brackets the range a new seed lands in (lowest to highest final J of the {n} seeds, "
             f"coverage {(n - 1) / (n + 1):.1%}); in parentheses the steps until the mean curve first closes 90% of the "
             "gap from the start policy's J to J* (where seeds are stuck, also the median over the seeds that close "
             "it), and the stuck seeds (whose own curve never closes 90% of it).", "",
             "| setting | J start → J* | " + " | ".join(ESTIMATORS) + " |",
             "|---|---|" + "---|" * len(ESTIMATORS)]
    for name, row in results["settings"].items():
        lines.append(f"| {name} | {row['j_start']:.3f} → {row['j_star']:.3f} | "
                     + " | ".join(cell(row["arms"][e]) for e in ESTIMATORS) + " |")
    if held:
        covered = sum(a["holdout_covered"] for row in results["settings"].values() for a in row["arms"].values())
        total = len(held) * sum(len(row["arms"]) for row in results["settings"].values())
        lines += ["", f"Held-out seeds {held[0]}–{held[-1]} (not used above): {covered} of {total} final J values "
                      f"({covered / total:.1%}) fall in their arm's new-seed range."]
    stuck = [f"{name} {e}: " + (f"all {len(seeds)} seeds" if len(a["stuck"]) == len(seeds) else
                                "seeds " + ", ".join(f"{s['seed']} (J {s['final']:.2f})" for s in a["stuck"]))
             for name, row in results["settings"].items() for e, a in row["arms"].items() if a["stuck"]]
    if stuck:
        lines += ["", "Stuck seeds: " + "; ".join(stuck) + "."]
    return lines


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["settings"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        row = results["settings"][name]
        for est, a in row["arms"].items():
            m, h = np.asarray(a["mean"]), np.asarray(a["half"])
            x = np.arange(len(m))
            style = "--" if est in ("turn", "igpo_separate") else ":" if est == ORACLE else "-"
            ax.plot(x, m, style, label=est, linewidth=1.3)
            ax.fill_between(x, m - h, m + h, alpha=0.15)
        ax.axhline(row["j_star"], color="black", linewidth=0.6)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("exact expected return J(θ)")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
