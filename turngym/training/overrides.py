"""Command-line overrides of a ``turngym train`` YAML config.

Two forms, applied in this order after the file is read:

- ``section.key=value`` for any part of the config (``reward.name=siop``, ``env.kwargs.max_turns=3``,
  ``trl.learning_rate=1e-6``, ``max_episode_tokens=512``); the value is read as JSON (numbers,
  ``true``/``false``/``null``, lists, objects) and otherwise kept as a string, as ``--env-arg`` does.
- TRL's own flags for ``GRPOConfig`` fields (``--learning_rate 1e-6``, ``--bf16``), parsed by TRL's
  parser (``transformers.HfArgumentParser`` over ``GRPOConfig``, the parser under ``trl.TrlParser``), so
  their types, choices and boolean forms are exactly those of TRL's scripts. They land in ``trl:``.

An unknown section, TRL field or flag is refused with one message before anything is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
from collections.abc import Sequence
from typing import Any


class OverrideError(ValueError):
    """A command-line override names no part of the config, or cannot be applied to it."""


@dataclasses.dataclass(frozen=True)
class Override:
    """One ``path=value`` assignment into the config (``path`` split at dots)."""

    path: tuple[str, ...]
    value: Any
    source: str  # the command-line text it came from, for messages


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def grpo_fields() -> set[str]:
    """The names ``GRPOConfig`` accepts (what ``trl:`` may hold)."""
    from trl import GRPOConfig

    return {f.name for f in dataclasses.fields(GRPOConfig) if f.init}


def _suggest(name: str, known: Sequence[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(known), n=3)
    return f"; did you mean {', '.join(prefix + c for c in close)}?" if close else ""


def _trl_flags(tokens: list[str]) -> tuple[list[Override], list[str]]:
    """TRL's flags among ``tokens``, parsed by TRL's parser; returns them and the tokens it left."""
    from transformers import HfArgumentParser
    from trl import GRPOConfig

    parser = HfArgumentParser(GRPOConfig, allow_abbrev=False)

    def refuse(message: str):  # argparse would print GRPOConfig's ~200-option usage before its message
        raise OverrideError(f"TRL flag: {message}")

    parser.error = refuse  # type: ignore[method-assign]
    for action in parser._actions:  # only what the command line names, not every GRPOConfig default
        action.default = argparse.SUPPRESS
        action.required = False
    parsed, rest = parser.parse_known_args(tokens)
    flags = [Override(("trl", name), value, f"--{name}") for name, value in vars(parsed).items()]
    return flags, rest


def parse_overrides(tokens: Sequence[str]) -> list[Override]:
    """``section.key=value`` tokens and TRL flags, in the order they are applied (TRL flags last)."""
    tokens = list(tokens)
    flags: list[Override] = []
    if any(t.startswith("-") for t in tokens):
        flags, tokens = _trl_flags(tokens)
    dotted = []
    for token in tokens:
        if token.startswith("-"):
            name = token.lstrip("-").split("=", 1)[0]
            raise OverrideError(f"unknown option {token.split('=', 1)[0]!r}: not a turngym train option nor a TRL "
                                f"GRPOConfig field{_suggest(name, sorted(grpo_fields()), '--')}")
        key, sep, text = token.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise OverrideError(f"override {token!r} must be section.key=value (e.g. trl.learning_rate=1e-6)")
        dotted.append(Override(tuple(key.split(".")), _value(text), token))
    return dotted + flags


def apply_overrides(cfg: Any, overrides: Sequence[Override]) -> None:
    """Sets each override on ``cfg`` (a config dataclass whose fields are the YAML's top-level keys)."""
    known = [f.name for f in dataclasses.fields(cfg)]
    trl_names: set[str] | None = None
    for o in overrides:
        head, rest = o.path[0], o.path[1:]
        if head not in known:
            raise OverrideError(f"override {o.source!r}: unknown key {head!r}; allowed: {sorted(known)}"
                                f"{_suggest(head, known)}")
        if head == "trl" and rest:
            trl_names = grpo_fields() if trl_names is None else trl_names
            if rest[0] not in trl_names:
                raise OverrideError(f"override {o.source!r}: {rest[0]!r} is not a TRL GRPOConfig field"
                                    f"{_suggest(rest[0], sorted(trl_names))}")
        if not rest:
            if isinstance(getattr(cfg, head), dict) and not isinstance(o.value, dict):
                raise OverrideError(f"override {o.source!r}: {head} must be a mapping (JSON object)")
            setattr(cfg, head, o.value)
            continue
        node = getattr(cfg, head)
        if node is None:  # an optional section absent from the file (e.g. peft)
            node = {}
            setattr(cfg, head, node)
        for i, part in enumerate(rest[:-1]):
            if not isinstance(node, dict):
                raise OverrideError(f"override {o.source!r}: {'.'.join(o.path[:i + 1])} is not a mapping")
            node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise OverrideError(f"override {o.source!r}: {'.'.join(o.path[:-1])} is not a mapping")
        node[rest[-1]] = o.value
