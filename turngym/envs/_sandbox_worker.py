"""Sandbox worker: a stateful Python interpreter behind a pipe. Standard library only.

Started by :mod:`turngym.envs.sandbox` as ``python -I -S _sandbox_worker.py CMD_FD RES_FD
CONFIG_JSON``. It confines itself first (namespaces and a throwaway uid when it runs as
root, rlimits, audit hooks), then executes code cells in one persistent namespace.
Messages are 4-byte big-endian length + UTF-8 JSON on the two inherited descriptors, so
anything user code prints to fds 1/2 cannot corrupt the protocol.
"""

import ctypes
import io
import json
import os
import resource
import signal
import struct
import sys
import time
import traceback

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_BIND = 4096
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1


def _recv(fd):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    body = _read_exact(fd, n)
    return None if body is None else json.loads(body.decode("utf-8"))


def _read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _send(fd, obj):
    data = json.dumps(obj).encode("utf-8")
    msg = struct.pack(">I", len(data)) + data
    while msg:
        msg = msg[os.write(fd, msg):]


class _Confinement:
    def __init__(self, cfg):
        self.cfg = cfg
        self.caps = {}
        self.libc = ctypes.CDLL(None, use_errno=True)

    def apply(self):
        cfg = self.cfg
        self.caps["subreaper"] = self.libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        is_root = os.geteuid() == 0
        os.chdir(cfg["workdir"])  # keeps pointing at the real directory even under a new /tmp
        if is_root and cfg.get("namespaces", True):
            self.caps["no_network"] = self.libc.unshare(CLONE_NEWNET) == 0
            if self.libc.unshare(CLONE_NEWNS) == 0 and self._mount(None, "/", None, MS_REC | MS_PRIVATE):
                self.caps["private_tmp"] = all(
                    self._overlay(d, "size=64m,mode=1777") for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d))
                if cfg.get("uid") is not None:
                    self.caps["interpreter_exposed"] = all(
                        self._overlay(d, "size=1m,mode=755") for d in self._private_ancestors())
        lim = cfg["limits"]
        self._setrlimit(resource.RLIMIT_AS, lim["memory_bytes"])
        self._setrlimit(resource.RLIMIT_FSIZE, lim["file_bytes"])
        self._setrlimit(resource.RLIMIT_NOFILE, lim["open_files"])
        self._setrlimit(resource.RLIMIT_CORE, 0)
        self._setrlimit(resource.RLIMIT_CPU, lim["session_cpu_s"])
        if is_root and cfg.get("uid") is not None:
            os.setgroups([])
            os.setgid(cfg["gid"])
            os.setuid(cfg["uid"])
            self.caps["dropped_uid"] = cfg["uid"]
        self._setrlimit(resource.RLIMIT_NPROC, lim["processes"])
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversize write fails instead of killing
        self._install_audit_hook(cfg["workdir"], is_root)

    def _mount(self, src, target, fstype, flags=0, data=None):
        enc = lambda v: None if v is None else os.fsencode(v)  # noqa: E731
        return self.libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) == 0

    @staticmethod
    def _interpreter_paths():
        paths = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))}
        paths |= {p for p in sys.path if p and os.path.isdir(p)}
        return {os.path.realpath(p) for p in paths}

    def _private_ancestors(self):
        """Directories others cannot traverse that hold the interpreter (e.g. /root for pyenv)."""
        out = set()
        for path in self._interpreter_paths():
            parts = path.strip("/").split("/")
            for i in range(1, len(parts)):
                anc = "/" + "/".join(parts[:i])
                if not os.stat(anc).st_mode & 0o001:
                    out.add(anc)
                    break
        return sorted(out)

    def _overlay(self, directory, options):
        """Replace ``directory`` (in this private mount namespace only) by an empty tmpfs that
        keeps bind mounts of just the interpreter's own trees below it; the rest is hidden.
        Stashes live in the working directory, reached through the cwd while they are moved."""
        keep = sorted(p for p in self._interpreter_paths() if p.startswith(directory.rstrip("/") + "/"))
        keep = [p for p in keep if not any(p != q and p.startswith(q + "/") for q in keep)]
        stashes = []
        for n, path in enumerate(keep):
            stash = f"./.stash-{n}"
            os.mkdir(stash)
            if not self._mount(path, stash, None, MS_BIND | MS_REC):
                return False
            stashes.append((path, stash))
        if not self._mount("tmpfs", directory, "tmpfs", 0, options):
            return False
        for path, stash in stashes:
            os.makedirs(path, exist_ok=True)
            if not self._mount(stash, path, None, MS_BIND | MS_REC):
                return False
            self.libc.umount2(os.fsencode(stash), 2)
            os.rmdir(stash)
        return True

    def _setrlimit(self, which, value):
        soft, hard = resource.getrlimit(which)
        new_hard = value if hard == resource.RLIM_INFINITY or hard > value else hard
        try:
            resource.setrlimit(which, (min(value, new_hard), new_hard))
        except (ValueError, OSError):
            resource.setrlimit(which, (min(value, hard) if hard != resource.RLIM_INFINITY else value, hard))

    def _install_audit_hook(self, workdir, is_root):
        workdir = os.path.realpath(workdir)
        own_pid = os.getpid()
        net_blocked = self.caps.get("no_network", False)

        def inside(path):
            try:
                p = os.path.realpath(os.fsdecode(path))
            except (TypeError, ValueError):
                return True  # file descriptors and odd objects: let the OS decide
            return p == workdir or p.startswith(workdir + os.sep) or p.startswith("/dev/null")

        def hook(event, args):
            if event == "open":
                path, mode, flags = args
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
                if writing and path is not None and not isinstance(path, int) and not inside(path):
                    raise PermissionError(f"sandbox: writing outside the working directory is not allowed: {path}")
            elif event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.chmod", "os.chown"):
                path = args[0]
                if not isinstance(path, int) and not inside(path):
                    raise PermissionError(f"sandbox: changing files outside the working directory is not allowed: {path}")
            elif event == "os.kill":
                pid = args[0]
                if pid in (0, -1) or (pid > 0 and pid != own_pid and not _is_descendant(pid, own_pid)):
                    raise PermissionError(f"sandbox: signalling process {pid} is not allowed")
            elif event in ("socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo") and not net_blocked:
                raise PermissionError("sandbox: network access is not allowed")
            elif event == "ctypes.dlopen" and not is_root:
                raise PermissionError("sandbox: ctypes is not allowed")

        sys.addaudithook(hook)


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


def _children_of(root):
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
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != root and _is_descendant(int(name), root):
            out.append(int(name))
    return out


def _kill_leftovers():
    """No process outlives the cell that started it (the worker is their subreaper)."""
    me = os.getpid()
    for _ in range(50):
        kids = _children_of(me)
        if not kids:
            break
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap()
        time.sleep(0.01)
    _reap()


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class _CellTimeout(BaseException):
    """Raised inside user code at the wall or CPU limit (BaseException: bare except can't swallow it)."""


def _on_limit(signum, frame):
    raise _CellTimeout("CPU time limit" if signum == signal.SIGXCPU else "time limit")


def _read_capped(path, cap):
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            data = fh.read(cap)
        return data.decode("utf-8", "replace"), size > cap
    except OSError:
        return "", False


def main():
    cmd_fd, res_fd = int(sys.argv[1]), int(sys.argv[2])
    cfg = json.loads(sys.argv[3])
    # fds 1/2 go to files in the workdir, read back (capped) after each cell
    out_path = ".stdout"  # relative: the absolute path may be hidden under a private /tmp
    err_path = ".stderr"
    for module in cfg.get("preload", []):  # imported before privileges drop and /tmp is replaced
        try:
            __import__(module)
        except ImportError:
            pass
    conf = _Confinement(cfg)
    try:
        conf.apply()
    except Exception as exc:  # report and stop: never run code half-confined
        _send(res_fd, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    sys.setrecursionlimit(cfg["limits"].get("recursion", 3000))
    signal.signal(signal.SIGXCPU, _on_limit)
    signal.signal(signal.SIGALRM, _on_limit)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    worker_pid = os.getpid()
    _send(res_fd, {"ready": True, "caps": conf.caps, "pid": os.getpid()})
    while True:
        msg = _recv(cmd_fd)
        if msg is None or msg.get("op") == "exit":
            return
        cap = int(msg.get("max_output", 10000))
        for p in (out_path, err_path):
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 1 if p == out_path else 2)
            os.close(fd)
        sys.stdout = io.TextIOWrapper(os.fdopen(os.dup(1), "wb", buffering=0), encoding="utf-8", errors="replace", write_through=True)
        sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(2), "wb", buffering=0), encoding="utf-8", errors="replace", write_through=True)
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        cpu_soft = int(used + msg.get("cpu_s", 10)) + 1
        try:
            soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
            resource.setrlimit(resource.RLIMIT_CPU, (min(cpu_soft, hard) if hard != resource.RLIM_INFINITY else cpu_soft, hard))
        except (ValueError, OSError):
            pass
        signal.setitimer(signal.ITIMER_REAL, float(msg.get("wall_s", 10)))
        error, status = None, "ok"
        start = time.perf_counter()
        try:
            code = compile(msg["code"], "<cell>", "exec")
            exec(code, namespace)
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
            if os.getpid() != worker_pid:  # a fork of the cell must never reach the protocol
                os._exit(0)
            signal.setitimer(signal.ITIMER_REAL, 0)
        elapsed = time.perf_counter() - start
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        _kill_leftovers()
        stdout, t1 = _read_capped(out_path, cap)
        stderr, t2 = _read_capped(err_path, cap)
        _send(res_fd, {"status": status, "stdout": stdout, "stderr": stderr, "error": error,
                       "truncated": t1 or t2, "elapsed_s": elapsed})


if __name__ == "__main__":
    main()
