"""Stage lines and counted stages with an ETA, shared by the commands and the library parts that report
progress (the trainer's per-step callback, the scribe commands): a library module, so nothing below the CLI
imports the CLI to print a line.

Under ``accelerate launch`` every process runs the same code; a clock made with ``main_only`` prints only on
the main process (:func:`is_main_process`), so a stage is said once, not once per GPU.
"""

from __future__ import annotations

import os
import sys
import time


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def is_main_process() -> bool:
    """Whether this is the job's first process: global rank 0 as ``RANK`` says (torchrun and ``accelerate
    launch`` set it for every process they start; a plain ``python`` run has none and is the main process)."""
    return int(os.environ.get("RANK", "0")) == 0


def span(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``: an ETA a person reads at a glance."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def count_text(label: str, done: int, total: int, spent: float, counted: int, note: str = "") -> str:
    """``label done/total[, note], ETA …``: the ETA is the rate of the ``counted`` units done in ``spent``
    seconds (those done since the count began, so a resumed run's earlier steps do not flatter it) times what
    is left; none before the first unit or after the last."""
    text = f"{label} {done}/{total}" + (f", {note}" if note else "")
    if counted > 0 and done < total:
        text += f", ETA {span(spent / counted * (total - done))}"
    return text


class Tally:
    """A counted stage: each :meth:`update` prints a line with ``done/total`` and an ETA."""

    def __init__(self, clock: StageClock, label: str, total: int, done: int = 0) -> None:
        self.clock, self.label, self.total, self.first = clock, label, total, done
        self.began = time.perf_counter()

    def update(self, done: int, note: str = "") -> None:
        spent = time.perf_counter() - self.began
        self.clock.stage(count_text(self.label, done, self.total, spent, done - self.first, note), keep_label=True)


class StageClock:
    """Stage lines stamped with the seconds since the command started; with ``main_only``, printed only by
    the main process of a multi-process launch."""

    def __init__(self, main_only: bool = False) -> None:
        self.t0 = time.perf_counter()
        self.label = ""
        self.quiet = main_only and not is_main_process()
        self._tally: Tally | None = None

    def stage(self, text: str, keep_label: bool = False) -> None:
        if not keep_label:
            self.label = text.rstrip(".…")
        if not self.quiet:
            say(f"[{time.perf_counter() - self.t0:6.1f} s] {text}")

    def tally(self, label: str, total: int, done: int = 0) -> Tally:
        return Tally(self, label, total, done)

    def count(self, done: int, total: int) -> None:
        """A ``(done, total)`` hook (e.g. an LLM's replies): ``(0, total)`` starts a count under the current
        stage's name and prints nothing; each later call prints the count's line."""
        if done == 0 or self._tally is None or self._tally.total != total:
            self._tally = self.tally(f"{self.label}: replies", total)
        if done:
            self._tally.update(done)
