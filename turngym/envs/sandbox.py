"""Process-isolated Python execution with enforced limits, from a pool of warm workers.

A :class:`SandboxSession` is one stateful interpreter (variables persist across cells),
backed by a worker process started in advance by a :class:`SandboxPool`. Each cell runs
under wall-clock and CPU limits; the worker also has address-space, process-count,
file-size and open-file limits, a private working directory, a scrubbed environment and
closed stdin. Run as root (containers, CI), the worker additionally gets its own
network namespace (no network), a private ``/tmp`` and a throwaway uid, so it can
neither signal nor write into the host. After a timeout or a crash the worker and every
process it started are killed (the worker is their subreaper; a uid sweep catches the
rest) and the session gets a fresh interpreter.

Defaults (``SandboxLimits``): 10 s wall, 10 s CPU per cell, 1 GiB address space,
64 processes, 16 MiB per file, 64 open files, 4,000 characters of output per stream.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

WORKER_SCRIPT = Path(__file__).with_name("_sandbox_worker.py")
_UID_COUNTER = itertools.count()


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


def _sandbox_identity() -> tuple[int, int] | None:
    """A throwaway uid/gid for a worker when we are root (distinct per worker)."""
    if os.geteuid() != 0:
        return None
    base = int(os.environ.get("TURNGYM_SANDBOX_UID_BASE", "200000"))
    uid = base + (os.getpid() % 4096) * 64 + next(_UID_COUNTER) % 64
    return uid, uid


class _Worker:
    def __init__(self, limits: SandboxLimits, preload: tuple[str, ...]):
        self.limits = limits
        self.workdir = tempfile.mkdtemp(prefix="turngym-sandbox-")
        ident = _sandbox_identity()
        self.uid = ident[0] if ident else None
        if ident:
            os.chown(self.workdir, *ident)
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()
        cfg = {
            "workdir": self.workdir,
            "uid": ident[0] if ident else None,
            "gid": ident[1] if ident else None,
            "preload": list(preload),
            "limits": {
                "memory_bytes": limits.memory_bytes, "file_bytes": limits.file_bytes,
                "open_files": limits.open_files, "processes": limits.processes,
                "session_cpu_s": limits.session_cpu_s, "recursion": limits.recursion,
            },
        }
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.workdir,
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1"}
        # run the worker file without putting its folder on sys.path (it would shadow user imports)
        launcher = (f"import sys; sys.argv = ['worker', '{cmd_r}', '{res_w}', {json.dumps(cfg)!r}]; "
                    f"exec(compile(open({str(WORKER_SCRIPT)!r}).read(), {str(WORKER_SCRIPT)!r}, 'exec'), {{'__name__': '__main__'}})")
        args = [sys.executable, "-I", "-c", launcher]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=env, pass_fds=(cmd_r, res_w),
                                     start_new_session=True, cwd=self.workdir)
        os.close(cmd_r)
        os.close(res_w)
        self.ready: dict | None = None
        self._eof = False

    def wait_ready(self) -> dict:
        if self.ready is None:
            msg = self._recv(self.limits.startup_s)
            if not msg or not msg.get("ready"):
                self.kill()
                reason = (msg or {}).get("error", "worker exited during start-up")
                raise SandboxError(f"sandbox worker failed to start: {reason}")
            self.ready = msg
        return self.ready

    def execute(self, code: str, limits: SandboxLimits) -> ExecResult:
        self.wait_ready()
        try:
            self._send({"op": "exec", "code": code, "wall_s": limits.wall_s, "cpu_s": limits.cpu_s,
                        "max_output": limits.max_output})
        except (BrokenPipeError, OSError):
            return self._dead("the interpreter process had already exited")
        msg = self._recv(limits.wall_s + 2.0)
        if msg is None:
            if not self._eof and self.proc.poll() is None:  # stuck in C code past the in-process alarm
                self.kill()
                return ExecResult(status="timeout", error=f"TimeoutError: execution exceeded the time limit ({limits.wall_s:g} s); the interpreter was killed", restarted=True)
            return self._dead(None)
        return ExecResult(status=msg["status"], stdout=msg["stdout"], stderr=msg["stderr"], error=msg["error"],
                          truncated=msg["truncated"], elapsed_s=msg["elapsed_s"])

    def _dead(self, detail: str | None) -> ExecResult:
        rc = self.proc.wait(timeout=5) if self.proc.poll() is None else self.proc.returncode
        self.kill()
        if rc is not None and rc < 0:
            name = signal.Signals(-rc).name
            why = {"SIGSEGV": "a segmentation fault", "SIGXCPU": "the CPU time limit", "SIGKILL": "a kill signal",
                   "SIGXFSZ": "the file size limit", "SIGABRT": "an abort"}.get(name, name)
            detail = detail or f"the interpreter crashed ({why})"
        else:
            detail = detail or f"the interpreter exited (code {rc})"
        return ExecResult(status="crashed", error=f"SandboxCrash: {detail}", restarted=True)

    def _send(self, obj: dict) -> None:
        data = json.dumps(obj).encode()
        msg = struct.pack(">I", len(data)) + data
        while msg:
            msg = msg[os.write(self._cmd_w, msg):]

    def _recv(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        self._eof = False
        buf = b""
        need = 4
        header_done = False
        while len(buf) < need:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self._res_r], [], [], left)
            if not r:
                return None
            chunk = os.read(self._res_r, need - len(buf))
            if not chunk:  # the worker closed its end: it exited or crashed
                self._eof = True
                return None
            buf += chunk
            if not header_done and len(buf) == 4:
                need = 4 + struct.unpack(">I", buf)[0]
                header_done = True
        return json.loads(buf[4:].decode())

    def kill(self) -> None:
        """Kill the worker and everything it started, then remove its directory."""
        procs: list[psutil.Process] = []
        try:
            root = psutil.Process(self.proc.pid)
            procs = root.children(recursive=True) + [root]
        except psutil.NoSuchProcess:
            pass
        for _ in range(20):
            for p in procs:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            procs = _processes_of_uid(self.uid) if self.uid is not None else []
            if not procs:
                break
            time.sleep(0.02)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self._cmd_w, self._res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._cmd_w = self._res_r = -1
        shutil.rmtree(self.workdir, ignore_errors=True)

    def close(self) -> None:
        if self.proc.poll() is None and self._cmd_w >= 0:
            try:
                self._send({"op": "exit"})
            except OSError:
                pass
        self.kill()


def _processes_of_uid(uid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] and p.info["uids"].real == uid:
                out.append(p)
        except psutil.Error:
            pass
    return out


class SandboxSession:
    """One stateful interpreter; replaced transparently (and said so) after a crash."""

    def __init__(self, pool: "SandboxPool"):
        self.pool = pool
        self._worker: _Worker | None = pool._take()

    def run(self, code: str, limits: SandboxLimits | None = None) -> ExecResult:
        limits = limits or self.pool.limits
        if not isinstance(code, str):
            return ExecResult(status="error", error=f"TypeError: code must be text, got {type(code).__name__}")
        if "\x00" in code:
            return ExecResult(status="error", error="SyntaxError: source code contains a null byte")
        if self._worker is None:
            raise SandboxError("session is closed")
        restarted = False
        if self._worker.proc.poll() is not None:
            self._worker.kill()
            self._worker = self.pool._take()
            restarted = True
        result = self._worker.execute(code, limits)
        if result.restarted:  # the worker died or was killed: the next cell gets a fresh one
            self._worker.kill()
            self._worker = self.pool._take()
        result.restarted = result.restarted or restarted
        return result

    @property
    def capabilities(self) -> dict:
        return dict(self._worker.wait_ready().get("caps", {})) if self._worker else {}

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def __deepcopy__(self, memo: dict) -> "SandboxSession":
        return self  # a live process cannot be copied; copies of an env share its interpreter

    def __enter__(self) -> "SandboxSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


@dataclass
class SandboxPool:
    """Keeps ``size`` workers started in advance; ``session()`` hands one out and refills."""

    size: int = 2
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    preload: tuple[str, ...] = ("math", "fractions", "decimal", "itertools", "functools", "collections",
                                "statistics", "random", "re", "cmath", "numpy", "sympy")

    def __post_init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)  # idle workers' directories are removed on a normal exit too
        self._refill()

    def session(self) -> SandboxSession:
        return SandboxSession(self)

    def _take(self) -> _Worker:
        with self._lock:
            worker = self._idle.pop(0) if self._idle else None
        if worker is None:
            worker = _Worker(self.limits, self.preload)
        threading.Thread(target=self._refill, daemon=True).start()
        worker.wait_ready()
        return worker

    def _refill(self) -> None:
        while not self._closed:
            with self._lock:
                if len(self._idle) >= self.size:
                    return
            worker = _Worker(self.limits, self.preload)
            with self._lock:
                if self._closed:
                    worker.kill()
                    return
                self._idle.append(worker)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.close()

    def __deepcopy__(self, memo: dict) -> "SandboxPool":
        return self  # a pool of processes is a shared resource, not state to copy

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> dict:
        return {"size": self.size, "limits": asdict(self.limits)}
