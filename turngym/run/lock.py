"""Who may write a run's output, and with which settings.

A run's output (an eval's ``--out`` folder, a rollout's JSONL file) is locked while a process
writes it, so two writers never interleave episodes; the lock is ``filelock``'s ``flock``, which the
kernel drops when its holder dies, so a lock left by a killed run is simply taken over. The settings that
decide what an episode contains are stored beside the output (``run.json``); a rerun resumes
only with the same settings, and otherwise refuses, naming every difference.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

RUN_ID = "run_id"  # the run's id beside its settings in run.json (turngym.run.identity): never compared
MERGED_RUNS = "merged_runs"  # a merged folder's run.json: the ids of the shard runs it holds; never compared


class RunError(RuntimeError):
    """The output cannot be used as asked (locked, other settings, not writable); nothing was changed."""


class RunLock:
    """An exclusive, non-blocking lock (``filelock``'s kernel ``flock``) on ``path``, holding the writer's pid,
    host and start time so that a refused second writer can say who holds it."""

    def __init__(self, path: str | os.PathLike, what: str):
        self.path, self.what = Path(path), what
        self._lock: Any = None

    def acquire(self) -> RunLock:
        from filelock import FileLock, Timeout

        # no soft fallback: a marker file would outlive a killed writer; the kernel drops an flock with its holder
        lock = FileLock(self.path, blocking=False, fallback_to_soft=False, on_acquired=_write_holder)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except Timeout:
            try:
                holder = self.path.read_text("utf-8", "replace").strip()
            except OSError:
                holder = ""
            raise RunError(f"{self.what} is being written by another run ({holder or 'unknown process'}); wait for it "
                           "to finish or choose another --out") from None
        except OSError as exc:
            raise RunError(f"cannot write to {self.what}: {exc.strerror or exc}") from None
        self._lock = lock
        return self

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()  # drops the flock; the file stays (removing it would race a new holder)
            self._lock = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _write_holder(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n".encode())


def differences(stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """``key: old → new`` for every setting that differs (nested dicts compared key by key)."""
    out = []
    for key in sorted(set(stored) | set(wanted)):
        a, b = stored.get(key, "(unset)"), wanted.get(key, "(unset)")
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}.{d}" for d in differences(a, b)]
        elif a != b:
            out.append(f"{key}: {json.dumps(a, default=str)} → {json.dumps(b, default=str)}")
    return out


def check_settings(settings_path: str | os.PathLike, settings: dict[str, Any], outputs: list[Path],
                   overwrite: bool = False) -> None:
    """Refuse (RunError naming every difference) to add to outputs written with other settings.

    Call with the run's lock held, before the model loads; store with :func:`store_settings`
    once the run can start. Outputs that do not exist yet impose nothing.
    """
    path = Path(settings_path)
    if overwrite or not path.exists() or not any(p.exists() for p in outputs):
        return
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunError(f"{path} is unreadable ({exc}); use --overwrite to start a fresh run") from None
    diff = differences(upgrade_settings(without_identity(stored)), _as_stored(settings))
    if diff:
        raise RunError(f"{path.parent} holds a run with other settings ({'; '.join(diff)}). Rerun with the same "
                       "settings to resume it, choose another --out, or pass --overwrite to move it aside and "
                       "start fresh")


def without_identity(stored: dict[str, Any]) -> dict[str, Any]:
    """Stored settings without the run's identity (its id, the runs it merged): what two runs compare."""
    return {k: v for k, v in stored.items() if k not in (RUN_ID, MERGED_RUNS)}


def store_settings(settings_path: str | os.PathLike, settings: dict[str, Any], outputs: list[Path],
                   overwrite: bool = False, run_id: str | None = None, merged: list[str] | None = None) -> str | None:
    """Write the run's settings (and its id, ``turngym.run.identity``, which is no setting); with ``overwrite``,
    first move an earlier run's files (never delete them) into ``replaced-<time>`` beside them. Returns a note for
    the user, or None."""
    path = Path(settings_path)
    existing = [p for p in outputs if p.exists()]
    note = None
    if overwrite and existing:
        aside = path.parent / f"replaced-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
        aside.mkdir(parents=True)
        for p in existing + ([path] if path.exists() else []):
            shutil.move(str(p), aside / p.name)
        note = f"note: the previous run's files were moved to {aside}"
    elif existing and not path.exists():  # written without run settings, and every episode matched this run's
        note = (f"note: {', '.join(str(p) for p in existing)} came with no {path.name}; its episodes record this "
                "run's env and model, so it is adopted and its settings stored")
    tmp = path.with_name(path.name + ".tmp")
    stored = _as_stored(settings)
    if run_id is not None:
        stored[RUN_ID] = run_id
    if merged:
        stored[MERGED_RUNS] = sorted(merged)
    tmp.write_text(json.dumps(stored, indent=1, sort_keys=True))
    tmp.replace(path)
    return note


def upgrade_settings(stored: dict[str, Any]) -> dict[str, Any]:
    """Stored settings in the one shape every run command writes. ``rollout`` once kept ``dataset`` and
    ``max_turns`` beside ``env_kwargs``; they belong in it, where ``eval`` keeps them (``--dataset`` and
    ``--max-turns`` are env arguments), so such a run still resumes and replays with them."""
    if "dataset" not in stored and "max_turns" not in stored:
        return stored
    out = dict(stored)
    kwargs = dict(out.get("env_kwargs") or {})
    for key in ("dataset", "max_turns"):
        value = out.pop(key, None)
        if value is not None and value != "":
            kwargs.setdefault(key, value)
    out["env_kwargs"] = kwargs
    return out


def _as_stored(settings: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(settings, default=str))

def validate_run_args(*, k: int = 1, concurrency: int = 1, max_new_tokens: int = 1, start: int = 0,
                      limit: int | None = None, max_turns: int | None = None, temperature: float = 0.0) -> None:
    """One clear line for the first argument value that cannot work."""
    checks = [("--k", k, 1), ("--concurrency", concurrency, 1), ("--max-new-tokens", max_new_tokens, 1),
              ("--start", start, 0), ("--limit", limit, 1), ("--max-turns", max_turns, 1)]
    for flag, value, low in checks:
        if value is not None and value < low:
            raise RunError(f"{flag} must be >= {low}, got {value}")
    if not temperature >= 0:  # also NaN
        raise RunError(f"--temperature must be >= 0, got {temperature}")
