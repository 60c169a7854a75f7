"""What every code sandbox backend shares: the limits a cell runs under, the result it returns,
and the two small protocols MathCode depends on (a sandbox hands out sessions; a session runs
cells in one stateful interpreter).

Branching needs nothing more: :func:`turngym.envs.base.restore` resets the env and replays the
recorded actions, so a restored branch re-runs its cells in a fresh session of whichever backend
the env uses, and flags any observation that comes out differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: float = 10.0
    memory_bytes: int = 1 << 30
    processes: int = 64
    file_bytes: int = 16 << 20
    open_files: int = 64
    max_output: int = 4000
    session_cpu_s: int = 3600
    recursion: int = 3000
    startup_s: float = 30.0
    tree_memory_bytes: int = 1 << 30  # the cgroup cap: all processes and tmpfs pages of one worker
    disk_bytes: int = 64 << 20  # size of each private tmpfs (working directory, /tmp, /dev/shm)


@dataclass
class ExecResult:
    status: str  # "ok" | "error" | "timeout" | "crashed"
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    truncated: bool = False
    elapsed_s: float = 0.0
    restarted: bool = False  # the interpreter was replaced: earlier variables are gone

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def render(self, max_chars: int | None = None) -> str:
        """What an agent sees: output, then the error, with truncation marked."""
        parts = [self.stdout]
        if self.stderr.strip():
            parts.append(self.stderr)
        if self.error:
            parts.append(self.error)
        text = "\n".join(p.rstrip("\n") for p in parts if p)
        if max_chars is not None and len(text) > max_chars:
            text = text[:max_chars]
            self.truncated = True
        if self.truncated:
            text += "\n... [output truncated]"
        if self.restarted:
            text += "\n[the interpreter was restarted; variables from earlier cells are gone]"
        return text


class SandboxError(RuntimeError):
    pass


def check_code(code: object) -> ExecResult | None:
    """The error result for a cell no backend should run (not text, or a null byte), else None."""
    if not isinstance(code, str):
        return ExecResult(status="error", error=f"TypeError: code must be text, got {type(code).__name__}")
    if "\x00" in code:
        return ExecResult(status="error", error="SyntaxError: source code contains a null byte")
    return None


@runtime_checkable
class CodeSession(Protocol):
    """One stateful interpreter: variables persist from cell to cell until ``close``."""

    def run(self, code: str, limits: SandboxLimits | None = None) -> ExecResult: ...

    def describe(self) -> dict:
        """What an episode records in ``meta["sandbox"]``: the backend, its isolation, the host uid."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class CodeSandbox(Protocol):
    """A source of sessions (a warm local pool, a remote service), shared by the envs of a process."""

    limits: SandboxLimits

    def session(self) -> CodeSession: ...

    def describe(self) -> dict: ...

    def close(self) -> None: ...
