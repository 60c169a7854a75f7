"""Helpers for driving verl's own machinery on CPU in tests and benchmarks (imported by tests/verl/conftest.py)."""

from __future__ import annotations

import asyncio
import os

import numpy as np


def verl_config(model: str, *overrides: str):
    """verl's PPO config with ``overrides`` (hydra syntax), composed from the installed verl's own YAML."""
    import verl.trainer
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.trainer.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=[f"actor_rollout_ref.model.path={model}",
                                                  "actor_rollout_ref.rollout.name=vllm", *overrides])


def rows(items, k: int, **extra):
    """verl's generation batch for ``items`` played ``k`` times each (one uid per item, as verl repeats rows)."""
    from verl.protocol import DataProto

    n = len(items) * k
    return DataProto.from_dict(non_tensors={
        "raw_prompt": np.array([[{"role": "user", "content": "(the env writes the prompt)"}]] * n, dtype=object),
        "extra_info": np.array([{"index": i, **extra} for i in items for _ in range(k)], dtype=object),
        "uid": np.array([f"uid-{i}" for i in items for _ in range(k)], dtype=object),
    })


def generate(worker, batch):
    return asyncio.run(worker.generate_sequences(batch))
