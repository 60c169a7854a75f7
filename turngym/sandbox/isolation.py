"""How sandbox workers are confined by the kernel: bubblewrap namespaces, one cgroup per worker,
and the clean-up of what a killed host left behind.

Levels, strongest first (recorded in every MathCode episode's ``meta["sandbox"]``):

- ``bubblewrap+cgroup``: each worker runs under ``bwrap`` in fresh user, PID, network, IPC,
  UTS, mount and cgroup namespaces with no way to create more (``--disable-userns``), a
  seccomp filter refusing keyrings, ptrace, perf, BPF, userfaultfd, io_uring and foreign ABIs
  (x86_64 and aarch64), a read-only view of only the interpreter's trees and system libraries (with turngym's own
  package folder, and so its benchmark data, hidden), a private ``/proc``,
  size-capped tmpfs working directory, ``/tmp`` and ``/dev/shm``, no capabilities, and one
  cgroup per worker capping memory (tmpfs pages included) and process count for the whole
  cell tree.
- ``bubblewrap``: the same without the cgroup (the machine lets us create none); per-process
  rlimits and the tmpfs sizes remain.
- ``rlimits-only``: NOT isolation. Time, CPU, memory, file-size and process limits (and
  Landlock where the kernel has it) on a worker that runs as the user who started turngym: a
  cell can read what that user can, reach the network and signal that user's processes. Never
  chosen automatically (``auto`` is an error where bubblewrap cannot run), refused as root, and
  announced loudly when an ordinary user opts in.

Identity: the interpreter never runs as host uid 0. Under bubblewrap each worker is its own
user and PID namespace (and cgroup), and bubblewrap itself runs as the user who started
turngym; started by root, it runs instead as a throwaway unprivileged host uid held by that
worker alone (``UidClaim``), dropped to with util-linux ``setpriv`` (no groups, no capabilities)
after the worker joined its cgroup. Interpreter trees that uid could not reach (a pyenv under
``/root``) are first bind-mounted read-only onto a world-readable staging folder inside a private
mount namespace (util-linux ``unshare`` and ``mount``), so nothing on the host changes. ``/proc/sys``
is read-only inside. A machine where this cannot run refuses bubblewrap (see ``bwrap_probe``)
rather than map the sandbox to root. The host kills a worker by killing its namespace's init and its
cgroup, never by uid, so no kill reaches another session.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from turngym.sandbox._reaper import recorded_cgroups, remove_cgroup_dirs, remove_state_dir

BUBBLEWRAP_CGROUP = "bubblewrap+cgroup"
BUBBLEWRAP = "bubblewrap"
RLIMITS_ONLY = "rlimits-only"
LEVELS = (BUBBLEWRAP_CGROUP, BUBBLEWRAP, RLIMITS_ONLY)

SANDBOX_WORKDIR = "/sandbox"
SANDBOX_UID = 1000
STATE_ROOT = Path(tempfile.gettempdir()) / f"turngym-sandbox-{os.geteuid()}"


# ---------------------------------------------------------------- bubblewrap


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@dataclass(frozen=True)
class InterpreterView:
    """What the sandbox shows of one interpreter: the directories it reads (its prefixes and the
    import path it has when started as the worker is: ``-I``, no PYTHONPATH, no script folder;
    nested ones folded), and the turngym package folders to hide inside them (a wheel install
    ships the benchmarks' gold answers under ``turngym/data``; the worker needs none of it)."""

    trees: tuple[str, ...]
    hidden: tuple[str, ...]


# this interpreter as a sandbox runs it: absolute and without "..", which the kernel resolves through every folder
# named before it, folders the sandbox's view may not hold (``../.venv/bin/python`` run from a subfolder failed)
PYTHON = os.path.abspath(sys.executable)

_VIEW_PROBE = """\
import importlib.util, json, os, sys
spec = importlib.util.find_spec("turngym")
pkgs = list(spec.submodule_search_locations or []) if spec else []
print(json.dumps({"paths": [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                            os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))] + sys.path,
                  "packages": pkgs}))
"""


@functools.cache
def interpreter_view(python: str = PYTHON) -> InterpreterView:
    out = subprocess.run([python, "-I", "-c", _VIEW_PROBE], capture_output=True, text=True, check=True, timeout=60)
    found = json.loads(out.stdout)
    paths = [p for p in found["paths"] if p and os.path.isdir(p)]
    real = sorted({os.path.realpath(p) for p in paths} | {os.path.abspath(p) for p in paths})
    trees: list[str] = []
    for p in real:
        if p != "/" and not any(_within(p, q) for q in trees):
            trees.append(p)
    # this package wherever the interpreter finds it, and wherever the host imported it from
    packages = {os.path.realpath(p) for p in found["packages"]}
    packages |= {os.path.realpath(p) for p in sys.modules["turngym"].__path__} if "turngym" in sys.modules else set()
    hidden = sorted(p for p in packages if os.path.isdir(p) and any(_within(p, t) for t in (*trees, *_SYSTEM_TOPS)))
    return InterpreterView(tuple(trees), tuple(hidden))


def _within(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


_SYSTEM_TOPS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin")


# Syscalls refused inside the sandbox (EPERM), beyond what missing capabilities already stop:
# the kernel keyrings (keys are looked up by serial across user namespaces, and the sandbox's
# uid is the host's when bubblewrap runs as root), ptrace, perf events, BPF, userfaultfd and
# io_uring (large kernel attack surface no code cell needs), and the kernel log (syslog).
_DENIED_SYSCALLS = {
    "x86_64": (0xC000003E, {"add_key": 248, "request_key": 249, "keyctl": 250, "ptrace": 101, "perf_event_open": 298,
                            "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
                            "io_uring_register": 427, "syslog": 103}),
    "aarch64": (0xC00000B7, {"add_key": 217, "request_key": 218, "keyctl": 219, "ptrace": 117, "perf_event_open": 241,
                             "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
                             "io_uring_register": 427, "syslog": 116}),
}


_SOCKET = {"x86_64": 41, "aarch64": 198}
AF_VSOCK = 40


def seccomp_program(machine: str | None = None) -> bytes | None:
    """A classic-BPF seccomp filter (the bytes ``bwrap --seccomp`` reads) that refuses the
    syscalls above, AF_VSOCK sockets and any other ABI than the native one (x32, 32-bit); None
    on other machines."""
    import platform

    machine = machine or platform.machine()
    if machine not in _DENIED_SYSCALLS:
        return None
    arch, numbers = _DENIED_SYSCALLS[machine]
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    prog: list[tuple[int, int | str, int, int]] = [(ld_abs, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, deny),
                                                   (ld_abs, 0, 0, 0)]
    if machine == "x86_64":
        prog.append((jge, "deny", 0, 0x40000000))  # the x32 ABI
    prog += [(jeq, "deny", 0, nr) for nr in sorted(numbers.values())]
    # socket(AF_VSOCK, ...): the one address family a network namespace does not cut off from the host
    prog += [(jeq, 0, 2, _SOCKET[machine]), (ld_abs, 0, 0, 16), (jeq, "deny", 0, AF_VSOCK)]
    prog += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    deny_at = len(prog) - 1
    out = b""
    for i, (code, jt, jf, k) in enumerate(prog):
        jt = deny_at - (i + 1) if jt == "deny" else jt
        out += struct.pack("=HBBI", code, jt, jf, k)
    return out


def seccomp_fd() -> int | None:
    """A fresh descriptor holding the seccomp program, for one bwrap start (bwrap reads it)."""
    prog = seccomp_program()
    if prog is None:
        return None
    fd = os.memfd_create("turngym-seccomp", os.MFD_CLOEXEC)
    os.write(fd, prog)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def bwrap_command(bwrap: str, disk_bytes: int, seccomp: int | None = None, python: str = PYTHON,
                  staged: dict[str, str] | None = None) -> list[str]:
    """The ``bwrap`` prefix for one worker of interpreter ``python``: namespaces, a read-only
    system, private tmpfs mounts, the turngym package hidden, and the seccomp filter read from
    descriptor ``seccomp`` (which the caller passes on). ``staged`` maps an interpreter tree to
    the folder it is bound from (see :func:`identity_prefix`)."""
    view = interpreter_view(python)
    staged = staged or {}
    args = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--die-with-parent", "--new-session", "--hostname", "sandbox", "--cap-drop", "ALL"]
    for top in _SYSTEM_TOPS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        if os.path.exists(etc):
            args += ["--ro-bind", etc, etc]
    size = str(int(disk_bytes))
    args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    if os.path.exists("/proc/sysrq-trigger"):
        args += ["--ro-bind", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
    args += ["--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
             "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", SANDBOX_WORKDIR]
    # after the tmpfs mounts (bwrap mounts in order): an interpreter or venv under /tmp stays visible
    for tree in view.trees:
        if not tree.startswith(("/usr/", "/lib")):
            args += ["--ro-bind", staged.get(tree, tree), tree]
    for pkg in view.hidden:  # an empty read-only folder over it (bwrap mounts in order: after the binds)
        args += ["--size", "4096", "--perms", "0555", "--tmpfs", pkg, "--remount-ro", pkg]
    args += ["--remount-ro", "/", "--chdir", SANDBOX_WORKDIR]
    if seccomp is not None:
        args += ["--seccomp", str(seccomp)]
    return args + ["--"]


@functools.cache
def bwrap_probe(bwrap: str) -> str | None:
    """None when bubblewrap can start the interpreter here as an unprivileged host uid, else why not."""
    fd = seccomp_fd()
    claim = UidClaim() if os.geteuid() == 0 else None
    try:
        prefix, staged = identity_prefix(claim.uid if claim else None)
        code = "import os,time; print(os.getuid(), flush=True); time.sleep(30)"
        cmd = prefix + bwrap_command(bwrap, 1 << 20, fd, staged=staged) + [PYTHON, "-I", "-c", code]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                                pass_fds=() if fd is None else (fd,), start_new_session=True)
    except (OSError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        if fd is not None:
            os.close(fd)
    try:
        line = proc.stdout.readline().strip() if proc.stdout else ""
        # the sandbox's own processes, seen from the host: none may be root
        uids = {p.uids().real for p in _tree(proc.pid)}
    finally:
        err = _kill_tree(proc)
        if claim is not None:
            claim.release()
    if line != str(SANDBOX_UID):
        return (err.strip() or f"exit status {proc.returncode}").splitlines()[-1]
    if 0 in uids or not uids:
        return "the sandbox would run as host uid 0 (refused: a sandbox never runs as host root)"
    return None


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _kill_tree(proc: subprocess.Popen) -> str:
    """Kill the probe and everything under it, then return what it wrote to stderr (read once the tree is dead,
    so the read cannot block; the caller's reason when the probe failed) and close its pipes."""
    for p in _tree(proc.pid):
        try:
            p.kill()
        except psutil.Error:
            pass
    proc.wait()
    err = proc.stderr.read() if proc.stderr is not None else ""
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()
    return err


# ---------------------------------------------------------------- identity (started by root)

STAGE_SCRIPT = """set -e
root=$1; shift
mount -t tmpfs -o size=64k,mode=0755 turngym-view "$root"
i=0
while [ "$1" != "--" ]; do
  mkdir "$root/$i"; mount --bind "$1" "$root/$i"; mount -o remount,bind,ro "$root/$i"
  i=$((i+1)); shift
done
shift
exec "$@"
"""


def stage_folder() -> Path:
    """A root-owned, world-readable empty folder: the mount point of the staging tmpfs, which
    exists only inside each worker's private mount namespace."""
    path = Path(tempfile.gettempdir()) / "turngym-sandbox-view"
    path.mkdir(mode=0o755, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise RuntimeError(f"{path} is not a root-owned folder that only root can write; remove it and retry")
    os.chmod(path, 0o755)
    return path


def hidden_from_others(path: str) -> bool:
    """True when a folder on the way to ``path`` cannot be searched by other users (e.g. /root)."""
    parts = Path(path).parts
    for i in range(2, len(parts) + 1):
        try:
            if not os.stat(Path(*parts[:i])).st_mode & 0o001:
                return True
        except OSError:
            return True
    return False


def identity_prefix(uid: int | None, python: str = PYTHON) -> tuple[list[str], dict[str, str]]:
    """The command that starts bwrap as host uid ``uid`` (None: as whoever runs this, never root),
    and the staged source of each interpreter tree that uid could not reach.

    Root only: a private mount namespace where those trees are bound read-only under
    :func:`stage_folder`, then ``setpriv`` to ``uid`` with no groups and no capabilities."""
    if uid is None:
        if os.geteuid() == 0:
            raise RuntimeError("refusing to start a sandbox as host root: no unprivileged uid was given")
        return [], {}
    if uid == 0:
        raise RuntimeError("refusing to start a sandbox as host uid 0")
    tools = {t: shutil.which(t) for t in ("unshare", "mount", "setpriv")}
    for tool, path in tools.items():
        if path is None:
            raise RuntimeError(f"util-linux {tool} is missing (needed to run the sandbox as an unprivileged uid)")
    drop = [tools["setpriv"], f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--"]
    hidden = [t for t in interpreter_view(python).trees if hidden_from_others(t)]
    if not hidden:
        return drop, {}
    root = str(stage_folder())
    staged = {t: f"{root}/{i}" for i, t in enumerate(hidden)}
    return [tools["unshare"], "--mount", "--propagation", "private", "--", "/bin/sh", "-c", STAGE_SCRIPT, "sh", root,
            *hidden, "--", *drop], staged


# ---------------------------------------------------------------- cgroups


@dataclass(frozen=True)
class CgroupParents:
    """Where this process may create worker cgroups: one directory (v2) or one per controller (v1)."""

    version: str  # "v2" | "v1"
    memory: Path
    pids: Path
    freezer: Path | None = None  # v1 only: the freezer hierarchy's parent, where it is available (v2 has cgroup.freeze)


def _own_cgroup_paths() -> dict[str, str]:
    out = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    except (OSError, ValueError):
        pass
    return out


def _enable_v2_controllers(parent: Path) -> str | None:
    """Enable memory and pids for the children of ``parent``; None on success, else why not."""
    try:
        available = (parent / "cgroup.controllers").read_text().split()
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        return f"cgroup v2: cannot read {parent}: {exc.strerror}"
    for ctl in ("memory", "pids"):
        if ctl in enabled:
            continue
        if ctl not in available:
            return f"cgroup v2: the {ctl} controller is not available in {parent}"
        try:
            (parent / "cgroup.subtree_control").write_text(f"+{ctl}")
        except OSError as exc:
            return f"cgroup v2: cannot enable the {ctl} controller in {parent}: {exc.strerror}"
    return None


def _try_mkdir(parent: Path) -> str | None:
    probe = parent / f"turngym-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
        return None
    except OSError as exc:
        return f"cannot create a cgroup under {parent}: {exc.strerror}"


@functools.cache
def cgroup_parents() -> tuple[CgroupParents | None, str]:
    """Find writable memory and pids cgroups below this process's own; (None, reason) if none."""
    root = Path("/sys/fs/cgroup")
    own = _own_cgroup_paths()
    if (root / "cgroup.controllers").exists():  # unified hierarchy
        own_dir = root / own.get("", "/").lstrip("/")
        why = "cgroup v2: no cgroup to create workers under"
        # our own cgroup first; its parent (workers as siblings of this process's cgroup) where the
        # no-internal-processes rule forbids enabling controllers in a cgroup that holds us
        for parent in (own_dir, own_dir.parent):
            if parent != root and root not in parent.parents:
                continue
            why = _enable_v2_controllers(parent) or _try_mkdir(parent)
            if why is None:
                where = "below this process's cgroup" if parent == own_dir else "beside this process's cgroup"
                return CgroupParents("v2", parent, parent), f"cgroup v2 (memory, pids, freeze), {where}"
        return None, why
    mem, pids = root / "memory", root / "pids"
    if not ((mem / "cgroup.procs").exists() and (pids / "cgroup.procs").exists()):
        return None, "no cgroup v2 memory+pids controllers and no cgroup v1 memory and pids hierarchies"
    mem_parent = mem / own.get("memory", "/").lstrip("/")
    pids_parent = pids / own.get("pids", "/").lstrip("/")
    for parent in (mem_parent, pids_parent):
        why = _try_mkdir(parent)
        if why:
            return None, why
    freezer_parent = root / "freezer" / own.get("freezer", "/").lstrip("/")
    if (root / "freezer" / "cgroup.procs").exists() and _try_mkdir(freezer_parent) is None:
        return CgroupParents("v1", mem_parent, pids_parent, freezer_parent), "cgroup v1 (memory, pids, freezer)"
    return CgroupParents("v1", mem_parent, pids_parent), "cgroup v1 (memory, pids; no freezer)"


class WorkerCgroup:
    """One cgroup (v2) or one per controller (v1) for one worker's whole process tree."""

    def __init__(self, parents: CgroupParents, name: str, memory_bytes: int, processes: int):
        self.version = parents.version
        self.final_peak: int | None = None
        freeze_file: Path | None = None
        if parents.version == "v2":
            self.dirs = [parents.memory / name]
            freeze_file = self.dirs[0] / "cgroup.freeze"
        else:
            self.dirs = [parents.memory / name, parents.pids / name]
            if parents.freezer is not None:
                self.dirs.append(parents.freezer / name)
                freeze_file = self.dirs[-1] / "freezer.state"
        self._freeze_fd: int | None = None
        try:
            self._create(memory_bytes, processes)
            if freeze_file is not None:
                # held open: a cell's thaw and freeze are two writes, not two opens of a cgroup file; the host's
                # descriptors are never inherited (the worker is started with its two pipes only)
                self._freeze_fd = os.open(freeze_file, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            remove_cgroup_dirs(self.dirs)
            raise

    def _create(self, memory_bytes: int, processes: int) -> None:
        for d in self.dirs:
            d.mkdir()
        mem, pids = self.dirs[0], self.dirs[0 if self.version == "v2" else 1]
        if self.version == "v2":
            (mem / "memory.max").write_text(str(memory_bytes))
            if (mem / "memory.swap.max").exists():
                (mem / "memory.swap.max").write_text("0")
        else:
            (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
            if (mem / "memory.memsw.limit_in_bytes").exists():
                try:
                    (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                except OSError:
                    pass
        (pids / "pids.max").write_text(str(processes))

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def peak_memory(self) -> int | None:
        name = "memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"
        try:
            return int((self.dirs[0] / name).read_text())
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int:
        try:
            if self.version == "v2":
                text = (self.dirs[0] / "memory.events").read_text()
                return int(dict(line.split() for line in text.splitlines()).get("oom_kill", 0))
            text = (self.dirs[0] / "memory.oom_control").read_text()
            return int(dict(line.split() for line in text.splitlines()).get("oom_kill", 0))
        except (OSError, ValueError):
            return 0

    def freeze(self, frozen: bool) -> None:
        """Stop (or resume) every process of the worker: between cells nothing a cell left
        behind (a thread, a child it forks later) gets any CPU time."""
        if self._freeze_fd is None:
            return
        value = (b"1" if frozen else b"0") if self.version == "v2" else (b"FROZEN" if frozen else b"THAWED")
        os.pwrite(self._freeze_fd, value, 0)

    def kill_and_remove(self) -> None:
        """Kill what is left in it and remove it; its peak memory stays readable as ``final_peak``."""
        self.final_peak = self.peak_memory()
        if self._freeze_fd is not None:
            os.close(self._freeze_fd)
            self._freeze_fd = None
        remove_cgroup_dirs(self.dirs)


# ---------------------------------------------------------------- per-host state and stale clean-up


def _start_ticks(pid: int) -> int | None:
    try:
        return int(psutil.Process(pid).create_time() * 100)
    except psutil.Error:
        return None


class HostState:
    """This process's folder of sandbox state: rlimits-only working directories and one record per
    live worker cgroup (removed when the worker ends, so the folder does not grow). Named after
    the host's pid and start time, so the next start can tell a folder whose owner is gone
    (killed without clean-up) and remove what it lists."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.dir = private_state_root() / f"host-{pid}-{_start_ticks(pid)}"
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self._cgroups = self.dir / "cgroups"
        self._cgroups.mkdir(mode=0o700, exist_ok=True)
        atexit.register(self.remove)  # registered before any pool's close, so it runs after them
        self._watchdog = _start_watchdog(self.dir)

    def remove(self) -> None:
        """At exit: whatever workers are still alive go, with their cgroups and this folder."""
        if os.getpid() == int(self.dir.name.split("-")[1]):
            remove_state_dir(self.dir)

    def record_cgroup(self, name: str, dirs: list[Path]) -> None:
        (self._cgroups / name).write_text("".join(f"{d}\n" for d in dirs))

    def forget_cgroup(self, name: str) -> None:
        (self._cgroups / name).unlink(missing_ok=True)

    def recorded_cgroups(self) -> list[Path]:
        return recorded_cgroups(self.dir)

    def workdir(self) -> str:
        return tempfile.mkdtemp(prefix="work-", dir=self.dir)


def _start_watchdog(state_dir: Path) -> subprocess.Popen:
    """The reaper that removes this host's workers when the host ends, however it ends (see
    :mod:`turngym.sandbox._reaper`): it holds the read end of a pipe only this process writes to."""
    source = Path(__file__).with_name("_reaper.py").read_text()
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", source, str(state_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            close_fds=True)


def private_state_root(root: Path = STATE_ROOT) -> Path:
    """The per-user state folder, refused unless it is a real folder that only we own (in a
    shared temp folder another user could have planted a link there)."""
    root.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise RuntimeError(f"{root} is not a private folder of this user; remove it and retry")
    return root


_HOST_STATE: dict[int, HostState] = {}


def host_state() -> HostState:
    """The state folder of this process (a forked child gets its own)."""
    pid = os.getpid()
    if pid not in _HOST_STATE:
        _HOST_STATE[pid] = HostState()
    return _HOST_STATE[pid]


def clean_stale_state(root: Path = STATE_ROOT) -> list[str]:
    """Remove the sandbox folders and cgroups of hosts that are gone; returns what was removed."""
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for entry in sorted(private_state_root(root).iterdir()):
        parts = entry.name.split("-")
        if len(parts) != 3 or parts[0] != "host" or not parts[1].isdigit():
            continue
        pid, ticks = int(parts[1]), parts[2]
        if str(_start_ticks(pid)) == ticks:
            continue  # its owner still runs
        removed += remove_state_dir(entry)
    return removed + _remove_unheld_uid_locks(root / "uids")


def _remove_unheld_uid_locks(lock_dir: Path) -> list[str]:
    """Lock files of uid claims no live worker holds (a killed host's, or older versions')."""
    removed = []
    for path in sorted(lock_dir.iterdir()) if lock_dir.is_dir() else []:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink()  # held locked: a claimer that opened it meanwhile sees another inode and moves on
            removed.append(str(path))
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


# ---------------------------------------------------------------- throwaway identities (started by root)


class UidClaim:
    """A throwaway uid held by one live worker (bubblewrap started by root): claimed by an
    exclusive lock on a file, so no two live workers on this machine, in any process, share one;
    the kernel drops the lock when its holder dies. Release deletes the file (while still
    holding the lock); a claim counts only if its locked file is still the one at the path."""

    BASE = 200000
    SPAN = 1 << 16

    def __init__(self) -> None:
        lock_dir = private_state_root() / "uids"
        lock_dir.mkdir(mode=0o700, exist_ok=True)
        start = (os.getpid() * 97 + time.monotonic_ns()) % self.SPAN
        for k in range(self.SPAN):
            uid = self.BASE + (start + k) % self.SPAN
            path = lock_dir / str(uid)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = os.fstat(fd)
                now = os.stat(path)  # a releasing holder may have deleted the file we locked
                if (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino):
                    raise OSError("stale lock file")
            except OSError:
                os.close(fd)
                continue
            self.uid, self._fd, self.path = uid, fd, path
            return
        raise RuntimeError("no free sandbox uid")

    def release(self) -> None:
        if self._fd >= 0:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = -1
