"""Set-up shared by the benchmark scripts (run as ``python benchmarks/NAME.py``, which puts this folder on
the path): the policy the rollout benchmarks play, and the replayed generation batch the trainer-step
benchmarks train on, so arms differ only in what each benchmark measures."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def load_bench_policy(model: str) -> tuple[Any, str]:
    """``tiny`` (a random 256-wide, 4-layer chat model, float32) or a model name/directory, on CPU;
    with the prompt style it takes (``chat`` when its tokenizer has a chat template)."""
    from turngym.agents.loading import load_hf_policy
    from turngym.agents.tiny import tiny_model_dir

    if model == "tiny":
        policy = load_hf_policy(str(tiny_model_dir(chat=True, hidden_size=256, num_layers=4)), dtype="float32", device="cpu")
    else:
        policy = load_hf_policy(model, device="cpu")
    return policy, "chat" if getattr(policy.tokenizer, "chat_template", None) else "base"


def step_args(doc: str | None) -> argparse.Namespace:
    """``--steps`` (training steps per arm) and ``--repeats`` (alternating rounds)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    return ap.parse_args()


@dataclass
class ReplayBatch:
    """One generation batch of 8 Calculator-v0 episodes from a tiny chat model, replayed through
    ``rollout_func`` by every arm so a step's time leaves generation out."""

    model_dir: str
    tokenizer: Any
    steps: int
    batch: dict[str, Any]
    episodes: list

    def config(self) -> Any:
        from trl import GRPOConfig

        return GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8, num_generations=8,
                          max_completion_length=64, max_steps=self.steps, logging_steps=1000, report_to="none",
                          use_cpu=True, learning_rate=1e-5, save_strategy="no", seed=0, disable_tqdm=True)

    def fresh_model(self) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        return AutoModelForCausalLM.from_pretrained(self.model_dir)

    def turn_trainer(self, estimator: str, dataset_rows: Any) -> Any:
        from turngym.envs.calculator import CalculatorEnv
        from turngym.rewards import get_reward
        from turngym.training.trainer import TurnGRPOTrainer, task_dataset

        return TurnGRPOTrainer(model=self.fresh_model(), processing_class=self.tokenizer,
                               env_factory=lambda: CalculatorEnv(max_turns=3), reward=get_reward("outcome"),
                               args=self.config(), train_dataset=task_dataset(dataset_rows), estimator=estimator,
                               stop=(" ",))

    def turn_step_time(self, estimator: str) -> float:
        """Seconds per training step of TurnGRPOTrainer with ``estimator``, on the replayed batch."""
        tr = self.turn_trainer(estimator, [0] * 64)

        def replay(prompts, trainer):
            tr._batch_episodes = self.episodes
            return self.batch

        tr.rollout_func = replay
        return seconds_per_step(tr, self.steps)

    def describe(self) -> str:
        return (f"batch: 8 episodes, {sum(len(e.turns) for e in self.episodes)} turns, "
                f"{sum(len(c) for c in self.batch['completion_ids'])} completion tokens")


def replay_batch(steps: int, probe_estimator: str = "turn") -> ReplayBatch:
    """Generates the batch once, with a probe trainer, for ``steps``-step arms."""
    from transformers import AutoTokenizer

    from turngym.agents.tiny import tiny_model_dir

    d = str(tiny_model_dir(chat=True, hidden_size=256, num_layers=4))
    bench = ReplayBatch(d, AutoTokenizer.from_pretrained(d), steps, {}, [])
    probe = bench.turn_trainer(probe_estimator, range(64))
    bench.batch = probe._rollout([probe.train_dataset[0]["prompt"]] * 8, probe)
    bench.episodes = probe._batch_episodes
    return bench


def seconds_per_step(trainer: Any, steps: int) -> float:
    start = time.perf_counter()
    trainer.train()
    return (time.perf_counter() - start) / steps


def alternate(arms: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Runs the arms in turn, ``repeats`` rounds, and returns each one's median."""
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(repeats):
        for name, arm in arms.items():
            times[name].append(arm())
    return {name: statistics.median(t) for name, t in times.items()}


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def free_port() -> int:
    """A TCP port on the loopback nobody listens on (for a server a benchmark starts)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pids_of(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (e.g. a Ray cluster's own temp folder), to stop or kill
    exactly the processes a benchmark or test started."""
    import contextlib
    from pathlib import Path

    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (p / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(p.name))
    return out


def wait_up(port: int, proc: Any, what: str, timeout_s: float = 120) -> None:
    """Until ``proc`` (a server a benchmark started) accepts connections on ``port``; exits if it dies."""
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the {what} exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the {what} did not come up")
