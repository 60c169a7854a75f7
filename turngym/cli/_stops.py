"""How a command ends when it is stopped: SIGTERM (a scheduler, ``kill``) exits 143 and Ctrl-C (SIGINT) exits
130, each with one line and no traceback, after the run's writer flushed every finished episode (the writer's
``finally`` runs on the way out: ``turngym.episode.store``). The same in process and under ``--ray``
(the Ray pool keeps this handler across ``ray.init``, whose own would exit 15 at once)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

INTERRUPTED = 128 + signal.SIGINT  # 130
TERMINATED = 128 + signal.SIGTERM  # 143
RESUME = "every finished episode is written; rerun the same command to continue"


class Terminated(SystemExit):
    """SIGTERM arrived: unwinds like ``SystemExit(143)`` (``finally`` blocks flush), caught by :func:`stops`."""

    def __init__(self) -> None:
        super().__init__(TERMINATED)


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


@contextmanager
def stops(say: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True)) -> Iterator[None]:
    """Around a command: SIGTERM raises :class:`Terminated`; either stop ends as one line and its exit status."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _on_sigterm) if main else None
    try:
        yield
    except Terminated:
        say(f"stopped (SIGTERM): {RESUME}")
        raise SystemExit(TERMINATED) from None
    except KeyboardInterrupt:
        say(f"\ninterrupted (Ctrl-C): {RESUME}")
        raise SystemExit(INTERRUPTED) from None
    finally:
        if main and before is not None:
            signal.signal(signal.SIGTERM, before)
