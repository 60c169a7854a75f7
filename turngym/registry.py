"""Registries of interchangeable parts: names mapped to ``"module:attribute"`` entry points.

An entry is imported only when it is first used, so a registry never imports its
implementations (no import cycles, and a light part does not pull in a heavy one's
dependencies). A name is registered once: a second registration is refused, never a silent
overwrite.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any


class Registry(Mapping):
    """``kind``: what the parts are, for messages. Maps each name to its entry (a path or a callable)."""

    def __init__(self, kind: str, entries: Mapping[str, str | Callable[..., Any]] = ()):
        self.kind = kind
        self._entries: dict[str, str | Callable[..., Any]] = {}
        for name, entry in dict(entries).items():
            self.register(name, entry)

    def register(self, name: str, entry: str | Callable[..., Any]) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered (as {self._entries[name]!r}); "
                             "choose another name")
        if isinstance(entry, str) and entry.count(":") != 1:
            raise ValueError(f"{self.kind} {name!r}: an entry point is 'module:attribute', got {entry!r}")
        self._entries[name] = entry

    def load(self, name: str) -> Callable[..., Any]:
        """The callable registered under ``name``, its module imported now if given by path."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {sorted(self._entries)}")
        from turngym.extras import NEEDS, require

        if (part := f"the {self.kind} {name!r}") in NEEDS:
            require(part)  # an optional install it needs is said by name, before its import fails
        return resolve(self._entries[name])

    def __getitem__(self, name: str) -> str | Callable[..., Any]:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def resolve(entry: str | Callable[..., Any]) -> Callable[..., Any]:
    """``"module:attribute"`` imported and looked up; a callable returned as it is."""
    if not isinstance(entry, str):
        return entry
    module, _, attr = entry.partition(":")
    return getattr(importlib.import_module(module), attr)
