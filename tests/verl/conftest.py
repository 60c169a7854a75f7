"""verl's own machinery on CPU: the run config composed from verl's ``ppo_trainer.yaml`` (as ``main_ppo`` composes
it), verl's ``AgentLoopWorker`` and a real tiny local model answering its ``generate`` (no hub, no GPU, no Ray).
These tests run in verl's own environment (``scripts/setup_verl.sh`` builds ``.venv-verl``)."""

from __future__ import annotations

import os

import pytest
from verl_harness import verl_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_dir():
    from turngym.agents.tiny import tiny_model_dir

    return str(tiny_model_dir(chat=True))


@pytest.fixture(scope="session")
def tiny_policy(tiny_dir):
    from turngym.agents.loading import load_hf_policy

    return load_hf_policy(tiny_dir, dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def make_worker(tiny_dir, tiny_policy):
    """An ``AgentLoopWorker`` on verl's config with ``overrides``, its generate answered by the tiny model."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    import turngym.integrations.verl  # noqa: F401 - registers the agent loop and the estimators
    from turngym.integrations.verl.server import PolicyServerClient

    def make(*overrides: str):
        cfg = verl_config(tiny_dir, "actor_rollout_ref.rollout.agent.default_agent_loop=turngym", *overrides)
        return AgentLoopWorker(cfg, PolicyServerClient(cfg, tiny_policy)), cfg

    return make
