"""Shared fixtures: tiny random models built locally (no hub), and a fake policy for unit tests."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_chat_policy():
    from turngym.agents.loading import load_hf_policy
    from turngym.agents.tiny import tiny_model_dir

    return load_hf_policy(str(tiny_model_dir(chat=True)), dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def tiny_plain_policy():
    from turngym.agents.loading import load_hf_policy
    from turngym.agents.tiny import tiny_model_dir

    return load_hf_policy(str(tiny_model_dir(chat=False)), dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def gemma_tokenizer():
    """The real Gemma 3 tokenizer from the default model package (converted once, cached)."""
    from transformers import AutoTokenizer

    from turngym.agents.loading import resolve_model_dir

    return AutoTokenizer.from_pretrained(resolve_model_dir("default"))


@dataclass
class FakeScriptedPolicy:
    """A fake policy for unit tests: replies with scripted texts, tokenised canonically."""

    tokenizer: object
    script: Sequence[str]
    name: str = "fake-scripted"
    max_context: int | None = None
    calls: list = field(default_factory=list)

    def generate(self, requests, sampling):
        from turngym.agents.policy import Generation

        out = []
        for req in requests:
            self.calls.append(list(req.prompt_ids))
            text = self.script[min(len(self.calls) - 1, len(self.script) - 1)]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(text=text, token_ids=ids, logprobs=[0.0] * len(ids)))
        return out
