"""Code sandboxes for tool-using envs: a protocol (:mod:`.base`), backends chosen by name
(:mod:`.registry`): the local bubblewrap pool (:mod:`.local`, confinement in :mod:`.isolation`)
and a SandboxFusion server (:mod:`.fusion`)."""

from typing import Any

from turngym.sandbox.base import CodeSandbox, CodeSession, ExecResult, SandboxError, SandboxLimits
from turngym.sandbox.registry import BACKENDS, make_sandbox, shared_sandbox

_LOCAL = ("SandboxPool", "SandboxSession")


def __getattr__(name: str) -> Any:
    """The local pool needs the ``[math]`` extra (psutil), so it loads when first named: the run pipeline
    imports this package's protocol (``SandboxError``) on a core install too."""
    if name in _LOCAL:
        from turngym.sandbox import local

        return getattr(local, name)
    raise AttributeError(f"module 'turngym.sandbox' has no attribute {name!r}")

__all__ = ["BACKENDS", "CodeSandbox", "CodeSession", "ExecResult", "SandboxError", "SandboxLimits", "SandboxPool",
           "SandboxSession", "make_sandbox", "shared_sandbox"]
