"""Training-step time with the `egpo` estimator vs `grpo` on the same tiny model and batch.

EGPO adds one no-gradient forward pass per batch (the policy's token entropies) and the clipped
entropy term. Both arms replay one fixed generation batch through `rollout_func`, so the ratio is
that cost against a whole training step (generation excluded). Arms alternate; medians reported.
Usage: python benchmarks/egpo_overhead.py [--steps 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from turngym.agents.tiny import tiny_model_dir
    from turngym.training.trainer import TurnGRPOTrainer, task_dataset
    from turngym.envs.calculator import CalculatorEnv
    from turngym.rewards import get_reward

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    d = str(tiny_model_dir(chat=True, hidden_size=256, num_layers=4))
    tok = AutoTokenizer.from_pretrained(d)

    def cfg():
        return GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, num_generations=8,
                          max_completion_length=64, max_steps=args.steps, logging_steps=1000, report_to="none",
                          use_cpu=True, learning_rate=1e-5, save_strategy="no", seed=0, disable_tqdm=True)

    def fresh_model():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_pretrained(d)

    env = lambda: CalculatorEnv(max_turns=3)  # noqa: E731
    probe = TurnGRPOTrainer(model=fresh_model(), processing_class=tok, env_factory=env, reward=get_reward("outcome"),
                            args=cfg(), train_dataset=task_dataset(range(64)), estimator="grpo", stop=(" ",))
    batch = probe._rollout([probe.train_dataset[0]["prompt"]] * 8, probe)
    episodes = probe._batch_episodes
    print(f"batch: 8 episodes, {sum(len(e.turns) for e in episodes)} turns, "
          f"{sum(len(c) for c in batch['completion_ids'])} completion tokens")

    def step_time(estimator: str) -> float:
        tr = TurnGRPOTrainer(model=fresh_model(), processing_class=tok, env_factory=env, reward=get_reward("outcome"),
                             args=cfg(), train_dataset=task_dataset([0] * 64), estimator=estimator, stop=(" ",))

        def replay(p, t):
            tr._batch_episodes = episodes
            return batch

        tr.rollout_func = replay
        start = time.perf_counter()
        tr.train()
        return (time.perf_counter() - start) / args.steps

    egpo, grpo = [], []
    for _ in range(args.repeats):
        grpo.append(step_time("grpo"))
        egpo.append(step_time("egpo"))
    e, g = statistics.median(egpo), statistics.median(grpo)
    print(f"step time: egpo {e * 1000:.1f} ms, grpo {g * 1000:.1f} ms, ratio {e / g:.3f}x")


if __name__ == "__main__":
    main()
