"""Run a command as an ordinary (unprivileged) user on a machine where the checkout and its interpreter
sit in folders only root can enter (a pyenv under /root): root makes a private mount namespace where
each such folder is replaced by a world-readable tmpfs that keeps just the needed trees, then drops to
the uid with util-linux ``setpriv``. Nothing on the host changes.

``python tests/as_user.py UID CMD...`` runs CMD so (``scripts/test.sh`` runs the sandbox tests this
way when it runs as root, so they pass both as root and as a normal user); the integrity tests import
:func:`as_user_command`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

AS_USER = """set -e
uid=$1; stash=$2; shift 2
mount -t tmpfs -o size=64k,mode=0755 stash "$stash"
i=0
while [ "$1" != "--" ]; do
  anc=$1; shift
  for tree in $1; do mkdir "$stash/$i"; mount --rbind "$tree" "$stash/$i"; i=$((i+1)); done
  mount -t tmpfs -o size=64k,mode=0755 view "$anc"
  j=$((i - $(echo $1 | wc -w)))
  for tree in $1; do mkdir -p "$tree"; mount --rbind "$stash/$j" "$tree"; j=$((j+1)); done
  shift
done
shift
exec setpriv --reuid="$uid" --regid="$uid" --clear-groups --inh-caps=-all -- "$@"
"""


def _closed_ancestor(path: str) -> str | None:
    """The first folder on the way to ``path`` that other users cannot search, or None."""
    parts = Path(path).parts
    for i in range(2, len(parts) + 1):
        if not os.stat(Path(*parts[:i])).st_mode & 0o001:
            return str(Path(*parts[:i]))
    return None


def as_user_command(uid: int, command: list[str]) -> list[str]:
    """``command`` run as ``uid`` with this interpreter and this checkout visible (root only)."""
    from turngym.sandbox import isolation as iso

    if os.geteuid() != 0:
        raise ValueError("only root can start a command as another user")
    repo = str(Path(__file__).resolve().parents[1])
    groups: dict[str, list[str]] = {}
    for tree in sorted(set(iso.interpreter_view().trees) | {repo}):
        anc = _closed_ancestor(tree)
        if anc == tree:
            raise ValueError(f"{tree} itself is closed to other users")
        if anc is not None:
            groups.setdefault(anc, []).append(tree)
    if any(" " in t for kept in groups.values() for t in kept):
        raise ValueError("a tree with a space in its path cannot be staged by this script")
    args = [str(uid), str(iso.stage_folder())]
    for anc, kept in groups.items():
        args += [anc, " ".join(kept)]
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", AS_USER, "sh", *args, "--",
            *command]


def user_env() -> dict[str, str]:
    """A plain environment for the user: its own home and caches under /tmp, no bytecode writes; the
    caller's PYTHONPATH is kept (a checkout that is not the installed one then tests itself)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "TURNGYM_CACHE": "/tmp/turngym-cache-as-user"}
    if os.environ.get("PYTHONPATH"):  # absolute: the command may run in another folder
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(os.pathsep))
    return env


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    uid, cmd = int(sys.argv[1]), sys.argv[2:]
    try:
        staged = as_user_command(uid, cmd)
    except ValueError as exc:  # this machine's layout cannot be shown to another user: say so, do not fail
        print(f"as_user: not run as an ordinary user here: {exc}")
        sys.exit(0)
    sys.exit(subprocess.run(staged, env=user_env(), cwd=str(Path(__file__).resolve().parents[1])).returncode)
