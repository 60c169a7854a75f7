"""Eval, ablation and credit-benchmark results in the trackers people already use: TensorBoard and W&B.

Each tracker is written through its own library (``torch.utils.tensorboard`` and ``wandb``), so its
files open in its own UI: the run's numeric results as scalars (nested keys joined by ``/``, e.g.
``metrics/accuracy/value``), the run's settings as config, and a sample table of episodes (id, group,
question, final answer, outcome, turns). W&B honours its own ``WANDB_MODE`` (``offline`` writes a run
folder that ``wandb sync`` uploads later).

    from turngym.views.trackers import log_run_dir
    log_run_dir("runs/eval-x", tensorboard_dir="runs/tb", wandb_project="turngym")
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turngym.episode import Episode

RESULT_FILES = ("results.json", "ablation.json", "creditbench.json")  # eval, ablate, creditbench
SAMPLE_COLUMNS = ("episode", "group", "env", "question", "final_answer", "outcome", "turns")
SKIPPED_KEYS = ("per_turn_rewards",)  # per-turn arrays: in scores.jsonl and the viewer, not scalars


class TrackerError(ValueError):
    """A run folder or tracker option that cannot be logged (no results file, tracker not installed)."""


@dataclass(frozen=True)
class LoggedRun:
    """What was written where: the scalar names, and each tracker's location (TensorBoard event
    folder, W&B run folder)."""

    scalars: dict[str, float]
    tensorboard: Path | None = None
    wandb: Path | None = None


def flatten_metrics(results: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Every finite number in ``results`` (bools left out) under its ``/``-joined key path; lists by index."""
    out: dict[str, float] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, bool) or value is None:
            return
        if isinstance(value, (int, float)):
            if math.isfinite(value):
                out[key] = float(value)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                if str(k) not in SKIPPED_KEYS:
                    walk(v, f"{key}/{k}" if key else str(k))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{key}/{i}")

    walk(results, prefix)
    return out


def sample_rows(episodes: Sequence[Episode], n: int = 20) -> list[dict[str, Any]]:
    """The first ``n`` episodes as table rows (``SAMPLE_COLUMNS``); text fields cut at 2,000 characters."""

    def cut(text: Any) -> str:
        s = "" if text is None else str(text)
        return s if len(s) <= 2000 else s[:2000] + " … [cut]"

    return [{"episode": e.id, "group": e.group_key, "env": e.env_id, "question": cut(e.task.get("question")),
             "final_answer": cut(e.final_answer), "outcome": json.dumps(e.outcome, sort_keys=True, default=str),
             "turns": len(e.turns)} for e in episodes[:n]]


def read_run_dir(run_dir: str | Path, n_samples: int = 20) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The results file of an ``eval`` / ``ablate`` / ``creditbench`` folder, and sample rows of its episodes
    (``episodes.jsonl`` when the folder has one)."""
    from turngym.episode.reader import read_episodes

    d = Path(run_dir)
    found = [d / f for f in RESULT_FILES if (d / f).is_file()]
    if not found:
        raise TrackerError(f"{d} has none of {', '.join(RESULT_FILES)}: log the folder that `turngym eval`, "
                           "`turngym ablate` or `turngym creditbench` wrote")
    try:
        results = json.loads(found[0].read_text())
    except json.JSONDecodeError as exc:
        raise TrackerError(f"{found[0]} is not valid JSON: {exc}") from None
    if not isinstance(results, dict):
        raise TrackerError(f"{found[0]} holds {type(results).__name__}, not a results mapping")
    eps = d / "episodes.jsonl"
    rows = sample_rows(read_episodes(eps).episodes, n_samples) if eps.is_file() else []
    return results, rows


def _config(results: Mapping[str, Any]) -> dict[str, Any]:
    """The run's settings (text and small values at the top level): what a tracker shows as config."""
    return {k: v for k, v in results.items() if isinstance(v, (str, int, float, bool)) or k in ("sampling", "env_kwargs")}


def log_results(run_dir: str | Path, results: Mapping[str, Any], rows: Sequence[Mapping[str, Any]] = (), *,
                tensorboard_dir: str | Path | None = None, wandb_project: str | None = None,
                wandb_dir: str | Path | None = None, wandb_entity: str | None = None, run_name: str | None = None,
                step: int = 0) -> LoggedRun:
    """Log ``results`` (scalars and config) and ``rows`` (a sample table) to each tracker asked for.

    ``run_dir`` names the run (its folder name, unless ``run_name``); W&B's files go to ``wandb_dir``
    (default: ``run_dir``). Nothing is asked for: a :class:`TrackerError`, not a silent no-op."""
    if tensorboard_dir is None and wandb_project is None:
        raise TrackerError("no tracker asked for: give tensorboard_dir and/or wandb_project")
    name = run_name or Path(run_dir).resolve().name
    scalars = flatten_metrics(results)
    table_rows = [[_cell(r.get(c)) for c in SAMPLE_COLUMNS] for r in rows]
    tb = _log_tensorboard(Path(tensorboard_dir), name, scalars, results, table_rows, step) \
        if tensorboard_dir is not None else None
    wb = _log_wandb(wandb_project, Path(wandb_dir or run_dir), wandb_entity, name, scalars, results, table_rows, step) \
        if wandb_project is not None else None
    return LoggedRun(scalars, tb, wb)


def log_run_dir(run_dir: str | Path, *, n_samples: int = 20, **trackers: Any) -> LoggedRun:
    """:func:`log_results` on the results file and episodes an ``eval`` / ``ablate`` / ``creditbench`` folder holds."""
    results, rows = read_run_dir(run_dir, n_samples)
    return log_results(run_dir, results, rows, **trackers)


def _cell(v: Any) -> Any:
    return v if isinstance(v, (str, int, float)) and not isinstance(v, bool) else json.dumps(v, default=str)


def _markdown_table(rows: Iterable[Sequence[Any]]) -> str:
    def esc(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
    lines += ["| " + " | ".join(esc(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _log_tensorboard(log_dir: Path, name: str, scalars: Mapping[str, float], results: Mapping[str, Any],
                     rows: Sequence[Sequence[Any]], step: int) -> Path:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise TrackerError(f"TensorBoard logging needs the tensorboard package (pip install tensorboard): {exc}") from None
    run = log_dir / name
    writer = SummaryWriter(log_dir=str(run))
    try:
        for key, value in scalars.items():
            writer.add_scalar(key, value, global_step=step)
        writer.add_text("config", "```\n" + json.dumps(_config(results), indent=1, default=str) + "\n```", step)
        if rows:
            writer.add_text("samples", _markdown_table(rows), step)
    finally:
        writer.close()
    return run


def _log_wandb(project: str, directory: Path, entity: str | None, name: str, scalars: Mapping[str, float],
               results: Mapping[str, Any], rows: Sequence[Sequence[Any]], step: int) -> Path:
    try:
        import wandb
    except ImportError:
        raise TrackerError("W&B logging needs the wandb package: pip install 'turngym[trackers]'") from None
    directory.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=project, entity=entity, name=name, dir=str(directory), config=_config(results),
                     reinit="create_new")
    try:
        table = {"samples": wandb.Table(columns=list(SAMPLE_COLUMNS), data=[list(r) for r in rows])} if rows else {}
        run.log({**scalars, **table}, step=step)  # one history row: a second log at the same step is not kept
        run.summary.update(dict(scalars))
        where = Path(run.dir).parent  # the run folder (its files/ is run.dir)
    finally:
        run.finish()
    return where


# --------------------------------------------------------------------------- command line


def add_tracker_arguments(parser: argparse.ArgumentParser) -> None:
    """``--tensorboard DIR``, ``--wandb-project NAME`` (``--wandb-entity``, ``--tracker-samples``) for a
    command that writes a results folder; :func:`log_from_args` logs it."""
    g = parser.add_argument_group("trackers")
    g.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="also log the results and a sample table to TensorBoard event files under DIR (default: off)")
    g.add_argument("--wandb-project", metavar="NAME", default=None,
                   help="also log them to this W&B project; WANDB_MODE=offline keeps the run on disk (default: off)")
    g.add_argument("--wandb-entity", metavar="NAME", default=None, help="W&B entity (default: your W&B default)")
    g.add_argument("--tracker-samples", type=int, default=20, metavar="N",
                   help="episodes in the trackers' sample table (default: %(default)s)")


def log_from_args(args: argparse.Namespace, run_dir: str | Path,
                  echo: Callable[[str], None] = print) -> LoggedRun | None:
    """After a command wrote ``run_dir``: log it to the trackers its arguments ask for (None: none asked)."""
    if getattr(args, "tensorboard", None) is None and getattr(args, "wandb_project", None) is None:
        return None
    if args.tracker_samples < 0:
        raise TrackerError(f"--tracker-samples must be 0 or more, got {args.tracker_samples}")
    logged = log_run_dir(run_dir, n_samples=args.tracker_samples, tensorboard_dir=args.tensorboard,
                         wandb_project=args.wandb_project, wandb_entity=args.wandb_entity)
    if logged.tensorboard is not None:
        echo(f"tensorboard: {len(logged.scalars)} scalars in {logged.tensorboard} (tensorboard --logdir {args.tensorboard})")
    if logged.wandb is not None:
        echo(f"wandb: {len(logged.scalars)} scalars in run folder {logged.wandb}")
    return logged
