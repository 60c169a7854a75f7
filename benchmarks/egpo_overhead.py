"""Training-step time with the `egpo` estimator vs `grpo` on the same tiny model and batch.

EGPO adds one no-gradient forward pass per batch (the policy's token entropies) and the clipped
entropy term. Both arms replay one fixed generation batch through `rollout_func`, so the ratio is
that cost against a whole training step (generation excluded). Arms alternate; medians reported.
Usage: python benchmarks/egpo_overhead.py [--steps 20] [--repeats 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def main() -> None:
    from bench_setup import alternate, replay_batch, step_args

    args = step_args(__doc__)
    bench = replay_batch(args.steps, probe_estimator="grpo")
    print(bench.describe())
    med = alternate({"grpo": lambda: bench.turn_step_time("grpo"), "egpo": lambda: bench.turn_step_time("egpo")},
                    args.repeats)
    e, g = med["egpo"], med["grpo"]
    print(f"step time: egpo {e * 1000:.1f} ms, grpo {g * 1000:.1f} ms, ratio {e / g:.3f}x")


if __name__ == "__main__":
    main()
