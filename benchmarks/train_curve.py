"""Reward over training on Digits-v0 (right behaviour known: reply with digits) with a tiny random
model on CPU, per-turn advantages (`turn` estimator, outcome reward). Writes a CSV and a PNG.
Usage: python benchmarks/train_curve.py [--steps 60] [--out docs/train_curve.png]
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def train(steps: int, seed: int = 0, estimator: str = "turn") -> list[dict]:
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
                      learning_rate=3e-3, save_strategy="no", seed=seed, temperature=1.0, beta=0.0)
    tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: DigitsEnv(max_turns=2),
                         reward=get_reward("outcome"), args=args, train_dataset=task_dataset(range(1000)),
                         estimator=estimator, max_episode_tokens=48, stop=())
    tr.train()
    return [h for h in tr.state.log_history if "turngym/outcome" in h]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default="docs/train_curve.png")
    args = ap.parse_args()
    start = time.perf_counter()
    hist = train(args.steps)
    wall = time.perf_counter() - start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_suffix(".csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["step", "outcome"])
        for h in hist:
            w.writerow([h["step"], h["turngym/outcome"]])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in hist]
    vals = [h["turngym/outcome"] for h in hist]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(steps, vals, lw=1, alpha=0.5, label="batch mean")
    k = 5
    smooth = [sum(vals[max(0, i - k + 1):i + 1]) / len(vals[max(0, i - k + 1):i + 1]) for i in range(len(vals))]
    ax.plot(steps, smooth, lw=2, label=f"{k}-step mean")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("outcome (digit share)")
    ax.set_title("Digits-v0, tiny random model, CPU, turn advantages")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    first, last = sum(vals[:10]) / 10, sum(vals[-10:]) / 10
    print(f"{len(vals)} steps in {wall:.0f} s; mean outcome first 10 steps {first:.3f}, last 10 steps {last:.3f}; plot {out}")


if __name__ == "__main__":
    main()
