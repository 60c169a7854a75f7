"""``turngym eval``: run a model on an env and dataset subset, resumably, and write results.

Outputs in ``--out``: ``episodes.jsonl`` (appended as episodes finish; a rerun plays only
what is missing), ``results.json`` (metrics with 95% intervals, the exact subset, the model),
``report.md``, PNG plots and ``view.html`` (the episode viewer). Results are always recomputed from everything in
``episodes.jsonl`` that belongs to the requested subset.
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym._version import __version__
from turngym.episode import Episode, read_episodes
from turngym.evals.bfcl_score import bfcl_metrics
from turngym.evals.metrics import behaviour_metrics, outcome_metrics, per_dataset, ungraded
from turngym.evals.runs import RunError, RunLock, check_settings, store_settings, validate_run_args


class EvalError(RuntimeError):
    """A problem the user must fix (bad subset, full disk, server down); nothing written is lost."""


def resolve_subset(items_ids: Sequence[str], limit: int | None = None, subset_file: str | None = None,
                   start: int = 0) -> list[int]:
    """Dataset indices to evaluate: the first ``limit`` items from ``start``, or a subset file of item
    ids or indices (JSON list, or one per line)."""
    if subset_file:
        path = Path(subset_file)
        if not path.is_file():
            raise EvalError(f"subset file not found: {path}")
        text = path.read_text().strip()
        try:
            entries = json.loads(text)
            if isinstance(entries, dict):
                entries = entries.get("item_ids") or entries.get("indices") or []
        except json.JSONDecodeError:
            entries = [line.strip() for line in text.splitlines() if line.strip()]
        position = {str(i): n for n, i in enumerate(items_ids)}
        out = []
        for e in entries:
            if isinstance(e, int) or (isinstance(e, str) and e.isdigit() and e not in position):
                idx = int(e)
                if not 0 <= idx < len(items_ids):
                    raise EvalError(f"subset index {idx} is out of range (dataset has {len(items_ids)} items)")
                out.append(idx)
            elif str(e) in position:
                out.append(position[str(e)])
            else:
                raise EvalError(f"subset entry {e!r} is neither an item id nor an index of this dataset")
        return list(dict.fromkeys(out))
    stop = len(items_ids) if limit is None else min(len(items_ids), start + limit)
    return list(range(start, stop))


@dataclass
class EvalSpec:
    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    model: str = "default"
    base_url: str | None = None
    k: int = 1
    limit: int | None = None
    start: int = 0
    subset_file: str | None = None
    concurrency: int = 8
    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    server: str = "auto"  # with base_url: "auto" | "vllm" | "openai" (see OpenAICompatPolicy)
    prompt_format: str = "chat"  # with base_url: "chat" | "text"

    def server_options(self) -> dict[str, str]:
        """The OpenAI-compatible policy's arguments (none for a local model)."""
        from turngym.agents.openai_compat import server_options

        return server_options(self.base_url, self.server, self.prompt_format)

    def settings(self) -> dict[str, Any]:
        """What decides an episode's content (not which items, nor how many at once): stored in run.json."""
        from turngym.agents.openai_compat import server_settings

        return {"env": self.env_id, "env_kwargs": self.env_kwargs, "model": self.model, "base_url": self.base_url,
                "k": self.k, "sampling": {"temperature": self.temperature, "max_new_tokens": self.max_new_tokens,
                                          "seed": self.seed}, **server_settings(self.server_options())}


RUN_SETTINGS = "run.json"
LOCK_FILE = ".lock"


def run_eval(spec: EvalSpec, out_dir: str | Path, policy: Any = None,
             progress: Callable[[int, int], None] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Play what ``out_dir`` lacks of the subset, then write results; ``out_dir`` is locked meanwhile.

    Everything that can fail without a model (arguments, output folder, env, index, subset, stored
    settings) is checked before the model loads and before any episode is played.
    """
    try:
        spec.server_options()
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    try:
        validate_run_args(k=spec.k, concurrency=spec.concurrency, max_new_tokens=spec.max_new_tokens,
                          start=spec.start, limit=spec.limit, max_turns=spec.env_kwargs.get("max_turns"),
                          temperature=spec.temperature)
        with RunLock(Path(out_dir) / LOCK_FILE, f"output folder {out_dir}"):
            return _run_eval_locked(spec, Path(out_dir), policy, progress, overwrite)
    except RunError as exc:
        raise EvalError(str(exc)) from None


def _run_eval_locked(spec: EvalSpec, out: Path, policy: Any, progress: Callable[[int, int], None] | None,
                     overwrite: bool) -> dict[str, Any]:
    import gymnasium

    import turngym  # noqa: F401
    from turngym.agents.policy import PolicyError, SamplingParams
    from turngym.agents.runner import RolloutRunner

    if spec.env_id not in gymnasium.registry:
        known = sorted(k for k in gymnasium.registry if k.startswith("turngym/"))
        raise EvalError(f"unknown env {spec.env_id!r}; turngym envs: {', '.join(known)}")
    try:
        probe = gymnasium.make(spec.env_id, **spec.env_kwargs)
    except (ValueError, FileNotFoundError, TypeError, ImportError) as exc:
        raise EvalError(f"cannot make {spec.env_id} with {spec.env_kwargs}: {exc}") from None
    base = probe.unwrapped
    try:
        base.check_ready()
    except (RuntimeError, OSError, ValueError) as exc:
        raise EvalError(f"{spec.env_id} is not ready: {exc}") from None
    manifest = getattr(base, "manifest", None)
    item_ids = manifest.item_ids if manifest else [str(base.get_item(i).get("id", i)) for i in range(base.num_items())]
    if spec.start >= len(item_ids) and not spec.subset_file:
        raise EvalError(f"--start {spec.start} is past the end of the dataset ({len(item_ids)} items)")
    indices = resolve_subset(item_ids, spec.limit, spec.subset_file, spec.start)
    if not indices:
        raise EvalError("the subset is empty")
    outputs = sorted(p for p in out.iterdir() if p.name not in (RUN_SETTINGS, LOCK_FILE)
                     and not p.name.startswith("replaced-") and not p.name.endswith(".tmp"))
    check_settings(out / RUN_SETTINGS, spec.settings(), outputs, overwrite)
    if policy is None:
        from turngym.agents.loading import load_policy

        policy = load_policy(spec.model, base_url=spec.base_url, **spec.server_options())
    try:
        note = store_settings(out / RUN_SETTINGS, spec.settings(), outputs, overwrite)  # the run can start
    except OSError as exc:
        raise _disk_error(exc, out / "episodes.jsonl") from None
    if note:
        print(note)
    tok = getattr(policy, "tokenizer", None)
    style = "chat" if tok is None or getattr(tok, "chat_template", None) else "base"
    env_kwargs = dict(spec.env_kwargs)
    if "prompt_style" not in env_kwargs and "prompt_style" in _init_params(type(base)):
        env_kwargs["prompt_style"] = style
    sampling = SamplingParams(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, seed=spec.seed)
    runner = RolloutRunner(policy, lambda: gymnasium.make(spec.env_id, **env_kwargs), sampling, k=spec.k,
                           concurrency=spec.concurrency, seed=spec.seed)
    episodes_path = out / "episodes.jsonl"
    if episodes_path.exists():
        report = read_episodes(episodes_path)
        if report.errors:
            print(f"warning: {len(report.errors)} corrupt line(s) in {episodes_path} "
                  f"(first: {report.errors[0]}); those episodes will be played again")
    start = time.perf_counter()
    try:
        runner.run(indices, episodes_path, progress=progress)
    except PolicyError as exc:
        raise EvalError(f"the model backend failed: {exc}. Episodes already written are kept in {episodes_path}; "
                        "rerun the same command to continue") from None
    except OSError as exc:
        raise _disk_error(exc, episodes_path) from None
    wall = time.perf_counter() - start
    wanted = {runner.episode_id(base.env_name, str(getattr(base, "dataset_name", "") or ""), t, kk)
              for t in _tasks(indices) for kk in range(spec.k)}
    episodes = [e for e in read_episodes(episodes_path).episodes if e.id in wanted]
    results = summarise(episodes, spec, manifest.subset(indices, base.data.items).to_dict() if manifest else
                        {"dataset": getattr(base, "dataset_name", ""), "indices": indices}, wall)
    try:
        write_results(results, episodes, out)
    except OSError as exc:
        raise _disk_error(exc, episodes_path) from None
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


def _tasks(indices: Sequence[int]):
    from turngym.agents.runner import RolloutTask

    return [RolloutTask(index=i) for i in indices]


def _init_params(cls: type) -> set[str]:
    import inspect

    return set(inspect.signature(cls.__init__).parameters)


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


def write_results(results: dict[str, Any], episodes: Sequence[Episode], out: Path) -> None:
    from turngym.evals.report import render_eval_report

    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out / "results.json")
    from turngym.evals.viewer import render_viewer  # the episodes turn by turn; report.md links it

    render_viewer(episodes, out / "view.html", source="episodes.jsonl")
    render_eval_report(results, episodes, out)
