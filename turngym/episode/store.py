"""Episodes into JSONL files, whole lines only: a process killed mid-write leaves at most a torn *tail*, which
the next writer moves aside (never deletes) before appending.

:class:`BatchedWrites`: finished episodes written in batches, never lost: each episode one write of its whole
line, one fsync per batch (writing an episode at a time was a third of a busy client's CPU), flushed when the
batch is full or its oldest episode has waited ``flush_s``, and always on exit, on error and on SIGTERM.

SIGTERM (a scheduler stopping the job) would end Python without running ``finally`` blocks; during the run
the handler turns it into ``SystemExit(143)`` (or runs the handler that was there, e.g. Ray's, which exits
too), never in the middle of a batch's writes, so the runner's ``finally`` flushes what is buffered. A
SIGKILL loses at most the buffered episodes; they were never written, so a rerun plays them (resume skips
only written ids): nothing is lost or written twice either way.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from turngym.episode.encoding import encode_line
from turngym.episode.record import Episode


class EpisodeWriter:
    """Append-only JSONL writer.

    Each episode is one ``os.write`` of a complete line to an ``O_APPEND`` descriptor,
    followed by fsync, so readers never see half an episode from a finished write. If a
    previous process died mid-write, the torn tail is moved to ``<file>.torn`` (kept for
    inspection) before anything new is appended.
    """

    def __init__(self, path: str | os.PathLike, fsync: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.recovered_tail = self._repair_torn_tail()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _repair_torn_tail(self) -> bytes:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return b""
        with self.path.open("rb+") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            pos, chunk, tail = size, 4096, b""
            while pos > 0:
                step = min(chunk, pos)
                pos -= step
                fh.seek(pos)
                tail = fh.read(step) + tail
                nl = tail.rfind(b"\n")
                if nl >= 0:
                    keep = pos + nl + 1
                    break
            else:
                keep = 0
            if keep == size:
                return b""
            fh.seek(keep)
            torn = fh.read()
            with open(str(self.path) + ".torn", "ab") as side:
                side.write(torn + b"\n")
            fh.truncate(keep)
            return torn

    def write(self, episode: Episode) -> None:
        data = encode_line(episode.to_json())
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        if self.fsync:
            os.fsync(self._fd)

    def write_all(self, episodes: Iterable[Episode]) -> None:
        """Each episode as one write of its whole line (as :meth:`write`), then one fsync for all of them."""
        fsync, self.fsync = self.fsync, False
        try:
            for ep in episodes:
                self.write(ep)
        finally:
            self.fsync = fsync
        if fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
