"""Remote Python execution on a SandboxFusion server (``sandbox="sandboxfusion:URL"``).

SandboxFusion's ``/run_code`` is stateless: every request is a fresh process. A session keeps
the cells that completed (ok or with an error) and sends them with each new cell; a small
driver replays them with their output thrown away, then runs the new cell and reports its
status. So variables persist across cells as in the local pool, and a branch is restored by
replaying its cells like any other. What a replay cannot give back: state from randomness,
the clock or the outside world may come out differently, and each cell costs the replay of
the session's earlier cells. A cell that timed out is not replayed; a crash (the process died)
empties the session, as a crash restarts the local interpreter.

Limits applied per cell by the driver in the remote process: wall clock (an alarm, and the
server's run timeout as a backstop), CPU time, address space (also sent as the server's
``memory_limit_MB``), file size, open files, recursion depth; output is cut to ``max_output``
characters per stream here. Process counts, a memory cap for the process tree and network
access are the server's isolation settings, not ours; ``describe()`` says so. The status a
cell reports is written by the driver in the cell's own process (the local pool's supervisor
checks every frame; this backend cannot).

Needs the ``sandbox-fusion`` client (``pip install turngym[sandboxfusion]``).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
import time
from dataclasses import asdict

from turngym.sandbox.base import ExecResult, SandboxError, SandboxLimits, check_code

RESULT_FILE = ".turngym-result.json"
CELLS_FILE = ".turngym-cells.json"
STARTUP_S = 5.0  # the server's process start and the driver's own imports, on top of the cells' time
HEALTH_TIMEOUT_S = 15.0  # the health check's one request

# The program each request runs. It reads the cells from CELLS_FILE, which the request carries
# (and removes it), so a cell's text is data, never spliced into source; it reports in RESULT_FILE.
DRIVER = r'''
import json, os, resource, signal, sys, time, traceback
_here = os.getcwd()
with open(os.path.join(_here, ".turngym-cells.json")) as _f:
    _job = json.load(_f)
os.remove(os.path.join(_here, ".turngym-cells.json"))
_lim = _job["limits"]
def _cap(which, value):
    soft, hard = resource.getrlimit(which)
    hard = value if hard == resource.RLIM_INFINITY or hard > value else hard
    resource.setrlimit(which, (min(value, hard), hard))
class _CellTimeout(BaseException):
    pass
def _on_limit(signum, frame):
    raise _CellTimeout("CPU time limit" if signum == signal.SIGXCPU else "time limit")
signal.signal(signal.SIGALRM, _on_limit)
signal.signal(signal.SIGXCPU, _on_limit)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
sys.setrecursionlimit(_lim["recursion"])
_ns = {"__name__": "__main__", "__builtins__": __builtins__}
_saved = (os.dup(1), os.dup(2))
_null = os.open(os.devnull, os.O_WRONLY)
os.dup2(_null, 1)
os.dup2(_null, 2)
for _code in _job["history"]:
    signal.setitimer(signal.ITIMER_REAL, _lim["wall_s"])
    try:
        exec(compile(_code, "<cell>", "exec"), _ns)
    except BaseException:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
sys.stdout.flush()
sys.stderr.flush()
os.dup2(_saved[0], 1)
os.dup2(_saved[1], 2)
_out = os.open(os.path.join(_here, ".turngym-result.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
_used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
_cap(resource.RLIMIT_CPU, int(_used + _lim["cpu_s"]) + 1)
_cap(resource.RLIMIT_AS, _lim["memory_bytes"])
_cap(resource.RLIMIT_FSIZE, _lim["file_bytes"])
_cap(resource.RLIMIT_NOFILE, _lim["open_files"])
_status, _error, _start = "ok", None, time.monotonic()
signal.setitimer(signal.ITIMER_REAL, _lim["wall_s"])
try:
    exec(compile(_job["cell"], "<cell>", "exec"), _ns)
except _CellTimeout as _exc:
    _status, _error = "timeout", "TimeoutError: execution exceeded the " + _exc.args[0]
except MemoryError:
    _status, _error = "error", "MemoryError: the memory limit was exceeded"
except RecursionError:
    _status, _error = "error", "RecursionError: maximum recursion depth exceeded"
except SystemExit as _exc:
    _status, _error = "error", "SystemExit: %s" % (_exc.code,)
except KeyboardInterrupt:
    _status, _error = "error", "KeyboardInterrupt"
except BaseException:
    _t, _v, _tb = sys.exc_info()
    _frames = [f for f in traceback.extract_tb(_tb) if f.filename == "<cell>"]
    _status = "error"
    _error = "Traceback (most recent call last):\n" + "".join(
        traceback.format_list(_frames) + traceback.format_exception_only(_t, _v))
finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
_elapsed = time.monotonic() - _start
try:
    sys.stdout.flush()
    sys.stderr.flush()
except Exception:
    pass
_report = json.dumps({"status": _status, "error": _error, "elapsed_s": _elapsed}).encode()
try:
    os.write(_out, _report)
except OSError:  # the cell closed the descriptor: open the file again
    with open(os.path.join(_here, ".turngym-result.json"), "wb") as _f:
        _f.write(_report)
'''


def _request_model():
    """The client's request model with ``memory_limit_MB``, which the server reads and the client omits."""
    try:
        from sandbox_fusion import RunCodeRequest
    except ImportError as exc:
        raise SandboxError("the SandboxFusion backend needs its client: pip install 'turngym[sandboxfusion]'") from exc

    class _Request(RunCodeRequest):
        memory_limit_MB: int = -1

    return _Request


class FusionSession:
    """One stateful interpreter on a SandboxFusion server, kept as the cells to replay."""

    def __init__(self, sandbox: SandboxFusion):
        self.sandbox = sandbox
        self.history: list[tuple[str, float]] = []  # completed cells and how long each took
        self._closed = False

    def run(self, code: str, limits: SandboxLimits | None = None) -> ExecResult:
        limits = limits or self.sandbox.limits
        refused = check_code(code)
        if refused is not None:
            return refused
        if self._closed:
            raise SandboxError("session is closed")
        replay_s = sum(elapsed for _, elapsed in self.history)
        timeout = STARTUP_S + 1.5 * replay_s + limits.wall_s + 1.0
        job = {"history": [c for c, _ in self.history], "cell": code,
               "limits": {"wall_s": limits.wall_s, "cpu_s": limits.cpu_s, "memory_bytes": limits.memory_bytes,
                          "file_bytes": limits.file_bytes, "open_files": limits.open_files,
                          "recursion": limits.recursion}}
        resp = self.sandbox.post(job, timeout, limits)
        result = self._result(resp, limits, timeout)
        if result.status in ("ok", "error") and not result.restarted:
            self.history.append((code, result.elapsed_s))
        elif result.restarted:
            self.history = []
        return result

    def _result(self, resp, limits: SandboxLimits, timeout: float) -> ExecResult:
        run = resp.run_result
        if run is None:
            raise SandboxError(f"SandboxFusion returned no run result ({resp.status}: {resp.message[:300]})")
        stdout, t1 = _cut(run.stdout or "", limits.max_output)
        stderr, t2 = _cut(run.stderr or "", limits.max_output)
        out = {"stdout": stdout, "stderr": stderr, "truncated": t1 or t2}
        if run.status == "TimeLimitExceeded":
            return ExecResult(status="timeout", elapsed_s=float(run.execution_time or timeout), **out,
                              error=f"TimeoutError: execution exceeded the time limit ({limits.wall_s:g} s); "
                                    "the interpreter was killed")
        raw = resp.files.get(RESULT_FILE)
        if not raw:  # the process ended before the driver reported: a crash or an exit
            return ExecResult(status="crashed", restarted=True, **out,
                              error=f"SandboxCrash: {_death(run.return_code)}")
        try:
            report = json.loads(base64.b64decode(raw))
            status, error, elapsed = report["status"], report["error"], float(report["elapsed_s"])
        except (ValueError, KeyError, TypeError):
            return ExecResult(status="error", restarted=True, **out,
                              error="SandboxProtocolError: an unreadable status report; the session was reset")
        if status not in ("ok", "error", "timeout") or not (error is None or isinstance(error, str)) \
                or not (math.isfinite(elapsed) and elapsed >= 0):
            return ExecResult(status="error", restarted=True, **out,
                              error="SandboxProtocolError: an impossible status report; the session was reset")
        if error is not None and len(error) > limits.max_output:
            error = error[: limits.max_output] + "\n... [error truncated]"
        return ExecResult(status=status, error=error, elapsed_s=min(elapsed, limits.wall_s + 2.0), **out)

    def describe(self) -> dict:
        return {**self.sandbox.describe(), "host_uid": None, "replayed_cells": len(self.history)}

    def close(self) -> None:
        self._closed = True
        self.history = []

    def __enter__(self) -> FusionSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reason(exc: BaseException, timeout_s: float) -> str:
    """The cause of a failed request in a few words (the client wraps it in several layers of text)."""
    text = " ".join(str(exc).split())
    errno = re.search(r"\[Errno -?\d+\] ([^\"')]+)", text)
    if errno:
        return errno.group(1).strip().rstrip(".").lower()
    if "timed out" in text.lower() or isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    code = re.search(r"responded with code (\d+)", text)
    if code:
        return f"it answered HTTP {code.group(1)}"
    return text[:200] or type(exc).__name__


def _health_job(limits: SandboxLimits) -> dict:
    return {"history": [], "cell": "print('ok')",
            "limits": {"wall_s": limits.wall_s, "cpu_s": limits.cpu_s, "memory_bytes": limits.memory_bytes,
                       "file_bytes": limits.file_bytes, "open_files": limits.open_files, "recursion": limits.recursion}}


def _cut(text: str, cap: int) -> tuple[str, bool]:
    return text[:cap], len(text) > cap


def _death(code: int | None) -> str:
    if code is None:
        return "the interpreter ended without a status"
    if code < 0 or code > 128:  # killed by a signal (bash reports 128 + the signal's number)
        import signal

        n = -code if code < 0 else code - 128
        try:
            name = signal.Signals(n).name
        except ValueError:
            name = f"signal {n}"
        why = {"SIGSEGV": "a segmentation fault", "SIGKILL": "a kill signal", "SIGXCPU": "the CPU time limit",
               "SIGABRT": "an abort", "SIGBUS": "a bus error"}.get(name, name)
        return f"the interpreter crashed ({why})"
    return f"the interpreter exited (code {code})"


class SandboxFusion:
    """Sessions on the SandboxFusion server at ``url`` (e.g. ``http://127.0.0.1:8080``).

    ``max_attempts``: tries per request (the client retries with jittered backoff) before a
    :class:`SandboxError`; an unreachable server is an error, never an empty observation."""

    backend = "sandboxfusion"

    def __init__(self, url: str, limits: SandboxLimits | None = None, max_attempts: int = 3):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"a SandboxFusion URL starts with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.limits = limits or SandboxLimits()
        self.max_attempts = int(max_attempts)
        self._request = _request_model()

    def session(self) -> FusionSession:
        return FusionSession(self)

    def check_ready(self, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        """One request (``print('ok')`` through the driver, no retries) that must come back ok; else a
        one-line :class:`SandboxError` naming the URL and the reason. Made when an env is built with this
        backend, so a dead server stops the run there instead of turning every code cell into an error
        observation."""
        start = time.monotonic()
        try:
            from sandbox_fusion import run_code

            request = self._request(
                code=DRIVER, language="python", run_timeout=timeout_s, memory_limit_MB=max(1, self.limits.memory_bytes >> 20),
                files={CELLS_FILE: base64.b64encode(json.dumps(_health_job(self.limits)).encode()).decode()},
                fetch_files=[RESULT_FILE])
            client_log = logging.getLogger("sandbox_fusion.client")  # it logs the failure we report below
            level = client_log.level
            client_log.setLevel(logging.CRITICAL)
            try:
                resp = run_code(request, endpoint=self.url, max_attempts=1, client_timeout=timeout_s + 5.0)
            finally:
                client_log.setLevel(level)
            result = FusionSession(self)._result(resp, self.limits, timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure is the one-line reason below
            reason = _reason(exc, timeout_s)
            raise SandboxError(f"the SandboxFusion server at {self.url} is not usable: {reason}") from None
        if not result.ok or result.stdout != "ok\n":
            reason = (result.error or f"a test cell printed {result.stdout[:100]!r}").strip().splitlines()[-1]
            raise SandboxError(f"the SandboxFusion server at {self.url} is not usable: a test cell came back "
                               f"{result.status} ({reason})")
        self.health_ms = round((time.monotonic() - start) * 1000.0, 1)

    def post(self, job: dict, timeout: float, limits: SandboxLimits):
        """One ``/run_code`` request running the driver on ``job``; SandboxError when the server fails."""
        from sandbox_fusion import run_code

        request = self._request(
            code=DRIVER, language="python", run_timeout=timeout, memory_limit_MB=max(1, limits.memory_bytes >> 20),
            files={CELLS_FILE: base64.b64encode(json.dumps(job).encode()).decode()}, fetch_files=[RESULT_FILE])
        start = time.monotonic()
        try:
            return run_code(request, endpoint=self.url, max_attempts=self.max_attempts, client_timeout=timeout + 30.0)
        except Exception as exc:  # noqa: BLE001 - the client raises bare Exception for server errors
            raise SandboxError(f"SandboxFusion at {self.url} failed after {self.max_attempts} attempt(s) "
                               f"({time.monotonic() - start:.1f} s): {exc}") from exc

    def describe(self) -> dict:
        """What an episode records in ``meta["sandbox"]``."""
        return {"backend": self.backend, "url": self.url, "isolation": "remote: the server's own settings",
                "state": "earlier cells replayed per request", "limits": asdict(self.limits),
                "limits_applied": ["wall_s", "cpu_s", "memory_bytes", "file_bytes", "open_files", "recursion",
                                   "max_output"],
                "server_settings": ["processes", "tree_memory_bytes", "disk_bytes", "network"]}

    def close(self) -> None:
        pass  # nothing is held between requests
