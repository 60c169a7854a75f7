"""A run's output claimed for one run: locked, checked to hold no other run's episodes, its settings stored
(``run.json``). These are the writers behind :func:`turngym.run.pipeline.execute`; they write no episodes
(the runner does, through :mod:`turngym.episode.store`).

One writer per command: ``eval`` writes a folder (``episodes.jsonl``, ``run.json``, then ``results.json``,
``report.md``, plots and ``view.html``), ``rollout`` one resumable JSONL file with its settings and subset
beside it, ``play`` nothing (the eval's results are :func:`turngym.evals.harness.write_results`'). The pipeline
only calls the methods of its :class:`turngym.run.pipeline.Writer` protocol, so the run flow and the file
layout change apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turngym.run.identity import MERGED_RUNS, RUN_ID, RunIdentity, new_run_id, settings_digest
from turngym.run.lock import RunError, RunLock, check_settings, store_settings
from turngym.run.pipeline import PipelineError

if TYPE_CHECKING:
    from turngym.run.pipeline import Prepared, RunSpec


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class NoWriter:
    """``play``: nothing is locked or stored; the command writes the one episode itself."""

    episodes_path = None

    def lock(self) -> Any:
        return _NoLock()

    def check(self, spec: RunSpec, overwrite: bool) -> RunIdentity:
        return RunIdentity(new_run_id(), settings_digest(spec.settings()), spec.env_id, spec.model)

    def store(self, spec: RunSpec, overwrite: bool, run: RunIdentity) -> str | None:
        return None

    def before_run(self, spec: RunSpec, prepared: Prepared) -> None:
        pass


RUN_SETTINGS = "run.json"
LOCK_FILE = ".lock"


def claim(settings_path: Path, episodes_path: Path, outputs: list[Path], spec: RunSpec, overwrite: bool) -> RunIdentity:
    """The run that may write this output, refused (RunError, one line) when the output holds another run's.

    run.json's settings must equal the spec's (``check_settings``); its ``run_id`` is kept. Without one (a folder
    written by the Python API, or before run ids), the episodes' own record decides: every episode must name this
    env and model and, where it records a run, one run with these settings; an output of legacy episodes keeps
    their unprefixed ids so it still resumes. Nothing is read or refused with ``overwrite`` (it is moved aside)."""
    check_settings(settings_path, spec.settings(), outputs, overwrite)
    digest = settings_digest(spec.settings())
    run_id, merged = (None, frozenset()) if overwrite else _stored_id(settings_path, outputs)
    if merged:
        raise RunError(f"{settings_path.parent} holds a merge of {len(merged)} shard runs (eval --merge), which takes no "
                       "more episodes: choose another --out, or pass --overwrite to move it aside")
    if overwrite or not episodes_path.exists():
        return RunIdentity(run_id or new_run_id(), digest, spec.env_id, spec.model, merged)
    from turngym.episode.reader import read_episodes

    episodes = read_episodes(episodes_path).episodes
    if run_id is None:
        recorded = {str(e.meta["run"].get("id", "")) for e in episodes if isinstance(e.meta.get("run"), dict)}
        run_id = recorded.pop() if len(recorded) == 1 else ""  # none or several: "" (several is refused below)
    identity = RunIdentity(run_id if episodes else (run_id or new_run_id()), digest, spec.env_id, spec.model, merged)
    mismatch = identity.mismatch(episodes)
    if mismatch:
        raise RunError(f"{episodes_path} holds episodes of another run ({mismatch}): this run would mix them into one "
                       "set of results. Choose another --out for a new run, or pass --overwrite to move them aside")
    return identity


def _stored_id(settings_path: Path, outputs: list[Path]) -> tuple[str | None, frozenset[str]]:
    """The run id in run.json (and the shard runs a merged folder holds) when its outputs exist; (None, ∅) when
    there is none (the output starts a new run, or adopts its episodes' own)."""
    if not settings_path.exists() or not any(p.exists() for p in outputs):
        return None, frozenset()
    try:
        stored = json.loads(settings_path.read_text())
    except (OSError, ValueError):
        return None, frozenset()  # check_settings has already refused an unreadable run.json
    value = stored.get(RUN_ID) if isinstance(stored, dict) else None
    merged = frozenset(map(str, stored.get(MERGED_RUNS) or ())) if isinstance(stored, dict) else frozenset()
    return (str(value) if value is not None else None), merged


def rollout_settings_path(episodes_path: str | Path) -> Path:
    """Where ``rollout`` keeps the settings of one episodes file: beside it, as ``<file>.run.json``."""
    return Path(f"{episodes_path}.run.json")


class FolderWriter:
    """``eval``: a folder holding ``episodes.jsonl``, ``run.json`` and, afterwards, the results."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.episodes_path = self.out / "episodes.jsonl"

    def lock(self) -> RunLock:
        return RunLock(self.out / LOCK_FILE, f"output folder {self.out}")

    def _outputs(self) -> list[Path]:
        return sorted(p for p in self.out.iterdir() if p.name not in (RUN_SETTINGS, LOCK_FILE)
                      and not p.name.startswith("replaced-") and not p.name.endswith(".tmp"))

    def check(self, spec: RunSpec, overwrite: bool) -> RunIdentity:
        return claim(self.out / RUN_SETTINGS, self.episodes_path, self._outputs(), spec, overwrite)

    def store(self, spec: RunSpec, overwrite: bool, run: RunIdentity) -> str | None:
        return store_settings(self.out / RUN_SETTINGS, spec.settings(), self._outputs(), overwrite, run_id=run.id,
                              merged=sorted(run.merged))

    def before_run(self, spec: RunSpec, prepared: Prepared) -> None:
        pass


class JsonlWriter:
    """``rollout``: one resumable JSONL file, its settings (``.run.json``) and exact subset (``.manifest.json``) beside it."""

    def __init__(self, path: str | Path):
        self.episodes_path = Path(path)
        self._outputs = [self.episodes_path, Path(f"{path}.manifest.json"), Path(f"{path}.torn")]
        if self.episodes_path.is_dir():
            raise PipelineError(f"--out {path} is a folder; rollout writes one JSONL file")

    def lock(self) -> RunLock:
        return RunLock(f"{self.episodes_path}.lock", f"episodes file {self.episodes_path}")

    def check(self, spec: RunSpec, overwrite: bool) -> RunIdentity:
        return claim(rollout_settings_path(self.episodes_path), self.episodes_path, self._outputs, spec, overwrite)

    def store(self, spec: RunSpec, overwrite: bool, run: RunIdentity) -> str | None:
        return store_settings(rollout_settings_path(self.episodes_path), spec.settings(), self._outputs, overwrite,
                              run_id=run.id)

    def before_run(self, spec: RunSpec, prepared: Prepared) -> None:
        if prepared.manifest is None:
            return
        subset = prepared.subset()
        subset.update({"indices": prepared.indices, "k": spec.k, "model": spec.model, "env": spec.env_id})
        self.episodes_path.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{self.episodes_path}.manifest.json").write_text(json.dumps(subset, indent=1))


class EvalFolderWriter(FolderWriter):
    """The eval folder; a resumed run first says how many corrupt lines it will play again."""

    def before_run(self, spec: RunSpec, prepared: Prepared) -> None:
        from turngym.episode.reader import read_episodes

        if self.episodes_path.exists():
            report = read_episodes(self.episodes_path)
            if report.errors:
                print(f"warning: {len(report.errors)} corrupt line(s) in {self.episodes_path} "
                      f"(first: {report.errors[0]}); those episodes will be played again")
