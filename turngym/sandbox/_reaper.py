"""Removing a sandbox host's workers: thaw and kill what is left in its cgroups, remove its state folder.

Standard library only: :mod:`turngym.sandbox.isolation` calls it in-process (a worker's end, the
host's exit, the next start's clean-up of killed hosts), and each host process also starts it as a
watchdog, ``python -I -S -c SOURCE STATE_DIR``, that waits for the host's end of a pipe to close and
then removes what the host left. So a host killed with SIGKILL while its workers sit frozen between
cells (frozen tasks take no signal, and bwrap's die-with-parent is frozen with them) leaves nothing
running.
"""

import os
import shutil
import signal
import sys
import time
from pathlib import Path


def remove_cgroup_dirs(dirs: list[Path]) -> None:
    """SIGKILL every process left in these cgroups, then remove them."""
    for d in dirs:  # frozen tasks (v1) take no signal until thawed
        for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
            if (d / name).exists():
                try:
                    (d / name).write_text(value)
                except OSError:
                    pass
    for _ in range(100):
        left = False
        for d in dirs:
            if not d.exists():
                continue
            if (d / "cgroup.kill").exists():
                try:
                    (d / "cgroup.kill").write_text("1")
                except OSError:
                    pass
            try:
                pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                d.rmdir()
            except OSError:
                left = True
        if not left:
            return
        time.sleep(0.02)


def remove_state_dir(entry: Path) -> list[str]:
    removed = []
    dirs = recorded_cgroups(entry)
    if dirs:
        remove_cgroup_dirs([d for d in dirs if d.exists()])
        removed += [str(d) for d in dirs]
    make_writable(entry)
    shutil.rmtree(entry, ignore_errors=True)
    return removed + [str(entry)]


def recorded_cgroups(state_dir: Path) -> list[Path]:
    """The cgroups a host's state folder lists: one file per worker (a single file in older versions)."""
    where = state_dir / "cgroups"
    files = sorted(where.iterdir()) if where.is_dir() else [where] if where.exists() else []
    return [Path(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def make_writable(tree: Path) -> None:
    """A cell may have left read-only folders; the owner of the tree (root or us) can fix that."""
    for dirpath, dirnames, _ in os.walk(tree):
        for d in dirnames:
            try:
                os.chmod(os.path.join(dirpath, d), 0o700)
            except OSError:
                pass


def main():
    state_dir = Path(sys.argv[1])
    while sys.stdin.buffer.read(65536):  # the host never writes: EOF is the host's end
        pass
    if state_dir.is_dir():
        remove_state_dir(state_dir)


if __name__ == "__main__":
    main()
