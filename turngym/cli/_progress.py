"""The commands' progress from the first second: each stage as a line (:mod:`turngym.progress`), then a bar
that counts turns as well as episodes (``eval``/``rollout``), or each turn as it ends (``play``).

The bar is made when generation starts (so its elapsed time and ETA are the run's, not the time since the
first episode ended); finished turns refresh it, so a slow first episode still shows movement. It is redrawn
at most ``REFRESH_S`` apart (and once at the end): at hundreds of turns a second, a redraw per turn cost
the client a fifth of its CPU.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from turngym.progress import StageClock

REFRESH_S = 0.2  # the least time between two redraws of the bar


class BarProgress(StageClock):
    """``turngym eval`` / ``rollout`` / the main job: stage lines, then an episodes bar with a turn count."""

    def __init__(self, desc: str = "episodes") -> None:
        super().__init__()
        self.desc = desc
        self.bar: Any = None
        self.turns = 0
        self._drawn = 0.0  # when the bar was last redrawn (perf_counter)

    def start(self, total: int) -> None:
        from tqdm import tqdm

        self.stage(f"{total} episode(s) in the subset; playing those not yet written")
        self.bar = tqdm(total=total, desc=self.desc, unit="ep", file=sys.stderr, dynamic_ncols=True)
        self.bar.set_postfix_str("0 turns")

    def turn(self, episode: Any) -> None:
        if self.bar is None or not episode.turns:
            return
        self.turns += 1
        self.bar.set_postfix_str(f"{self.turns} turns", refresh=False)
        self._redraw()

    def episode(self, done: int, total: int) -> None:
        if self.bar is None:
            return
        self.bar.total = total
        self.bar.n = done
        self._redraw(final=done >= total)

    def _redraw(self, final: bool = False) -> None:
        """Redraw (elapsed and rate stay current) unless the last redraw is under ``REFRESH_S`` old."""
        now = time.perf_counter()
        if final or now - self._drawn >= REFRESH_S:
            self._drawn = now
            self.bar.refresh()

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.refresh()
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
