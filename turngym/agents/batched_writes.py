"""Finished episodes written in batches, never lost: each episode one write of its whole line, one fsync per
batch (writing an episode at a time was a third of a busy client's CPU), flushed when the batch is full or
its oldest episode has waited ``flush_s``, and always on exit, on error and on SIGTERM.

SIGTERM (a scheduler stopping the job) would end Python without running ``finally`` blocks; during the run
the handler turns it into ``SystemExit(143)`` (or runs the handler that was there, e.g. Ray's, which exits
too), never in the middle of a batch's writes, so the runner's ``finally`` flushes what is buffered. A
SIGKILL loses at most the buffered episodes; they were never written, so a rerun plays them (resume skips
only written ids): nothing is lost or written twice either way.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from turngym.episode import Episode, EpisodeWriter

TERMINATED = 128 + signal.SIGTERM  # the exit status of a process ended by SIGTERM


class BatchedWrites:
    """Buffer episodes for ``writer``; use as a context manager around the run."""

    def __init__(self, writer: EpisodeWriter, batch: int = 64, flush_s: float = 0.5):
        self.writer, self.batch, self.flush_s = writer, max(1, int(batch)), float(flush_s)
        self.buffer: list[Episode] = []
        self.oldest = 0.0
        self._writing = False
        self._terminate = False
        self._previous: Any = None  # the SIGTERM handler before the run
        self._installed = False

    def add(self, episode: Episode) -> None:
        if not self.buffer:
            self.oldest = time.perf_counter()
        self.buffer.append(episode)
        if len(self.buffer) >= self.batch or time.perf_counter() - self.oldest >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        """Write every buffered episode now (one fsync for all)."""
        batch, self.buffer = self.buffer, []
        self._writing = True
        try:
            if batch:
                self.writer.write_all(batch)
        finally:
            self._writing = False
        if self._terminate:
            self._terminate = False
            self._terminated(signal.SIGTERM, None)

    def _terminated(self, signum: int, frame: Any) -> None:
        """What SIGTERM did before the run: the handler someone installed (it decides; Ray's exits), else exit 143."""
        if callable(self._previous):
            self._previous(signum, frame)
            return
        raise SystemExit(TERMINATED)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._writing:
            self._terminate = True  # handled once the batch is on disk
        else:
            self._terminated(signum, frame)

    def __enter__(self) -> BatchedWrites:
        # only the main thread may set handlers; one someone installed (Ray's, say) runs after the flush
        previous = signal.getsignal(signal.SIGTERM)
        if threading.current_thread() is threading.main_thread() and previous not in (signal.SIG_IGN, None):
            self._previous = previous
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._terminate = False  # leaving anyway: the flush below must not raise over the run's own exit
            self.flush()
        finally:
            if self._installed:
                signal.signal(signal.SIGTERM, self._previous)
                self._installed, self._previous = False, None
            self.writer.close()


def sink(writer: EpisodeWriter | None, batch: int, flush_s: float) -> tuple[Callable[[Episode], None], Any]:
    """``(write, context)``: where the runner sends each finished episode, and what to enter around the run."""
    if writer is None:
        return (lambda ep: None), _Nothing()
    writes = BatchedWrites(writer, batch, flush_s)
    return writes.add, writes


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
