"""Progress from the first second: each stage as a line, then a bar that counts turns as well as episodes.

The bar is made when generation starts (so its elapsed time and ETA are the run's, not the time since the
first episode ended); every finished turn refreshes it, so a slow first episode still shows movement.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from turngym.cli._common import say


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
    """Stage lines stamped with the seconds since the command started."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.label = ""
        self._tally: Tally | None = None

    def stage(self, text: str, keep_label: bool = False) -> None:
        if not keep_label:
            self.label = text.rstrip(".…")
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


class BarProgress(StageClock):
    """``turngym eval`` / ``rollout`` / the main job: stage lines, then an episodes bar with a turn count."""

    def __init__(self, desc: str = "episodes") -> None:
        super().__init__()
        self.desc = desc
        self.bar: Any = None
        self.turns = 0

    def start(self, total: int) -> None:
        from tqdm import tqdm

        self.stage(f"{total} episode(s) in the subset; playing those not yet written")
        self.bar = tqdm(total=total, desc=self.desc, unit="ep", file=sys.stderr, dynamic_ncols=True)
        self.bar.set_postfix_str("0 turns")

    def turn(self, episode: Any) -> None:
        if self.bar is None or not episode.turns:
            return
        self.turns += 1
        self.bar.set_postfix_str(f"{self.turns} turns")  # refreshes: elapsed and rate stay current

    def episode(self, done: int, total: int) -> None:
        if self.bar is None:
            return
        self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class TurnPrinter(StageClock):
    """``turngym play``: the prompt as soon as the episode starts, then each turn as it ends."""

    def start(self, total: int) -> None:
        self.stage("playing")

    def turn(self, episode: Any) -> None:
        from turngym.envs.base import render_messages

        if not episode.turns:
            print(render_messages(episode.prompt), flush=True)
            return
        t = episode.turns[-1]
        print(f"\n--- turn {t.index} [agent] ({t.latency_ms.get('generate', 0):.0f} ms)\n{t.action}", flush=True)
        if t.parse_error:
            print(f"--- [parse error] {t.parse_error}", flush=True)
        if t.observation is not None:
            print(f"--- turn {t.index} [env]\n{t.observation}", flush=True)

    def episode(self, done: int, total: int) -> None:
        pass

    def finish(self) -> None:
        pass
