"""Kernel-isolated Python execution with enforced limits, from a pool of warm workers.

A :class:`SandboxSession` is one stateful interpreter (variables persist across cells),
backed by a worker started in advance by a :class:`SandboxPool`, so a cell costs a pipe
round trip, not an interpreter start. Where the machine allows it each worker runs under
bubblewrap in its own user, PID, network, IPC and UTS namespaces with a read-only view of
the interpreter only, private size-capped tmpfs working directory, ``/tmp`` and
``/dev/shm``, and one cgroup capping memory and processes for the whole cell tree and frozen
between cells (see
:mod:`turngym.sandbox.isolation` for the levels; the pool's ``isolation`` says which
ran). Each cell runs under wall-clock and CPU limits; address-space, file-size and
open-file rlimits apply per process. The host talks only to a supervisor inside the
sandbox that the cell cannot reach; any malformed, forged or out-of-order frame ends the
session's worker with an error result, never an exception. After a timeout, a crash or a
protocol error the worker's whole namespace (and cgroup) is killed and the session gets a
fresh interpreter; no kill reaches another worker.

Defaults (``SandboxLimits``): 10 s wall, 10 s CPU per cell, 1 GiB address space per
process, 1 GiB memory and 64 processes for the whole tree, 64 MiB per tmpfs, 16 MiB per
file, 64 open files, 4,000 characters of output per stream.
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import os
import secrets
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

import turngym.sandbox.isolation as iso
from turngym.procs import spawn
from turngym.sandbox.base import ExecResult, SandboxError, SandboxLimits, check_code

WORKER_SCRIPT = Path(__file__).with_name("_worker.py")


@dataclass(frozen=True)
class Isolation:
    """The confinement a pool's workers get (one of ``isolation.LEVELS``), and why."""

    level: str
    bwrap: str | None = None
    cgroups: iso.CgroupParents | None = None
    note: str = ""

    def describe(self) -> dict:
        return {"isolation": self.level, "cgroup": self.cgroups.version if self.cgroups else None,
                "frozen_between_cells": self.cgroups is not None and (self.cgroups.version == "v2"
                                                                      or self.cgroups.freezer is not None),
                "seccomp": self.bwrap is not None and iso.seccomp_program() is not None, "note": self.note}


def choose_isolation(requested: str = "auto") -> Isolation:
    """The strongest level this machine allows (``auto``), or exactly the one asked for.

    ``rlimits-only`` is never chosen for you: it is limits and timeouts, not isolation, and only
    an ordinary user can opt in to it (as root it would run model code as host root)."""
    if requested not in ("auto", *iso.LEVELS):
        raise ValueError(f"isolation must be 'auto' or one of {iso.LEVELS}, got {requested!r}")
    if requested == iso.RLIMITS_ONLY:
        if os.geteuid() == 0:
            raise SandboxError("isolation 'rlimits-only' does not run as root: cells would run as host root. "
                               "Use bubblewrap (the default), or run turngym as an ordinary user")
        warnings.warn(RLIMITS_ONLY_WARNING, RuntimeWarning, stacklevel=3)
        print(f"turngym: {RLIMITS_ONLY_WARNING}", file=sys.stderr)
        return Isolation(iso.RLIMITS_ONLY, note="requested: rlimits and timeouts only, not isolation")
    bwrap = iso.bwrap_path()
    why = iso.bwrap_probe(bwrap) if bwrap else "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    if why:
        raise SandboxError(f"sandbox isolation {requested!r} needs bubblewrap, but bubblewrap cannot run here: {why}. "
                           "Install bubblewrap, or (as an ordinary user, for code you trust) opt in to "
                           "isolation='rlimits-only' (sandbox='local:rlimits-only'): limits and timeouts, not isolation")
    parents, cg_note = iso.cgroup_parents()
    if parents is not None:
        return Isolation(iso.BUBBLEWRAP_CGROUP, bwrap, parents, cg_note)
    if requested == iso.BUBBLEWRAP_CGROUP:
        raise SandboxError(f"sandbox isolation 'bubblewrap+cgroup' was requested but no cgroup can be created: {cg_note}")
    warnings.warn(f"sandbox: no cgroup can be created here ({cg_note}); memory and process caps are per process "
                  "(rlimits) and the tmpfs sizes, not one cap for the whole cell tree", RuntimeWarning, stacklevel=3)
    return Isolation(iso.BUBBLEWRAP, bwrap, None, cg_note)


RLIMITS_ONLY_WARNING = ("SANDBOX IS NOT ISOLATION: isolation 'rlimits-only' gives code cells time, CPU, memory, "
                        "file-size and process limits only; a cell can read and write what this user can, reach "
                        "the network and signal this user's processes. Use it only for code you trust.")


class ProtocolError(ValueError):
    """A frame from the worker that is not what the protocol allows."""


class _Worker:
    def __init__(self, limits: SandboxLimits, preload: tuple[str, ...], isolation: Isolation):
        self.limits = limits
        self.isolation = isolation
        self.cgroup: iso.WorkerCgroup | None = None
        self._uid: iso.UidClaim | None = None  # bubblewrap started by root: this worker's throwaway host uid
        self._cmd_w = self._res_r = -1
        self.ready: dict | None = None
        self._ready_lock = threading.Lock()
        self._eof = False
        sandboxed = isolation.bwrap is not None
        state = iso.host_state()
        self.workdir = iso.SANDBOX_WORKDIR if sandboxed else state.workdir()
        if os.geteuid() == 0 and sandboxed:  # never host root: this worker's own throwaway uid
            self._uid = iso.UidClaim()
        uid = self._uid.uid if self._uid else None
        self.host_uid = os.geteuid() if uid is None else uid
        cfg = {
            "workdir": self.workdir, "isolation": isolation.level,
            "preload": list(preload),
            "limits": {
                "memory_bytes": limits.memory_bytes, "file_bytes": limits.file_bytes,
                "open_files": limits.open_files, "processes": limits.processes,
                "session_cpu_s": limits.session_cpu_s, "recursion": limits.recursion,
            },
        }
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.workdir,
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "MPLBACKEND": "Agg"}
        prefix, staged = [], {}
        if sandboxed:
            try:
                prefix, staged = iso.identity_prefix(uid)
            except RuntimeError:
                self._release()
                raise
        cmd_r, self._cmd_w = os.pipe()
        os.set_blocking(self._cmd_w, False)  # a stopped supervisor must not stall the host (see _send)
        self._res_r, res_w = os.pipe()
        # -c: the worker's folder must not be on sys.path (it would shadow user imports)
        args = [iso.PYTHON, "-I", "-B", "-c", _worker_source(), str(cmd_r), str(res_w), json.dumps(cfg)]
        cwd = self.workdir
        pass_fds = [cmd_r, res_w]
        if sandboxed:
            filter_fd = iso.seccomp_fd()
            if filter_fd is not None:
                pass_fds.append(filter_fd)
            args = prefix + iso.bwrap_command(isolation.bwrap, limits.disk_bytes, filter_fd, staged=staged) + args
            cwd = None
        if isolation.cgroups is not None:
            self.cgroup = iso.WorkerCgroup(isolation.cgroups, f"turngym-{os.getpid()}-{os.urandom(6).hex()}",
                                           limits.tree_memory_bytes, limits.processes)
            state.record_cgroup(self.cgroup.dirs[0].name, self.cgroup.dirs)
            self._state = state
            # join the cgroup before bwrap starts, so every process of the worker is inside it
            join = " && ".join(f'echo $$ > "${i + 1}"' for i in range(len(self.cgroup.procs_files)))
            args = ["/bin/sh", "-c", f'{join} && shift {len(self.cgroup.procs_files)} && exec "$@"', "sh",
                    *self.cgroup.procs_files, *args]
        try:
            self.proc = spawn(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env, pass_fds=tuple(pass_fds), start_new_session=True, cwd=cwd)
        except BaseException:
            self._release()
            raise
        finally:
            for fd in pass_fds:
                os.close(fd)

    def wait_ready(self) -> dict:
        with self._ready_lock:  # a pool's warm-up check and a session may both wait
            return self._wait_ready()

    def _wait_ready(self) -> dict:
        if self.ready is None:
            try:
                msg = self._recv(self.limits.startup_s)
            except ProtocolError as exc:
                msg = {"error": str(exc)}
            if not msg or msg.get("ready") is not True or not isinstance(msg.get("caps"), dict):
                self.kill()
                reason = (msg or {}).get("error", "worker exited during start-up")
                raise SandboxError(f"sandbox worker failed to start: {reason}")
            self.ready = msg
        return self.ready

    def execute(self, code: str, limits: SandboxLimits) -> ExecResult:
        """Run one cell; between cells the worker's cgroup is frozen where the kernel allows it."""
        self.wait_ready()
        self._freeze(False)
        result = self._execute(code, limits)
        if not result.restarted:
            self._freeze(True)
        return result

    def _freeze(self, frozen: bool) -> None:
        if self.cgroup is not None:
            try:
                self.cgroup.freeze(frozen)
            except OSError:
                pass  # a worker that cannot be frozen still runs; its leftovers die at its next cell

    def _execute(self, code: str, limits: SandboxLimits) -> ExecResult:
        nonce = secrets.token_hex(16)
        try:
            self._send({"op": "exec", "nonce": nonce, "code": code, "wall_s": limits.wall_s, "cpu_s": limits.cpu_s,
                        "max_output": limits.max_output}, limits.wall_s + 2.0)
        except TimeoutError:
            self.kill()
            return ExecResult(status="timeout", restarted=True,
                              error="TimeoutError: the sandbox stopped reading the cell within the time limit "
                                    f"({limits.wall_s:g} s); the interpreter was killed")
        except OSError:
            return self._dead("the interpreter process had already exited")
        try:
            msg = self._recv(limits.wall_s + 2.0, max_output=limits.max_output)
            if msg is not None:
                return self._result(msg, nonce, limits)
        except ProtocolError as exc:
            self.kill()
            return ExecResult(status="error", restarted=True,
                              error=f"SandboxProtocolError: {exc}; the interpreter was replaced")
        if not self._eof and self.proc.poll() is None:  # stuck in C code past the in-process alarm
            self.kill()
            return ExecResult(status="timeout", restarted=True,
                              error=f"TimeoutError: execution exceeded the time limit ({limits.wall_s:g} s); "
                                    "the interpreter was killed")
        return self._dead(None)

    def _result(self, msg: dict, nonce: str, limits: SandboxLimits) -> ExecResult:
        """Check a reply frame completely; anything unexpected is a ProtocolError."""
        if msg.get("nonce") != nonce:
            raise ProtocolError("a reply for another request")
        if "crashed" in msg or "protocol_error" in msg:
            oom = self.cgroup is not None and self.cgroup.oom_kills() > 0
            self.kill()
            if "crashed" in msg:
                why = str(msg["crashed"])[:500] + ("; the memory cap of the cell's process tree was hit" if oom else "")
                return ExecResult(status="crashed", error=f"SandboxCrash: {why}", restarted=True)
            return ExecResult(status="error", restarted=True,
                              error=f"SandboxProtocolError: {str(msg['protocol_error'])[:500]}; the interpreter was replaced")
        fields = {"nonce": str, "status": str, "stdout": str, "stderr": str, "error": (str, type(None)),
                  "truncated": bool, "elapsed_s": float, "restart": bool}
        if set(msg) != set(fields) or not all(isinstance(msg[k], t) for k, t in fields.items()):
            raise ProtocolError("a reply with missing, extra or wrongly typed fields")
        if msg["status"] not in ("ok", "error", "timeout"):
            raise ProtocolError(f"a reply with an unknown status {msg['status'][:40]!r}")
        if not (math.isfinite(msg["elapsed_s"]) and 0.0 <= msg["elapsed_s"] <= limits.wall_s + 2.0):
            raise ProtocolError(f"a reply with an impossible elapsed time {msg['elapsed_s']!r}")
        return ExecResult(status=msg["status"], stdout=msg["stdout"][: limits.max_output],
                          stderr=msg["stderr"][: limits.max_output], error=msg["error"],
                          truncated=msg["truncated"], elapsed_s=msg["elapsed_s"], restarted=msg["restart"])

    def _dead(self, detail: str | None) -> ExecResult:
        rc = self.proc.wait(timeout=5) if self.proc.poll() is None else self.proc.returncode
        self.kill()
        if rc is not None and rc < 0:
            detail = detail or f"the interpreter crashed ({signal.Signals(-rc).name})"
        else:
            detail = detail or f"the interpreter exited (code {rc})"
        return ExecResult(status="crashed", error=f"SandboxCrash: {detail}", restarted=True)

    def _send(self, obj: dict, timeout: float) -> None:
        """Write one frame within ``timeout`` seconds, else TimeoutError: a cell can stop the
        supervisor (it is the same uid inside the sandbox), and a full pipe must not hang the host."""
        data = json.dumps(obj).encode()
        msg = memoryview(struct.pack(">I", len(data)) + data)
        deadline = time.monotonic() + timeout
        while msg:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [self._cmd_w], [], left)[1]:
                raise TimeoutError(f"the worker read no command for {timeout:g} s")
            try:
                msg = msg[os.write(self._cmd_w, msg):]
            except BlockingIOError:
                continue

    def _recv(self, timeout: float, max_output: int = 0) -> dict | None:
        """One frame as a dict; None on timeout or end of stream; ProtocolError if malformed."""
        deadline = time.monotonic() + timeout
        self._eof = False
        limit = (1 << 20) + 40 * max_output  # stdout, stderr, error: max_output characters each, JSON-escaped
        buf, need, header_done = b"", 4, False
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
                if need - 4 > limit:
                    raise ProtocolError(f"a frame of {need - 4} bytes (limit {limit})")
        try:
            msg = json.loads(buf[4:].decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ProtocolError("a frame that is not JSON") from None
        if not isinstance(msg, dict):
            raise ProtocolError("a frame that is not an object")
        return msg

    def kill(self) -> None:
        """Kill this worker and everything it started, and nothing else; remove its state."""
        self._freeze(False)  # a frozen process takes no signal (cgroup v1) until it is thawed
        if self.isolation.bwrap is not None:
            # the namespace's init is bwrap's child: when it dies the kernel kills the whole namespace
            try:
                targets = psutil.Process(self.proc.pid).children() + [psutil.Process(self.proc.pid)]
            except psutil.Error:
                targets = []
            for p in targets:
                try:
                    p.kill()
                except psutil.Error:
                    pass
        else:  # rlimits-only: the worker's process tree (its supervisor is the subreaper of what cells start)
            try:
                root = psutil.Process(self.proc.pid)
                procs = root.children(recursive=True) + [root]
            except psutil.NoSuchProcess:
                procs = []
            for p in procs:
                try:
                    p.kill()
                except psutil.Error:
                    pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self._cmd_w, self._res_r):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._cmd_w = self._res_r = -1
        self._release()

    def _release(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill_and_remove()
            if not any(d.exists() for d in self.cgroup.dirs):
                self._state.forget_cgroup(self.cgroup.dirs[0].name)
        if self._uid is not None:
            self._uid.release()
            self._uid = None
        if self.isolation.bwrap is None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def close(self) -> None:
        self._freeze(False)
        if self.proc.poll() is None and self._cmd_w >= 0:
            try:
                self._send({"op": "exit"}, 1.0)
            except OSError:
                pass
        self.kill()


@functools.lru_cache(maxsize=1)
def _worker_source() -> str:
    return WORKER_SCRIPT.read_text()


class SandboxSession:
    """One stateful interpreter; replaced transparently (and said so) after a crash."""

    def __init__(self, pool: SandboxPool):
        self.pool = pool
        self._worker: _Worker | None = pool._take()

    def run(self, code: str, limits: SandboxLimits | None = None) -> ExecResult:
        limits = limits or self.pool.limits
        refused = check_code(code)
        if refused is not None:
            return refused
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

    def describe(self) -> dict:
        """The isolation level this session's interpreter runs under and its host uid (for ``episode.meta``)."""
        uid = self._worker.host_uid if self._worker is not None else None
        return {"backend": "local", **self.pool.chosen.describe(), "host_uid": uid}

    @property
    def capabilities(self) -> dict:
        return dict(self._worker.wait_ready().get("caps", {})) if self._worker else {}

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def __deepcopy__(self, memo: dict) -> SandboxSession:
        return self  # a live process cannot be copied; copies of an env share its interpreter

    def __enter__(self) -> SandboxSession:
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
    """Keeps ``size`` workers started in advance; ``session()`` hands one out and refills.

    ``isolation``: ``"auto"`` (the strongest bubblewrap level the machine allows; an error
    when bubblewrap cannot run) or one of ``isolation.LEVELS`` (an error when the machine
    cannot provide it; ``rlimits-only`` is an ordinary user's opt-in, not isolation). Starting
    a pool also removes sandbox folders and cgroups left by hosts that were killed.
    """

    size: int = 2
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    preload: tuple[str, ...] = ("math", "fractions", "decimal", "itertools", "functools", "collections",
                                "statistics", "random", "re", "cmath", "numpy", "sympy")
    isolation: str = "auto"

    def __post_init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        iso.clean_stale_state()
        iso.host_state()  # its exit clean-up is registered before this pool's, so it runs after
        self.chosen = choose_isolation(self.isolation)
        atexit.register(self.close)  # idle workers' directories are removed on a normal exit too
        self._refill()

    def session(self) -> SandboxSession:
        return SandboxSession(self)

    def _take(self) -> _Worker:
        with self._lock:
            worker = self._idle.pop(0) if self._idle else None
        if worker is None:
            worker = _Worker(self.limits, self.preload, self.chosen)
        threading.Thread(target=self._refill, daemon=True).start()
        worker.wait_ready()
        return worker

    def _refill(self) -> None:
        while not self._closed:
            with self._lock:
                if len(self._idle) >= self.size:
                    return
            worker = _Worker(self.limits, self.preload, self.chosen)
            with self._lock:
                if self._closed:
                    worker.kill()
                    return
                self._idle.append(worker)

    def wait_warm(self, timeout_s: float = 120.0) -> None:
        """Block until ``size`` idle workers are started and ready (e.g. before timing cells)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                idle = list(self._idle)
            if len(idle) >= self.size:
                for w in idle:
                    w.wait_ready()
                return
            time.sleep(0.05)
        raise SandboxError(f"the pool did not warm up within {timeout_s:g} s")

    def close(self) -> None:
        self._closed = True
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.close()

    def __deepcopy__(self, memo: dict) -> SandboxPool:
        return self  # a pool of processes is a shared resource, not state to copy

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> dict:
        """What an episode records in ``meta["sandbox"]``: the isolation level that ran, and the limits."""
        return {"backend": "local", **self.chosen.describe(), "size": self.size, "limits": asdict(self.limits)}
