"""Training-step time with per-turn advantages (TurnGRPOTrainer, `turn` estimator) vs stock TRL
GRPOTrainer on the same tiny model and the same batch (goal <= 1.05x).

Both trainers replay one fixed generation batch through `rollout_func`, so the difference
measured is what turngym adds around TRL's step: gathering episodes, scoring groups turn by
turn, the estimator and the (batch, tokens) advantage tensor. Arms alternate; medians reported.
Usage: python benchmarks/trainer_step.py [--steps 20] [--repeats 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def main() -> None:
    from trl import GRPOTrainer

    from bench_setup import alternate, replay_batch, seconds_per_step, step_args
    from turngym.training.trainer import task_dataset

    args = step_args(__doc__)
    bench = replay_batch(args.steps, probe_estimator="turn")
    print(bench.describe())

    def stock_step_time() -> float:
        tr = GRPOTrainer(model=bench.fresh_model(), processing_class=bench.tokenizer, args=bench.config(),
                         reward_funcs=[lambda prompts, completions, turngym_outcome, **kw: list(turngym_outcome)],
                         train_dataset=task_dataset([0] * 64), rollout_func=lambda p, t: bench.batch)
        return seconds_per_step(tr, args.steps)

    med = alternate({"stock": stock_step_time, "ours": lambda: bench.turn_step_time("turn")}, args.repeats)
    o, s = med["ours"], med["stock"]
    print(f"step time: turngym turn advantages {o * 1000:.1f} ms, stock TRL GRPO {s * 1000:.1f} ms, ratio {o / s:.3f}x")


if __name__ == "__main__":
    main()
