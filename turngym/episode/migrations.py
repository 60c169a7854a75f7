"""Older episode records brought up to today's: one migration per format turngym has written.

Files say ``schema_version``; before version 4 every file said 1, so the version of a record labelled 1 is
told from what it holds (:func:`record_version`). Each later format is reached by one migration in
:data:`MIGRATIONS`, applied in order. A migration fills what an older record lacks from what its registered
env class declares today (what that env now writes into such an episode), and leaves an episode of an env
that is not registered as it is: a reward that needs what is missing then says so (:meth:`Episode.needs`).
Nothing is guessed for an undeclared key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from turngym.episode.needs import LATER_NEEDS, RewardNeeds
from turngym.episode.record import SCHEMA_VERSION, Episode
from turngym.truth import TruthValue


class EnvDeclarations:
    """What the migrations read of an env class: what it writes into its episodes today. Declared here, below
    the envs (``turngym.envs.base.TextEnv`` is one), so the reader reaches up to no later stage."""

    truth_keys: tuple[str, ...]

    @classmethod
    def declared_needs(cls, episode: Episode) -> RewardNeeds | None:
        raise NotImplementedError


EnvClass = type[EnvDeclarations] | None


@dataclass(frozen=True)
class Migration:
    """One step from a record's format to the next: what changed, and how an older episode is brought up.

    ``upgrade(episode, env_class)`` returns True when it changed the episode (``env_class``: the episode's
    registered env class, None when not registered). ``note``: said once per read, with the count of
    episodes it changed; migrations that fill the same thing share a note."""

    to_version: int
    change: str
    note: str
    upgrade: Callable[[Episode, EnvClass], bool]


def _declared_needs(episode: Episode, env: EnvClass) -> bool:
    """Version 1 → 2: episodes carry the env's ``reward_needs``; an older one gets its env's declaration."""
    needs = env.declared_needs(episode) if env is not None and episode.reward_needs is None else None
    if needs is None:
        return False
    episode.reward_needs = needs
    return True


def _truth_from_metrics(episode: Episode, env: EnvClass) -> bool:
    """Version 2 → 3: turns carry ``truth``; an older episode's truth keys (the env's ``truth_keys``) were
    recorded in its metrics, and creditbench's planted label in ``planted_label``."""
    if any(t.truth for t in episode.turns):
        return False
    keys = env.truth_keys if env is not None else ()
    got = False
    for t in episode.turns:
        for k in keys:
            v = t.metrics.get(k)
            if isinstance(v, (bool, int, float, str)):
                t.truth[k] = TruthValue(v, "env")
                got = True
        if episode.meta.get("planted") and t.metrics.get("planted_label") is not None:
            t.truth["planted"] = TruthValue(t.metrics["planted_label"], "planted")
            got = True
    return got


def _later_needs(episode: Episode, env: EnvClass) -> bool:
    """Version 3 → 4: ``reward_needs`` gains the checker and user-turn fields (``LATER_NEEDS``); a declaration
    read without them lists them in ``predates`` and gets them from its env."""
    old = episode.reward_needs
    if old is None or not old.predates or env is None:
        return False
    needs = env.declared_needs(episode)
    if needs is None:
        return False
    episode.reward_needs = dataclasses.replace(old, **{f: getattr(needs, f) for f in old.predates}, predates=())
    return True


_NEEDS_NOTE = ("written before episodes carried reward_needs (or all its fields): their registered env's "
               "declaration is used for what they lack")

# version → the migration from it to the next; one per format turngym has written
MIGRATIONS: dict[int, Migration] = {
    1: Migration(2, "episodes carry the env's reward_needs (answer kind and cue, tool metrics)", _NEEDS_NOTE,
                 _declared_needs),
    2: Migration(3, "turns carry truth; the env's truth keys left the metrics",
                 "written before turns carried truth: the truth keys their registered env declares were read "
                 "from their metrics", _truth_from_metrics),
    3: Migration(4, f"reward_needs gains {', '.join(LATER_NEEDS)}", _NEEDS_NOTE, _later_needs),
}


def record_version(record: dict) -> int:
    """The format of one episode record (a JSON object of an episodes file).

    From version 4 on, its ``schema_version``. Files of versions 1–3 were all labelled 1, so a record
    labelled 1 (or not at all) is dated by what it holds: no ``reward_needs`` (or null) → 1; turns without a ``truth``
    field → 2; a declaration without the ``LATER_NEEDS`` fields → 3; else 4, today's record under the old
    label."""
    label = record.get("schema_version", 1)
    if isinstance(label, bool) or not isinstance(label, int) or label < 1:
        raise ValueError(f"schema_version must be a positive integer, got {label!r}")
    if label > SCHEMA_VERSION:
        raise ValueError(f"episode schema_version {label} is newer than this turngym understands "
                         f"({SCHEMA_VERSION}); upgrade turngym")
    if label > 1:
        return label
    if record.get("reward_needs") is None:  # absent, or null in a file re-written by a turngym that read none
        return 1
    if any(isinstance(t, dict) and "truth" not in t for t in record.get("turns") or ()):
        return 2
    needs = record["reward_needs"]
    if isinstance(needs, dict) and any(f not in needs for f in LATER_NEEDS):
        return 3
    return 4
