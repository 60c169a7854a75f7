"""Sandbox backends by name: an env asks for ``sandbox="local"`` (the default),
``"local:rlimits-only"`` or ``"sandboxfusion:URL"``, and gets one shared instance per process,
spec and limits."""

from __future__ import annotations

import threading
from collections.abc import Callable

from turngym.sandbox.base import CodeSandbox, SandboxLimits


def _local(arg: str, limits: SandboxLimits) -> CodeSandbox:
    from turngym.sandbox.local import SandboxPool

    return SandboxPool(size=2, limits=limits, isolation=arg or "auto")


def _sandboxfusion(arg: str, limits: SandboxLimits) -> CodeSandbox:
    from turngym.sandbox.fusion import SandboxFusion

    if not arg:
        raise ValueError("sandbox 'sandboxfusion' needs the server's URL: sandbox='sandboxfusion:http://HOST:PORT'")
    return SandboxFusion(arg, limits)


# name -> factory(argument after the first ':', limits)
BACKENDS: dict[str, Callable[[str, SandboxLimits], CodeSandbox]] = {
    "local": _local,
    "sandboxfusion": _sandboxfusion,
}

_LOCK = threading.Lock()
_SHARED: dict[tuple[str, SandboxLimits], CodeSandbox] = {}


def parse_spec(spec: str) -> tuple[str, str]:
    """``"name"`` or ``"name:argument"``, with the name checked against :data:`BACKENDS`."""
    name, _, arg = spec.partition(":")
    if name not in BACKENDS:
        raise ValueError(f"unknown sandbox {spec!r}; use one of {sorted(BACKENDS)} "
                         "(e.g. 'local', 'local:rlimits-only', 'sandboxfusion:http://127.0.0.1:8080')")
    return name, arg


def make_sandbox(spec: str, limits: SandboxLimits | None = None) -> CodeSandbox:
    """A new sandbox for ``spec``; the caller closes it."""
    name, arg = parse_spec(spec)
    return BACKENDS[name](arg, limits or SandboxLimits())


def shared_sandbox(spec: str = "local", limits: SandboxLimits | None = None) -> CodeSandbox:
    """One sandbox per process, spec and limits, shared by every env that asks for it (a local
    pool keeps its workers warm for all of them)."""
    limits = limits or SandboxLimits()
    parse_spec(spec)
    with _LOCK:
        if (spec, limits) not in _SHARED:
            _SHARED[(spec, limits)] = make_sandbox(spec, limits)
        return _SHARED[(spec, limits)]
