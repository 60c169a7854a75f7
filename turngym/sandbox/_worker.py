"""Sandbox worker: a supervisor and a stateful Python interpreter. Standard library only.

Started by :mod:`turngym.sandbox.local` (inside bubblewrap where the machine allows it) as
``python -I -c SOURCE CMD_FD RES_FD CONFIG_JSON``. The process imports the preload modules,
sets its rlimits (and Landlock where the kernel has it), makes itself non-dumpable and forks the
interpreter. At the ``rlimits-only`` level that is all there is: limits and timeouts, not
isolation (and it refuses to start as root). Only the supervisor holds
the host's two descriptors: the interpreter closes them before any cell runs, and cannot
reach them through ``/proc`` or ptrace (the supervisor is non-dumpable and the sandbox has no
capabilities). Cells report to the supervisor on a pipe of their own; the supervisor checks
every frame (sequence number, types, sizes), reads the cell's output itself, removes the
cell's leftover processes, and answers the host with the host's per-request nonce. A frame
that fails a check ends the worker with a protocol error; the host starts a fresh one.

Frames on every channel are a 4-byte big-endian length and UTF-8 JSON.
"""

import ctypes
import io
import json
import os
import resource
import select
import signal
import struct
import sys
import time
import traceback

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446  # same on x86_64 and aarch64
LL_WRITE_FILE, LL_REFER, LL_TRUNCATE = 1 << 1, 1 << 13, 1 << 14
LL_MAKE_AND_REMOVE = sum(1 << b for b in (4, 5, 6, 7, 8, 9, 10, 11, 12))  # remove dir/file, make char..sym
READ_SYSCALL = {"x86_64": "0", "aarch64": "63"}.get(os.uname().machine, "0")
IDLE_SWEEP_S = 0.1  # between cells, processes are removed this often (a frozen cgroup needs no sweep)
MAX_CELL_FRAME = 1 << 20  # a cell's status frame: status + error text, far below this
STATUSES = ("ok", "error", "timeout")


def _recv(fd, limit=None, stall_s=None):
    """One frame's bytes, or None at end of stream. ValueError when the length is over ``limit``
    or (with ``stall_s``) the rest of a started frame does not come within that many seconds."""
    head = _read_exact(fd, 4, stall_s)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if limit is not None and n > limit:
        raise ValueError(f"a frame of {n} bytes, over the limit of {limit},")
    return _read_exact(fd, n, stall_s)


def _read_exact(fd, n, stall_s=None):
    buf = b""
    while len(buf) < n:
        if stall_s is not None and not select.select([fd], [], [], stall_s)[0]:
            raise ValueError(f"an incomplete frame ({len(buf)} of {n} bytes)")
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _send(fd, obj):
    data = json.dumps(obj).encode("utf-8", "surrogatepass")
    msg = struct.pack(">I", len(data)) + data
    while msg:
        msg = msg[os.write(fd, msg):]


class _Confinement:
    """The limits the worker sets on itself: rlimits, Landlock where the kernel has it, non-dumpable.
    Under bubblewrap the kernel's namespaces do the isolating; at ``rlimits-only`` nothing does."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.caps = {}
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fallback = cfg["isolation"] == "rlimits-only"

    def apply(self):
        cfg = self.cfg
        self.caps["subreaper"] = self.libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if self.fallback and os.geteuid() == 0:  # the host refuses this too; never run cells as host root
            raise PermissionError("the rlimits-only level does not run as root")
        os.chdir(cfg["workdir"])
        lim = cfg["limits"]
        self._setrlimit(resource.RLIMIT_AS, lim["memory_bytes"])
        self._setrlimit(resource.RLIMIT_FSIZE, lim["file_bytes"])
        self._setrlimit(resource.RLIMIT_NOFILE, lim["open_files"])
        self._setrlimit(resource.RLIMIT_CORE, 0)
        self._setrlimit(resource.RLIMIT_CPU, lim["session_cpu_s"])
        # RLIMIT_NPROC counts every process of the uid: under bubblewrap (its own user namespace) that is the
        # cell tree; a rlimits-only worker shares its uid with the user's other processes, so there the cap is
        # what the user already runs plus the cell's allowance
        self._setrlimit(resource.RLIMIT_NPROC, lim["processes"] + (_processes_of(os.getuid()) if self.fallback else 0))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversize write fails instead of killing
        # "." is the working directory itself
        self.caps["landlock"] = self._landlock([".", "/tmp", "/dev/shm", "/var/tmp"], ["/dev"])
        self.caps["non_dumpable"] = self.libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0

    def _landlock(self, writable, device_dirs):
        """Defence in depth where the kernel has Landlock: no file is created, removed, renamed, linked
        or written outside ``writable`` (and device files under ``device_dirs``, e.g. /dev/null), for
        the supervisor and everything it starts. Returns the Landlock ABI in force, or 0 (none)."""
        syscall = self.libc.syscall
        syscall.restype = ctypes.c_long
        abi = syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # the ABI version
        if abi < 1:
            return 0
        write = LL_WRITE_FILE | LL_MAKE_AND_REMOVE | (LL_REFER if abi >= 2 else 0) | (LL_TRUNCATE if abi >= 3 else 0)
        attr = struct.pack("=Q", write)
        ruleset = syscall(LANDLOCK_CREATE_RULESET, ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
        if ruleset < 0:
            return 0
        try:
            for path, access in [(p, write) for p in writable] + [(p, LL_WRITE_FILE | (LL_TRUNCATE if abi >= 3 else 0))
                                                                    for p in device_dirs]:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    rule = struct.pack("=Qi", access, fd)
                    if syscall(LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.c_char_p(rule),
                               ctypes.c_uint32(0)) != 0:
                        return 0
                finally:
                    os.close(fd)
            self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            return int(abi) if syscall(LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) == 0 else 0
        finally:
            os.close(ruleset)

    def _setrlimit(self, which, value):
        soft, hard = resource.getrlimit(which)
        new_hard = value if hard == resource.RLIM_INFINITY or hard > value else hard
        try:
            resource.setrlimit(which, (min(value, new_hard), new_hard))
        except (ValueError, OSError):
            resource.setrlimit(which, (min(value, hard) if hard != resource.RLIM_INFINITY else value, hard))

def _processes_of(uid):
    """How many processes (threads included: RLIMIT_NPROC counts tasks) the uid runs now."""
    n = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if line.startswith(("Uid:", "Threads:")))
            if int(fields["Uid"].split()[0]) == uid:
                n += int(fields["Threads"])
        except (OSError, ValueError, KeyError):
            continue
    return n


def _is_descendant(pid, root):
    seen = 0
    while pid > 1 and seen < 64:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if ppid == root:
            return True
        pid, seen = ppid, seen + 1
    return False


def _direct_children(pid):
    kids = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as fh:
            kids += [int(x) for x in fh.read().split()]
    return kids


def _descendants(root):
    """All descendants of ``root``: fast via /proc/PID/task/TID/children, else a /proc scan."""
    try:
        out, todo = [], [root]
        while todo:
            for kid in _direct_children(todo.pop()):
                out.append(kid)
                todo.append(kid)
        return out
    except OSError:  # kernels without CONFIG_PROC_CHILDREN, or a child that just exited
        pass
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != root and _is_descendant(int(n), root)]


class _Interpreter:
    """The forked child that runs cells, seen from the supervisor."""

    def __init__(self, cfg, host_fds, out_fd, err_fd):
        code_r, self.code_w = os.pipe()
        self.done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                for fd in (*host_fds, self.code_w, self.done_r):
                    os.close(fd)
                # readable by the supervisor (see ``idle``); it holds no secret: the host's descriptors are closed
                ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
                _interpreter_loop(code_r, done_w, out_fd, err_fd, cfg)
            finally:
                os._exit(0)
        os.close(code_r)
        os.close(done_w)
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        self.code_fd = code_r  # its number in the interpreter, where it waits for the next cell

    def idle(self, wait_s=0.5):
        """Is the interpreter waiting for its next cell: one thread, blocked reading its code pipe?
        Read by the supervisor from /proc (the interpreter makes itself readable), so a thread a
        cell left running, or cell code that carried on after a forged status frame, cannot pass."""
        deadline, tries = time.monotonic() + wait_s, 0
        while True:
            try:
                with open(f"/proc/{self.pid}/status") as fh:
                    threads = int(next(x for x in fh if x.startswith("Threads:")).split()[1])
                with open(f"/proc/{self.pid}/syscall") as fh:
                    call = fh.read().split()
            except (OSError, ValueError, StopIteration):
                threads, call = 0, []
            if threads == 1 and len(call) > 1 and call[0] == READ_SYSCALL and int(call[1], 16) == self.code_fd:
                return True
            if time.monotonic() > deadline:
                return False
            tries += 1
            if tries < 50:
                os.sched_yield()  # it is usually a few bytecodes away from its read
            else:
                time.sleep(0.0002)

    def death(self):
        """Why the interpreter is gone (it was reaped here)."""
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            return "the interpreter exited"
        if os.WIFSIGNALED(status):
            name = signal.Signals(os.WTERMSIG(status)).name
            why = {"SIGSEGV": "a segmentation fault", "SIGXCPU": "the CPU time limit", "SIGKILL": "a kill signal",
                   "SIGXFSZ": "the file size limit", "SIGABRT": "an abort", "SIGBUS": "a bus error"}.get(name, name)
            return f"the interpreter crashed ({why})"
        return f"the interpreter exited (code {os.WEXITSTATUS(status)})"


def _interpreter_loop(code_r, done_w, out_fd, err_fd, cfg):
    sys.setrecursionlimit(cfg["limits"].get("recursion", 3000))
    signal.signal(signal.SIGXCPU, _on_limit)
    signal.signal(signal.SIGALRM, _on_limit)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    me = os.getpid()
    while True:
        raw = _recv(code_r)
        if raw is None:
            return
        msg = json.loads(raw.decode("utf-8", "surrogatepass"))
        _reap_own()
        # no new descriptor is needed here: a cell that used up its open-file limit cannot break the next one
        for fd, target in ((out_fd, 1), (err_fd, 2)):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.dup2(fd, target)
        sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(target, "wb", closefd=False), encoding="utf-8",
                                                   errors="replace", write_through=True) for target in (1, 2))
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        cpu_soft = int(used + msg["cpu_s"]) + 1
        try:
            soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
            resource.setrlimit(resource.RLIMIT_CPU, (min(cpu_soft, hard) if hard != resource.RLIM_INFINITY else cpu_soft, hard))
        except (ValueError, OSError):
            pass
        signal.setitimer(signal.ITIMER_REAL, float(msg["wall_s"]))
        error, status = None, "ok"
        try:
            exec(compile(msg["code"], "<cell>", "exec"), namespace)
        except _CellTimeout as exc:
            status, error = "timeout", f"TimeoutError: execution exceeded the {exc.args[0]}"
        except MemoryError:
            status, error = "error", "MemoryError: the memory limit was exceeded"
        except RecursionError:
            status, error = "error", "RecursionError: maximum recursion depth exceeded"
        except SystemExit as exc:
            status, error = "error", f"SystemExit: {exc.code}"
        except KeyboardInterrupt:
            status, error = "error", "KeyboardInterrupt"
        except BaseException:
            etype, evalue, tb = sys.exc_info()
            frames = [f for f in traceback.extract_tb(tb) if f.filename == "<cell>"]
            lines = traceback.format_list(frames) + traceback.format_exception_only(etype, evalue)
            status, error = "error", "Traceback (most recent call last):\n" + "".join(lines)
        finally:
            if os.getpid() != me:  # a fork of the cell must never reach the protocol
                os._exit(0)
            signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        for fd in (code_r, done_w, out_fd, err_fd):  # a cell that closed one fails here, not in the next cell
            os.fstat(fd)
        if error is not None and len(error) > msg["max_output"]:  # a huge message must not look like a forgery
            error = error[: msg["max_output"]] + "\n... [error truncated]"
        _send(done_w, {"seq": msg["seq"], "status": status, "error": error})  # the supervisor times the cell


class _CellTimeout(BaseException):
    """Raised inside user code at the wall or CPU limit (BaseException: bare except can't swallow it)."""


def _on_limit(signum, frame):
    raise _CellTimeout("CPU time limit" if signum == signal.SIGXCPU else "time limit")


def _read_output(fd, cap):
    """The first ``cap`` characters a stream got, and whether there were more. At most 4 bytes
    a character: the first ``cap`` characters lie whole within ``4 * cap`` bytes."""
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, 4 * cap, 0)
    except OSError:
        return "", False
    text = data.decode("utf-8", "replace")
    return text[:cap], len(text) > cap or size > len(data)


def _check_cell_frame(raw, seq, cap):
    """The cell's status frame, or raise ValueError saying what is wrong with it."""
    if raw is None:
        raise EOFError
    if not raw:
        raise ValueError("an empty frame")
    try:
        msg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("a frame that is not JSON") from None
    if not isinstance(msg, dict) or set(msg) != {"seq", "status", "error"}:
        raise ValueError("a frame with the wrong fields")
    if msg["seq"] != seq:
        raise ValueError(f"an out-of-order frame (sequence {msg['seq']!r}, expected {seq})")
    if msg["status"] not in STATUSES or not (msg["error"] is None or isinstance(msg["error"], str)):
        raise ValueError("a frame with wrongly typed fields")
    if msg["error"] is not None and len(msg["error"]) > cap:
        msg["error"] = msg["error"][:cap] + "\n... [error truncated]"
    return msg


def _kill_leftovers(keep):
    """No process outlives the cell that started it: the supervisor is their subreaper."""
    me = os.getpid()
    for _ in range(50):
        kids = [k for k in _descendants(me) if k != keep]
        if not kids:
            return  # the common case: the cell started nothing
        _reap(keep)
        live = [k for k in kids if not _zombie(k)]
        if not live:
            return  # the interpreter's own exited children: it reaps them before its next cell
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def _zombie(pid):
    """Exited, waiting for its parent (the interpreter reaps its own before the next cell)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _reap_own():
    """The interpreter's exited children, e.g. what the last cell forked (they hold pids)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _reap(keep):
    """Reap orphans, never the interpreter (its exit status is read in ``death``)."""
    try:
        names = os.listdir(f"/proc/{os.getpid()}/task")
    except OSError:
        names = []
    for tid in names:
        try:
            with open(f"/proc/{os.getpid()}/task/{tid}/children") as fh:
                kids = [int(x) for x in fh.read().split()]
        except OSError:
            continue
        for pid in kids:
            if pid != keep:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


def main():
    cmd_fd, res_fd = int(sys.argv[1]), int(sys.argv[2])
    cfg = json.loads(sys.argv[3])
    for module in cfg.get("preload", []):  # imported before the rlimits and Landlock apply
        try:
            __import__(module)
        except ImportError:
            pass
    conf = _Confinement(cfg)
    try:
        conf.apply()
        # capture in memory (memfd), not in the working folder: a cell that fills its tmpfs cannot break it
        out_fd, err_fd = (os.memfd_create(name, 0) for name in ("cell-stdout", "cell-stderr"))
        interp = _Interpreter(cfg, (cmd_fd, res_fd), out_fd, err_fd)
    except Exception as exc:  # report and stop: never run code half-confined
        _send(res_fd, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    _send(res_fd, {"ready": True, "caps": conf.caps, "pid": os.getpid()})
    seq = 0
    while True:
        while not select.select([cmd_fd], [], [], IDLE_SWEEP_S)[0]:
            _kill_leftovers(interp.pid)  # what a cell's thread forks after the cell returned
        raw = _recv(cmd_fd)
        msg = None if raw is None else json.loads(raw.decode("utf-8", "surrogatepass"))
        if msg is None or msg.get("op") == "exit":
            os.kill(interp.pid, signal.SIGKILL)
            return
        seq += 1
        nonce, cap = msg["nonce"], int(msg["max_output"])
        pending = select.select([interp.done_r, interp.pidfd], [], [], 0)[0]
        if interp.pidfd in pending:  # the interpreter died after its last cell (e.g. killed by a leftover)
            _send(res_fd, {"nonce": nonce, "crashed": interp.death()})
            return
        if pending:  # something was written on its channel between cells
            _send(res_fd, {"nonce": nonce, "protocol_error": "the cell wrote on the interpreter's channel between cells"})
            return
        if not interp.idle():  # e.g. a thread left by the last cell: it could answer for this one
            _send(res_fd, {"nonce": nonce, "protocol_error": "the interpreter was not idle between cells"})
            return
        start = time.monotonic()  # timed here: a cell could forge any number it reported itself
        try:
            _send(interp.code_w, {"seq": seq, "code": msg["code"], "wall_s": msg["wall_s"], "cpu_s": msg["cpu_s"],
                                  "max_output": cap})
        except OSError:
            _send(res_fd, {"nonce": nonce, "crashed": interp.death()})
            return
        ready = select.select([interp.done_r, interp.pidfd], [], [])[0]
        try:
            if interp.done_r not in ready:  # exited without a word (a descendant may hold its pipe open)
                raise EOFError
            frame = _check_cell_frame(_recv(interp.done_r, max(MAX_CELL_FRAME, 16 * cap + 4096), stall_s=1.0), seq, cap)
            elapsed = time.monotonic() - start
        except EOFError:
            _send(res_fd, {"nonce": nonce, "crashed": interp.death()})
            return
        except ValueError as exc:
            _send(res_fd, {"nonce": nonce, "protocol_error": f"the cell wrote {exc} on the interpreter's channel"})
            return
        # threads still running, or cell code still running after its frame, or more written on the channel
        restart = not interp.idle() or bool(select.select([interp.done_r], [], [], 0)[0])
        if restart:
            os.kill(interp.pid, signal.SIGKILL)
            note = "SandboxError: the cell left threads running after it ended; the interpreter was stopped"
            frame["error"] = f"{frame['error']}\n{note}" if frame["error"] else note
            frame["status"] = "error"
        _kill_leftovers(interp.pid)
        stdout, t1 = _read_output(out_fd, cap)
        stderr, t2 = _read_output(err_fd, cap)
        _send(res_fd, {"nonce": nonce, "status": frame["status"], "stdout": stdout, "stderr": stderr,
                       "error": frame["error"], "truncated": t1 or t2, "elapsed_s": elapsed, "restart": restart})
        if restart:
            return


if __name__ == "__main__":
    main()
