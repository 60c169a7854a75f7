"""The episodes bar is redrawn at a bounded rate (a redraw per turn cost a busy client a fifth of its CPU), and
its last state is always drawn."""

from __future__ import annotations

import io
import sys

from turngym.cli import _progress
from turngym.episode import Episode, Turn


def test_a_thousand_turns_redraw_the_bar_a_few_times_and_the_end_is_drawn(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    bar = _progress.BarProgress()
    bar.start(10)
    ep = Episode(id="e", env_id="x", turns=[Turn(index=0, action="a")])
    before = err.getvalue().count("\r")
    for _ in range(1000):
        bar.turn(ep)
    for done in range(1, 11):
        bar.episode(done, 10)
    bar.finish()
    text = err.getvalue()
    assert text.count("\r") - before <= 10  # 1,010 updates in well under a second: a handful of redraws
    assert "10/10" in text and "1000 turns" in text  # the final state is on screen


def test_redraws_follow_time(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    clock = iter(x * 0.05 for x in range(10_000))
    monkeypatch.setattr(_progress.time, "perf_counter", lambda: next(clock))
    bar = _progress.BarProgress()
    bar.start(100)
    ep = Episode(id="e", env_id="x", turns=[Turn(index=0, action="a")])
    before = err.getvalue().count("\r")
    for _ in range(40):  # 40 turns, 0.05 s apart: 2 s, so about one redraw per 0.2 s
        bar.turn(ep)
    assert 8 <= err.getvalue().count("\r") - before <= 12
    bar.finish()
