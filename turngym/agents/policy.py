"""The Policy protocol: batched generation with stop strings, returning text, ids and logprobs.

Backends differ in what they can condition on. Token-level backends (local transformers,
vLLM's completions endpoint) take ``prompt_ids`` and return the sampled ids, which is
what the token invariant needs for training. Chat-only APIs take ``messages`` and may
return no ids; episodes from them are fine for evaluation but not for training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self.stop = tuple(self.stop)


@dataclass
class GenerationRequest:
    """One conversation to continue: token ids when the backend takes them, else messages/text."""

    prompt_ids: list[int] | None = None
    messages: list[dict[str, str]] | None = None
    prompt_text: str | None = None
    max_new_tokens: int | None = None  # per-request cap (context budget), below the sampling one
    tools: list[dict[str, Any]] | None = None  # tool schemas for chat backends (native tool calling)
    json_schema: dict[str, Any] | None = None  # servers with structured output: constrain the reply to it


@dataclass
class Generation:
    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"  # "stop" (eos or stop string) | "length"
    meta: dict[str, Any] = field(default_factory=dict)


class PolicyError(RuntimeError):
    """A backend failed in a way the caller should report (server down, bad model)."""


@runtime_checkable
class Policy(Protocol):
    name: str
    tokenizer: Any  # a transformers tokenizer, or None for text-only backends
    max_context: int | None

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        """Continue every request in one batched call; results in request order."""
        ...


def trim_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut ``text`` just after the earliest stop string (the stop string is kept)."""
    best = -1
    best_stop = ""
    for s in stop:
        if not s:
            continue
        i = text.find(s)
        if i >= 0 and (best < 0 or i < best):
            best, best_stop = i, s
    if best < 0:
        return text, False
    return text[: best + len(best_stop)], True
