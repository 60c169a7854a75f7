"""Where a run's output goes: the writers behind :func:`turngym.run.pipeline.execute`.

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

from turngym.run.lock import RunLock, check_settings, store_settings
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

    def check(self, spec: RunSpec, overwrite: bool) -> None:
        pass

    def store(self, spec: RunSpec, overwrite: bool) -> str | None:
        return None

    def before_run(self, spec: RunSpec, prepared: Prepared) -> None:
        pass


RUN_SETTINGS = "run.json"
LOCK_FILE = ".lock"


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

    def check(self, spec: RunSpec, overwrite: bool) -> None:
        check_settings(self.out / RUN_SETTINGS, spec.settings(), self._outputs(), overwrite)

    def store(self, spec: RunSpec, overwrite: bool) -> str | None:
        return store_settings(self.out / RUN_SETTINGS, spec.settings(), self._outputs(), overwrite)

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

    def check(self, spec: RunSpec, overwrite: bool) -> None:
        check_settings(rollout_settings_path(self.episodes_path), spec.settings(), self._outputs, overwrite)

    def store(self, spec: RunSpec, overwrite: bool) -> str | None:
        return store_settings(rollout_settings_path(self.episodes_path), spec.settings(), self._outputs, overwrite)

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
        from turngym.envs.reader import read_episodes

        if self.episodes_path.exists():
            report = read_episodes(self.episodes_path)
            if report.errors:
                print(f"warning: {len(report.errors)} corrupt line(s) in {self.episodes_path} "
                      f"(first: {report.errors[0]}); those episodes will be played again")
