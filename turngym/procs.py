"""Starting helper processes that die with this one.

The kernel's parent-death signal (``PR_SET_PDEATHSIG``, bwrap's ``--die-with-parent``) fires
when the *thread* that started a child ends, not the process; pools refill from short-lived
threads. So every such child is started from one long-lived thread per process.
"""

from __future__ import annotations

import os
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

_SPAWNERS: dict[int, ThreadPoolExecutor] = {}
_SPAWNERS_LOCK = threading.Lock()


def spawn(args: list[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(args, **kwargs)``, started from this process's spawner thread."""
    with _SPAWNERS_LOCK:
        ex = _SPAWNERS.get(os.getpid())
        if ex is None:
            ex = _SPAWNERS[os.getpid()] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="turngym-spawn")
    return ex.submit(subprocess.Popen, args, **kwargs).result()
