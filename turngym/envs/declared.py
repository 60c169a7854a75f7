"""Reading saved episodes for scoring and viewing: one step shared by every command that does so.

Files written before episodes carried ``reward_needs`` get their registered env class's declaration
(what that env now writes into every episode), so ablate, the viewer and the SCRIBE commands read the
same file the same way and say once that they filled it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence

import gymnasium

from turngym.episode import Episode, ReadReport, read_episodes


def fill_declared_needs(episodes: Sequence[Episode]) -> int:
    """Give each episode without ``reward_needs`` its registered env class's declaration. Envs that are not
    registered are left alone, so a reward that needs the declaration still says so. Returns how many were filled."""
    filled = 0
    for ep in episodes:
        if ep.reward_needs is not None:
            continue
        try:
            entry = gymnasium.spec(ep.env_id).entry_point
        except gymnasium.error.Error:
            continue
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module), attr)
        needs = getattr(entry, "reward_needs", None)
        if needs is not None:
            ep.reward_needs = needs
            filled += 1
    return filled


def load_episodes(path: str | os.PathLike) -> ReadReport:
    """The valid episodes of ``path`` with declared needs filled in; corrupt lines and filled episodes are
    reported once on stdout. Raises ``ValueError`` when the file holds no valid episode."""
    report = read_episodes(path)
    if report.errors:
        print(f"warning: skipped {len(report.errors)} corrupt line(s) in {path} (first: {report.errors[0]})")
    if not report.episodes:
        raise ValueError(f"no valid episodes in {path}")
    filled = fill_declared_needs(report.episodes)
    if filled:
        print(f"note: {filled} episode(s) written before episodes carried reward_needs: their registered env's "
              "declaration is used")
    return report
