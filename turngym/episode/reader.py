"""The one reader of saved episodes: a record of every schema version turngym has written, read as today's.

Every command that reads an episodes file (view, ablate, scribe, creditbench, the Monte-Carlo oracle, the
main job, eval's merge and resume, trackers) goes through :func:`read_episodes`, so a file reads the same
everywhere; older records are brought up by :mod:`turngym.episode.migrations`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.episode.encoding import decode_line
from turngym.episode.migrations import MIGRATIONS, EnvClass, EnvDeclarations, record_version
from turngym.episode.record import SCHEMA_VERSION, Episode
from turngym.registry import resolve


class EpisodeFileError(ValueError):
    """A line of an episodes file that is not a valid episode; names the line."""

    def __init__(self, path: Path, line_no: int, reason: str):
        super().__init__(f"{path}:{line_no}: {reason}")
        self.path, self.line_no, self.reason = path, line_no, reason


def read_records(path: str | os.PathLike,
                 strict: bool = False) -> tuple[list[tuple[int, dict[str, Any]]], list[EpisodeFileError]]:
    """(line number, JSON object) of every whole line of an episodes file, and the lines that are not one.

    The file layer only: the records are not yet episodes. Read episodes with :func:`read_episodes`, which
    turns each record of any schema version into today's :class:`Episode`. With ``strict=True`` the first bad
    line raises instead.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"episodes file not found: {path}")
    if not path.is_file():  # a FIFO, a device or a link to one could be read without end
        raise ValueError(f"{path} is not a regular file; episodes are read from regular files only")
    records: list[tuple[int, dict[str, Any]]] = []
    errors: list[EpisodeFileError] = []
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                if not raw.endswith(b"\n"):
                    raise ValueError("torn last line (no newline): the writer was interrupted")
                record = json.loads(decode_line(raw))
                if not isinstance(record, dict):
                    raise ValueError(f"an episode record is a JSON object, got {type(record).__name__}")
                records.append((line_no, record))
            except (ValueError, UnicodeDecodeError) as exc:
                err = EpisodeFileError(path, line_no, str(exc))
                if strict:
                    raise err from exc
                errors.append(err)
    return records, errors


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
    """The registered env class of ``env_id`` (None: not registered, or not an :class:`EnvDeclarations`, as a TextEnv is)."""
    import gymnasium  # here, not at the top: importing the episode record stays light (no numpy)

    try:
        entry = gymnasium.spec(env_id).entry_point
    except gymnasium.error.Error:
        return None
    if isinstance(entry, str):
        entry = resolve(entry)
    return entry if isinstance(entry, type) and issubclass(entry, EnvDeclarations) else None
