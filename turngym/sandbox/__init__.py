"""Code sandboxes for tool-using envs: a protocol (:mod:`.base`), backends chosen by name
(:mod:`.registry`): the local bubblewrap pool (:mod:`.local`, confinement in :mod:`.isolation`)
and a SandboxFusion server (:mod:`.fusion`)."""

from turngym.sandbox.base import CodeSandbox, CodeSession, ExecResult, SandboxError, SandboxLimits
from turngym.sandbox.local import SandboxPool, SandboxSession
from turngym.sandbox.registry import BACKENDS, make_sandbox, shared_sandbox

__all__ = ["BACKENDS", "CodeSandbox", "CodeSession", "ExecResult", "SandboxError", "SandboxLimits", "SandboxPool",
           "SandboxSession", "make_sandbox", "shared_sandbox"]
