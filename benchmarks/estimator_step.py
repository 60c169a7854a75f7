"""Training-step time of every advantage estimator vs ``grpo`` on the same replayed batch (goal <= 1.05x;
``vine`` excepted, whose cost is its branched rollouts: reported as rollout time with and without them).

Each arm is a TurnGRPOTrainer step on one fixed generation batch (8 Calculator-v0 episodes from a tiny
model, replayed through ``rollout_func``), so the difference is the estimator and what feeds it (GiGPO's
anchor states). Arms alternate; medians reported. ``vine`` is measured as one rollout call (generation
included) with ``rollouts`` continuations per prefix, against the same call without branching.
Usage: python benchmarks/estimator_step.py [--steps 20] [--repeats 3]
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ESTIMATORS = ("grpo", "turn", "igpo_separate", "turn_loo", "rloo", "gigpo")


def rollout_seconds(bench, estimator: str, options: dict) -> float:
    tr = bench.turn_trainer(estimator, range(64))
    tr.estimator_options = dict(options)
    start = time.perf_counter()
    tr._rollout([tr.train_dataset[0]["prompt"]] * 8, tr)
    return time.perf_counter() - start


def main() -> None:
    from bench_setup import alternate, replay_batch, step_args

    args = step_args(__doc__)
    bench = replay_batch(args.steps, probe_estimator="grpo")
    print(bench.describe(), flush=True)
    med = alternate({est: (lambda e=est: bench.turn_step_time(e)) for est in ESTIMATORS}, args.repeats)
    for est in ESTIMATORS:
        print(f"{est:>14}: {med[est] * 1000:7.1f} ms per step, {med[est] / med['grpo']:.3f}x grpo", flush=True)
    roll = alternate({"rollout": lambda: rollout_seconds(bench, "grpo", {}),
                      "rollout + vine (2 per prefix)": lambda: rollout_seconds(bench, "vine", {"rollouts": 2})},
                     args.repeats)
    base = roll["rollout"]
    for name, s in roll.items():
        print(f"{name:>30}: {s:.2f} s per rollout call, {s / base:.2f}x", flush=True)


if __name__ == "__main__":
    main()
