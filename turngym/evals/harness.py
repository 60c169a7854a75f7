"""``turngym eval``: run a model on an env and dataset subset, resumably, and write results.

Outputs in ``--out``: ``episodes.jsonl`` (appended as episodes finish; a rerun plays only
what is missing), ``results.json`` (metrics with 95% intervals, the exact subset, the model),
``report.md``, PNG plots and ``view.html`` (the episode viewer). Results are always recomputed from everything in
``episodes.jsonl`` that belongs to the requested subset.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from turngym._version import __version__
from turngym.envs.bfcl.score import bfcl_metrics
from turngym.episode import Episode
from turngym.episode.reader import read_episodes
from turngym.grading.metrics import behaviour_metrics, outcome_metrics, per_dataset, ungraded
from turngym.run.outputs import LOCK_FILE, RUN_SETTINGS, EvalFolderWriter, FolderWriter
from turngym.run.pipeline import PipelineError, RunProgress, RunSpec, execute
from turngym.run.pipeline import resolve_subset as _resolve_subset

EvalError = PipelineError  # a problem the user must fix (bad subset, full disk, server down); nothing written is lost
EvalSpec = RunSpec  # what to evaluate (turngym.run.pipeline)
resolve_subset = _resolve_subset


def run_eval(spec: EvalSpec, out_dir: str | Path, policy: Any = None, progress: RunProgress | None = None,
             overwrite: bool = False) -> dict[str, Any]:
    """Play what ``out_dir`` lacks of the subset, then write results; ``out_dir`` is locked meanwhile.

    Everything that can fail without a model (arguments, output folder, env, index, subset, stored
    settings) is checked before the model loads and before any episode is played (turngym.run.pipeline).
    """
    writer = EvalFolderWriter(out_dir)
    try:
        outcome = execute(spec, writer, policy=policy, progress=progress, overwrite=overwrite)
        if outcome.note:
            print(outcome.note)
        wanted = outcome.wanted_ids()
        episodes = [e for e in read_episodes(writer.episodes_path).episodes if e.id in wanted]
        results = summarise(episodes, spec, outcome.prepared.subset(), outcome.wall_s)
        write_results(results, episodes, writer.out)
    except OSError as exc:
        raise _disk_error(exc, writer.episodes_path) from None
    return results


def _disk_error(exc: OSError, episodes_path: Path) -> Exception:
    """A full disk (or quota) is one clear message; other OS errors are returned as they are."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return exc
    return EvalError(f"disk full while writing {exc.filename or episodes_path}; every episode written so far is intact "
                     f"in {episodes_path}. Free space and rerun the same command to continue")


def _model_identity(model: str) -> dict[str, Any]:
    from turngym.agents.loading import model_identity

    return model_identity(model)


def summarise(episodes: Sequence[Episode], spec: EvalSpec, subset: dict[str, Any], wall_s: float) -> dict[str, Any]:
    return {
        "turngym": __version__,
        "env": spec.env_id,
        "env_kwargs": spec.env_kwargs,
        "model": _model_name(episodes, spec),
        "model_identity": _model_identity(spec.model) if not spec.base_url else {"name": spec.model, "server": spec.base_url},
        "k": spec.k,
        "sampling": {"temperature": spec.temperature, "max_new_tokens": spec.max_new_tokens, "seed": spec.seed},
        "subset": subset,
        **({"shard": str(spec.shard)} if spec.shard else {}),
        "episodes": len(episodes),
        "metrics": outcome_metrics(episodes, spec.k),
        "ungraded": ungraded(episodes),
        "per_dataset": per_dataset(episodes, spec.k),
        **({"bfcl": bfcl} if (bfcl := bfcl_metrics(episodes)) else {}),
        "behaviour": behaviour_metrics(episodes),
        "wall_s_this_run": round(wall_s, 2),
    }


def _model_name(episodes: Sequence[Episode], spec: EvalSpec) -> str:
    """The model the episodes were played by (a policy passed in code may differ from ``spec.model``)."""
    played = {str(e.meta["model"]) for e in episodes if e.meta.get("model")}
    name = played.pop() if len(played) == 1 else spec.model
    return name if not spec.base_url else f"{name} @ {spec.base_url}"


def merge_shards(shard_dirs: Sequence[str | Path], out_dir: str | Path) -> dict[str, Any]:
    """One run from the folders of ``turngym eval --shard i/n``: the shards must share every setting and
    cover disjoint items; the merged folder holds their episodes in subset order and results recomputed
    from them, equal to those of one unsharded run of the same items."""
    from turngym.episode import EpisodeWriter
    from turngym.run.lock import RunLock
    from turngym.run.pipeline import prepare, recorded_indices

    if len(shard_dirs) < 2:
        raise EvalError("--merge takes two or more shard folders")
    stored = []
    for d in map(Path, shard_dirs):
        try:
            stored.append((d, json.loads((d / RUN_SETTINGS).read_text()), json.loads((d / "results.json").read_text())))
        except (OSError, ValueError) as exc:
            raise EvalError(f"{d} is not a finished eval run ({exc})") from None
    from turngym.run.lock import RUN_ID, differences, without_identity

    first_dir, settings, _ = stored[0]
    for d, other, _ in stored[1:]:
        if without_identity(other) != without_identity(settings):
            raise EvalError(f"{d} and {first_dir} were run with other settings "
                            f"({'; '.join(differences(without_identity(settings), without_identity(other)))})")
    shard_runs = [str(s[RUN_ID]) for _, s, _ in stored if s.get(RUN_ID)]
    shards = sorted({r.get("shard", "") for _, _, r in stored})
    counts = {s.partition("/")[2] for s in shards}
    if "" in shards or len(counts) != 1 or len(shards) != len(stored) or len(shards) != int(counts.pop()):
        raise EvalError(f"the folders must be the shards 1/N..N/N of one run, exactly once each; got {shards}")
    spec = RunSpec(env_id=settings["env"], env_kwargs=settings["env_kwargs"], model=settings["model"],
                   base_url=settings["base_url"], k=settings["k"], temperature=settings["sampling"]["temperature"],
                   max_new_tokens=settings["sampling"]["max_new_tokens"], seed=settings["sampling"]["seed"],
                   server=settings.get("server", "auto"), prompt_format=settings.get("prompt_format", "chat"))
    prepared = prepare(spec)
    indices = sorted({i for _, _, r in stored for i in recorded_indices(r["subset"], prepared.item_ids)})
    by_id: dict[str, Episode] = {}
    for d, _, _ in stored:
        for e in read_episodes(d / "episodes.jsonl").episodes:
            by_id.setdefault(e.id, e)
    prepared.indices = indices
    order = {i: n for n, i in enumerate(indices)}
    episodes = sorted((e for e in by_id.values() if e.task.get("index") in order),
                      key=lambda e: (order[e.task["index"]], e.id))
    expected = sum(r.get("episodes", 0) for _, _, r in stored)
    if len(episodes) != expected:  # nothing is written that would not equal the unsharded run
        raise EvalError(f"the shards' results count {expected} episodes but {len(episodes)} of their episodes belong "
                        "to their recorded subsets; were their episode files changed after the runs?")
    out = Path(out_dir)
    writer = FolderWriter(out)
    with RunLock(out / LOCK_FILE, f"output folder {out}"):
        if writer.episodes_path.exists():
            raise EvalError(f"{writer.episodes_path} exists; merge into a new folder")
        from turngym.run.identity import RunIdentity, new_run_id, settings_digest

        writer.store(spec, overwrite=False, run=RunIdentity(new_run_id(), settings_digest(spec.settings()), spec.env_id,
                                                            spec.model, frozenset(shard_runs)))
        with EpisodeWriter(writer.episodes_path) as w:
            for e in episodes:
                w.write(e)
        results = summarise(episodes, spec, prepared.subset(), sum(r.get("wall_s_this_run", 0.0) for _, _, r in stored))
        results["merged_from"] = [str(d) for d, _, _ in stored]
        write_results(results, episodes, out)
    return results


def write_results(results: dict[str, Any], episodes: Sequence[Episode], out: Path) -> None:
    """An eval folder's results: ``results.json`` (replaced whole), the episode viewer, and ``report.md`` with plots."""
    from turngym.views.report import render_eval_report
    from turngym.views.viewer import render_viewer  # the episodes turn by turn; report.md links it

    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out / "results.json")
    render_viewer(episodes, out / "view.html", source="episodes.jsonl")
    render_eval_report(results, episodes, out)
