"""The Policy contract: batched generation with stop strings, returning text, ids and logprobs.

Backends differ in what they can condition on. Token-level backends (local transformers,
vLLM's completions endpoint) take ``prompt_ids`` and return the sampled ids, which is
what the token invariant needs for training. Chat-only APIs take ``messages`` and may
return no ids; episodes from them are fine for evaluation but not for training.

What a policy offers beyond ``generate`` is declared, never probed: :class:`Policy` names every
member a caller may read, and :class:`PolicyBase` gives the optional ones their defaults, so a
backend states its capabilities (``supports_stream``, ``supports_score``) as class attributes and
the runner, the Monte-Carlo oracle and the LLM judge read them. ``turngym.agents.checker.check_policy``
refuses a policy whose declaration and members disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable


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


# feed(free_slots) -> up to that many new (key, request) pairs; [] when none wait
Feed = Callable[[int], list[tuple[Hashable, GenerationRequest]]]
# deliver(key, generation) -> the same key's next request, or None when that key is done
Deliver = Callable[[Hashable, Generation], GenerationRequest | None]
# prepare(replies): the (key, generation) pairs that landed together, before any is delivered (the runner announces
# their env steps, so remote envs get them in one round of messages)
Prepare = Callable[[Sequence[tuple[Hashable, Generation]]], None]


@runtime_checkable
class Policy(Protocol):
    """Every member a caller may read on a policy; :class:`PolicyBase` supplies the optional ones.

    Required: ``name`` (recorded in every episode), ``tokenizer`` (a transformers tokenizer; None for a
    text-only backend, which then gets ``messages`` or ``prompt_text`` requests instead of token ids) and
    ``generate``. Declared, with defaults: ``max_context`` (the context window the runner keeps each
    episode within; None: no limit known), ``prompt_format`` (without a tokenizer: ``"chat"`` messages
    or ``"text"``, a base model's plain transcript), and the capabilities:

    * ``supports_stream``: :meth:`stream` runs the runner's continuous decode loop
      (``batching="continuous"``); without it the method refuses;
    * ``supports_score``: the weights are in this process, as ``model`` (a transformers causal LM) next to
      ``tokenizer``, so a caller can score given text by the model's own log-probabilities (the LLM
      judge's constrained choice).
    """

    name: str
    tokenizer: Any
    max_context: int | None
    prompt_format: str
    supports_stream: bool
    supports_score: bool

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        """Continue every request in one batched call; results in request order."""
        ...

    def stream(self, feed: Feed, deliver: Deliver, sampling: SamplingParams, max_rows: int,
               prepare: Prepare | None = None) -> Any:
        """Decode up to ``max_rows`` requests at once, ``deliver`` each reply as it ends and take the next
        request in its place, until ``feed`` and every delivered key give no more. Replies that land together
        are first handed to ``prepare`` (where given), all of them, before any is delivered."""
        ...


class PolicyBase:
    """The defaults of the optional :class:`Policy` members; a backend subclasses it and overrides what it offers.

    A subclass sets ``name`` and ``tokenizer`` (instance fields or class attributes) and implements
    :meth:`generate`; one that implements :meth:`stream` sets ``supports_stream = True``, one whose
    ``model`` attribute is an in-process transformers model sets ``supports_score = True``.
    """

    name: str
    tokenizer: Any
    max_context: int | None = None
    prompt_format: str = "chat"
    supports_stream: ClassVar[bool] = False
    supports_score: ClassVar[bool] = False

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        raise NotImplementedError(f"{type(self).__name__} implements no generate()")

    def stream(self, feed: Feed, deliver: Deliver, sampling: SamplingParams, max_rows: int,
               prepare: Prepare | None = None) -> Any:
        raise PolicyError(f"{type(self).__name__} declares no stream (supports_stream=False): use batching='static'")


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


def restore_stop(text: str, stop: Sequence[str]) -> str:
    """The text with the stop string a spec-following server dropped put back.

    Only where the text itself shows which one fired: a closing tag ``</x>`` whose opening
    ``<x>`` is the last tag left open. Text that already holds a stop string, or that names
    no open tag, is returned unchanged (an action without its closing tag fails to parse,
    which the env reports).
    """
    if any(s and s in text for s in stop):
        return text
    best, best_pos = None, -1
    for s in stop:
        if s.startswith("</") and s.endswith(">"):
            opener = "<" + s[2:]
            pos = text.rfind(opener)
            if pos > best_pos and s not in text[pos:]:
                best, best_pos = s, pos
    return text + best if best is not None else text
