"""Reading saved episodes for scoring and viewing: one step shared by every command that does so.

Files written before episodes carried ``reward_needs``, or before it had all its fields, get their
registered env class's declaration for what they lack (what that env now writes into such an
episode), so ablate, the viewer and the SCRIBE commands read the same file the same way and say
once that they filled it. Files written before turns carried ``truth`` get the truth keys their
registered env declares (``truth_keys``) copied from the turns' metrics, where those envs used to
record them (source "env"); nothing is guessed for an undeclared key.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import gymnasium

from turngym.envs.base import TextEnv
from turngym.episode import Episode, ReadReport, read_episodes
from turngym.registry import resolve


def _env_class(env_id: str) -> type[TextEnv] | None:
    """The registered TextEnv class of ``env_id`` (None: not registered, or not a TextEnv)."""
    try:
        entry = gymnasium.spec(env_id).entry_point
    except gymnasium.error.Error:
        return None
    if isinstance(entry, str):
        entry = resolve(entry)
    return entry if isinstance(entry, type) and issubclass(entry, TextEnv) else None


def fill_declared_truth(episodes: Sequence[Episode]) -> int:
    """Episodes with no truth on any turn: the keys their registered env declares, copied from metrics
    (older files recorded them there). Returns how many episodes got truth."""
    from turngym.truth import TruthValue

    filled = 0
    for ep in episodes:
        if any(t.truth for t in ep.turns):
            continue
        cls = _env_class(ep.env_id)
        keys = cls.truth_keys if cls is not None else ()
        got = False
        for t in ep.turns:
            for k in keys:
                v = t.metrics.get(k)
                if isinstance(v, (bool, int, float, str)):
                    t.truth[k] = TruthValue(v, "env")
                    got = True
            if ep.meta.get("planted") and t.metrics.get("planted_label") is not None:  # older creditbench files
                t.truth["planted"] = TruthValue(t.metrics["planted_label"], "planted")
                got = True
        filled += got
    return filled


def fill_declared_needs(episodes: Sequence[Episode]) -> int:
    """Give each episode without ``reward_needs`` its registered env class's declaration for it
    (:meth:`TextEnv.declared_needs`), and one whose declaration predates some of its fields those fields.
    Episodes of envs that are not registered, or that cannot tell, are left alone, so a reward that needs
    the declaration still says so. Returns how many were filled."""
    filled = 0
    for ep in episodes:
        old = ep.reward_needs
        if old is not None and not old.predates:
            continue
        cls = _env_class(ep.env_id)
        needs = cls.declared_needs(ep) if cls is not None else None
        if needs is None:
            continue
        ep.reward_needs = needs if old is None else \
            dataclasses.replace(old, **{f: getattr(needs, f) for f in old.predates}, predates=())
        filled += 1
    return filled


def fill_needs(episodes: list[Episode]) -> list[Episode]:
    """``episodes``, with :func:`fill_declared_needs` applied (for a caller that reads them itself)."""
    fill_declared_needs(episodes)
    return episodes


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
        print(f"note: {filled} episode(s) written before episodes carried reward_needs (or all its fields): their "
              "registered env's declaration is used for what they lack")
    truth = fill_declared_truth(report.episodes)
    if truth:
        print(f"note: {truth} episode(s) written before turns carried truth: the truth keys their registered env "
              "declares were read from their metrics")
    return report
