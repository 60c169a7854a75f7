"""The one reader of saved episodes: a record of every schema version turngym has written, read as today's.

Every command that reads an episodes file (view, ablate, scribe, creditbench, the Monte-Carlo oracle, the
main job, eval's merge and resume, trackers) goes through :func:`read_episodes`, so a file reads the same
everywhere. Files say ``schema_version``; before version 4 every file said 1, so the version of a record
labelled 1 is told from what it holds (:func:`record_version`). Each later format is reached by one
migration in :data:`MIGRATIONS`, applied in order. A migration fills what an older record lacks from what
its registered env class declares today (what that env now writes into such an episode), and leaves an
episode of an env that is not registered as it is: a reward that needs what is missing then says so
(:meth:`Episode.needs`). Nothing is guessed for an undeclared key.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium

from turngym.envs.base import TextEnv
from turngym.episode import LATER_NEEDS, SCHEMA_VERSION, Episode, EpisodeFileError, read_records
from turngym.registry import resolve
from turngym.truth import TruthValue

EnvClass = type[TextEnv] | None


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


@dataclass
class ReadReport:
    """What :func:`read_episodes` read: today's episodes, the lines that are not episodes, how many episodes
    each migration changed (by the version it led to), and how many each note covers (an episode once)."""

    path: Path
    episodes: list[Episode]
    errors: list[EpisodeFileError]
    upgraded: dict[int, int] = field(default_factory=dict)
    noted: dict[str, int] = field(default_factory=dict)

    def notes(self) -> list[str]:
        """One line per note of the migrations that changed an episode."""
        return [f"{n} episode(s) {note}" for note, n in self.noted.items()]

    def skipped(self) -> str | None:
        """The corrupt lines, in one line (None: there were none)."""
        if not self.errors:
            return None
        return f"skipped {len(self.errors)} corrupt line(s) in {self.path} (first: {self.errors[0]})"


def read_episodes(path: str | os.PathLike, strict: bool = False) -> ReadReport:
    """Every valid episode of ``path`` as today's record; a corrupt line (or a record this turngym cannot
    read) is reported by number and the rest kept. ``strict=True``: the first bad line raises instead."""
    records, errors = read_records(path)  # strict or not, the first bad line in file order is the one raised
    episodes: list[Episode] = []
    report = ReadReport(Path(path), episodes, errors)
    envs: dict[str, EnvClass] = {}  # env id → its registered class, looked up once per read
    for line_no, record in records:
        try:
            version = record_version(record)
            episode = Episode.from_dict(record)
        except (ValueError, TypeError) as exc:
            errors.append(EpisodeFileError(Path(path), line_no, str(exc)))
            continue
        if version < SCHEMA_VERSION:
            if episode.env_id not in envs:
                envs[episode.env_id] = _env_class(episode.env_id)
            notes: list[str] = []  # in migration order, so the notes read the same every time
            for v in range(version, SCHEMA_VERSION):
                step = MIGRATIONS[v]
                if step.upgrade(episode, envs[episode.env_id]):
                    report.upgraded[step.to_version] = report.upgraded.get(step.to_version, 0) + 1
                    if step.note not in notes:
                        notes.append(step.note)
            for note in notes:
                report.noted[note] = report.noted.get(note, 0) + 1
        episodes.append(episode)
    errors.sort(key=lambda e: e.line_no)
    if strict and errors:
        raise errors[0]
    return report


def load_episodes(path: str | os.PathLike) -> ReadReport:
    """:func:`read_episodes` for a command that scores or shows the file: what was skipped and filled is said
    once on stdout, and a file with no valid episode raises ``ValueError``."""
    report = read_episodes(path)
    if report.errors:
        print(f"warning: {report.skipped()}")
    if not report.episodes:
        raise ValueError(f"no valid episodes in {path}")
    for note in report.notes():
        print(f"note: {note}")
    return report


def written_ids(path: str | os.PathLike) -> set[str]:
    """Ids of the episodes already in ``path`` (empty if the file does not exist)."""
    if not Path(path).exists():
        return set()
    return {ep.id for ep in read_episodes(path).episodes}


def _env_class(env_id: str) -> EnvClass:
    """The registered TextEnv class of ``env_id`` (None: not registered, or not a TextEnv)."""
    try:
        entry = gymnasium.spec(env_id).entry_point
    except gymnasium.error.Error:
        return None
    if isinstance(entry, str):
        entry = resolve(entry)
    return entry if isinstance(entry, type) and issubclass(entry, TextEnv) else None
