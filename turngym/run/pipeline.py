"""The one run pipeline behind ``turngym eval``, ``rollout``, ``play`` and the main job.

spec → validate → lock → env → policy → runner → writer. Everything that can fail without a model
(argument values, the env id and its arguments, the index, the subset, the output and its stored
settings) is checked before the model loads and before anything is written; a problem is one
:class:`PipelineError` whose text is the whole message. Commands differ only in their writer
(an eval folder, a rollout JSONL file, or nothing for ``play``) and in what they print.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from turngym.corpora.lucene import RetrieverError
from turngym.run.lock import RunError, validate_run_args
from turngym.sandbox.base import SandboxError

if TYPE_CHECKING:
    from turngym.agents.env_handle import EnvFactory
    from turngym.agents.policy import Policy
    from turngym.agents.runner import RolloutRunner, RolloutTask
    from turngym.envs.base import TextEnv
    from turngym.episode import Episode
    from turngym.run.identity import RunIdentity


class PipelineError(RuntimeError):
    """A run cannot go as asked (bad argument, unknown env, busy output, server down); nothing written is lost."""


class RunProgress(Protocol):
    """What a run reports as it goes: its stages, every finished turn, every finished episode."""

    def stage(self, text: str) -> None: ...

    def start(self, total: int) -> None: ...

    def turn(self, episode: Episode) -> None: ...

    def episode(self, done: int, total: int) -> None: ...

    def finish(self) -> None: ...


class Writer(Protocol):
    """Where a run's episodes go: its lock, its stored settings, and what it writes before playing."""

    episodes_path: Path | None

    def lock(self) -> Any: ...

    def check(self, spec: RunSpec, overwrite: bool) -> RunIdentity:
        """The run that may write the output (its id kept by resume), or RunError: another run's settings or
        episodes are there. Called with the lock held, before the model loads."""

    def store(self, spec: RunSpec, overwrite: bool, run: RunIdentity) -> str | None:
        """Store the run's settings and id once it can start; a note for the user, or None."""

    def before_run(self, spec: RunSpec, prepared: Prepared) -> None: ...


@dataclass(frozen=True)
class Shard:
    """Slice ``index`` (1-based) of ``count``: every ``count``-th item of the subset, starting at the ``index``-th."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        i, sep, n = text.partition("/")
        if not sep or not i.strip().isdigit() or not n.strip().isdigit():
            raise PipelineError(f"--shard takes I/N (e.g. 2/4), got {text!r}")
        shard = cls(int(i), int(n))
        if not 1 <= shard.index <= shard.count:
            raise PipelineError(f"--shard {text}: I must be 1..N")
        return shard

    def select(self, indices: Sequence[int]) -> list[int]:
        return list(indices[self.index - 1:: self.count])

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


RAY_POOL_FIELDS = ("ray", "env_workers", "envs_per_worker", "ray_restarts", "step_budget_s")  # RunSpec's, below


@dataclass
class RunSpec:
    """What to run: the env and its arguments, the model, sampling, and which items."""

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
    batching: str = "static"  # "static" | "continuous" (RolloutRunner)
    shard: Shard | None = None
    tasks: list[RolloutTask] | None = None  # explicit tasks (play's ad-hoc question); else the dataset subset
    # envs on a Ray actor pool (turngym.run.backends.ray_pool): "auto" or a cluster address; None: in this process
    ray: str | None = None
    env_workers: int = 2
    envs_per_worker: int | None = None  # None: enough for --concurrency (ceil(concurrency / env_workers))
    ray_restarts: int | None = None  # actors the run may lose before it stops (None: 2 per worker, at least 8)
    step_budget_s: float | None = None  # the longest one env step may take on the pool (None: the env's own)
    # (the five Ray pool fields above are RAY_POOL_FIELDS: what `--ray ...` and MainJobConfig hand over)

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


# ----------------------------------------------------------------------------- arguments


def env_id(name: str) -> str:
    """``Calculator-v0`` → ``turngym/Calculator-v0``; a namespaced id is kept."""
    return name if "/" in name else f"turngym/{name}"


def env_kwargs(pairs: Sequence[str], dataset: str | None = None, max_turns: int | None = None) -> dict[str, Any]:
    """``--env-arg key=value`` pairs (a value is read as JSON when it parses, else kept as text), with
    ``--dataset`` and ``--max-turns`` added; the same key given two ways with two values is an error."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise PipelineError(f"--env-arg takes key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    for key, value in (("dataset", dataset), ("max_turns", max_turns)):
        if value is None or value == "":
            continue
        if key in out and out[key] != value:
            flag = "--" + key.replace("_", "-")
            raise PipelineError(f"{flag} {value} and --env-arg {key}={out[key]} disagree; give one of them")
        out[key] = value
    return out


def validate(spec: RunSpec) -> None:
    """Argument values and server options, before any file or model is touched."""
    try:
        spec.server_options()
        validate_run_args(k=spec.k, concurrency=spec.concurrency, max_new_tokens=spec.max_new_tokens, start=spec.start,
                          limit=spec.limit, max_turns=spec.env_kwargs.get("max_turns"), temperature=spec.temperature)
    except (ValueError, RunError) as exc:
        raise PipelineError(str(exc)) from None
    from turngym.agents.runner import BATCHING

    if spec.batching not in BATCHING:
        raise PipelineError(f"--batching must be one of {', '.join(BATCHING)}, got {spec.batching!r}")

    if spec.ray is not None:
        if spec.env_workers < 1 or (spec.envs_per_worker is not None and spec.envs_per_worker < 1):
            raise PipelineError("--env-workers and --envs-per-worker must be >= 1")
        if spec.ray_restarts is not None and spec.ray_restarts < 0:
            raise PipelineError(f"--ray-restarts must be >= 0, got {spec.ray_restarts}")
        if spec.step_budget_s is not None and not spec.step_budget_s > 0:
            raise PipelineError(f"--step-budget-s must be > 0 seconds, got {spec.step_budget_s}")
        from turngym.extras import MissingExtra, require
        from turngym.run.backends.ray_pool import PART

        try:
            require(PART)
        except MissingExtra as exc:
            raise PipelineError(str(exc)) from None


def join_ray(spec: RunSpec) -> None:
    """Join (or start) the Ray cluster of ``--ray``: before the model loads, so a bad address costs no load."""
    if spec.ray is None:
        return
    from turngym.run.backends.ray_pool import RayPoolError, check_local_capacity, connect

    try:
        connect(spec.ray)
        check_local_capacity(spec.env_workers)  # a cluster started here never grows: too many workers said now
    except RayPoolError as exc:
        raise PipelineError(str(exc)) from None


# ----------------------------------------------------------------------------- env


def env_class(env: str) -> type[TextEnv]:
    """The registered class of a turngym env id; one message naming the known ids when it is not one."""
    import gymnasium

    import turngym  # noqa: F401 - registers the envs
    from turngym.envs.base import TextEnv

    if env not in gymnasium.registry:
        known = sorted(k for k in gymnasium.registry if k.startswith("turngym/"))
        raise PipelineError(f"unknown env {env!r}; turngym envs: {', '.join(known)}")
    entry = gymnasium.registry[env].entry_point
    cls = gymnasium.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        raise PipelineError(f"{env} is not a turngym text env (its entry point is {entry!r})")
    return cls


def check_prompt_style(cls: type[TextEnv], env: str, kwargs: dict[str, Any], style: str | None = None) -> None:
    """The one prompt-style rule: only an env that declares ``prompt_styles`` takes a style, and only one of those."""
    given = kwargs.get("prompt_style", style)
    if given is None:
        return
    if not cls.prompt_styles:
        if "prompt_style" in kwargs:
            raise PipelineError(f"{env} takes no prompt_style (it renders one way for every model)")
        return
    if given not in cls.prompt_styles:
        what = "--env-arg prompt_style" if "prompt_style" in kwargs else "the model's prompt style"
        raise PipelineError(f"{env} takes prompt_style {' or '.join(cls.prompt_styles)}; {what} is {given!r}")


def make_env(env: str, kwargs: dict[str, Any]) -> Any:
    import gymnasium

    try:
        return gymnasium.make(env, **kwargs)
    except TypeError as exc:
        raise PipelineError(f"bad arguments for {env}: {exc}") from None
    except (ValueError, FileNotFoundError, ImportError) as exc:  # e.g. a dataset that cannot be found
        raise PipelineError(f"cannot make {env} with {kwargs}: {exc}") from None
    except SandboxError as exc:  # a remote sandbox that fails its health check
        raise PipelineError(f"cannot make {env}: {exc}") from None
    except RetrieverError as exc:  # a retriever that cannot serve: the env's line names it
        raise PipelineError(str(exc)) from None


def prompt_style(policy: Policy) -> str:
    """``chat`` for a policy whose tokenizer has a chat template (or a text-only backend), else ``base``."""
    tok = policy.tokenizer
    return "chat" if tok is None or getattr(tok, "chat_template", None) else "base"


def styled_env_kwargs(spec: RunSpec, style: str) -> dict[str, Any]:
    """The run's env arguments with ``style`` as the env's ``prompt_style`` where it declares styles and was given
    none (checked by :func:`check_prompt_style`): the one place a run picks an env's prompt style."""
    kwargs = dict(spec.env_kwargs)
    cls = env_class(spec.env_id)
    check_prompt_style(cls, spec.env_id, kwargs, style)
    if cls.prompt_styles and "prompt_style" not in kwargs:
        kwargs["prompt_style"] = style
    return kwargs


def env_factory(spec: RunSpec, policy: Any) -> tuple[EnvFactory, Any]:
    """Fresh envs for the runner, with the policy's prompt style where the env declares styles; and the first
    one, made now so that an argument the style makes invalid fails here as one message (the runner reuses it)."""
    from turngym.agents.env_handle import LocalEnvs

    kwargs = styled_env_kwargs(spec, prompt_style(policy))
    if spec.ray is not None:
        return ray_pool(spec, kwargs)
    return LocalEnvs(lambda: make_env(spec.env_id, kwargs)), make_env(spec.env_id, kwargs)


def ray_pool(spec: RunSpec, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """The Ray actor pool as the runner's env factory, every worker's envs built (a worker that cannot build them
    is one message, before any episode), and its first env."""
    from turngym.run.backends.ray_pool import RayEnvPool, RayPoolError

    per_worker = spec.envs_per_worker or max(1, -(-spec.concurrency // spec.env_workers))
    try:
        pool = RayEnvPool(spec.env_id, kwargs, workers=spec.env_workers, envs_per_worker=per_worker,
                          restarts=spec.ray_restarts, step_budget_s=spec.step_budget_s)
    except RayPoolError as exc:
        raise PipelineError(str(exc)) from None
    return pool, pool()


@dataclass
class Prepared:
    """The checked env and the items a run covers."""

    base: TextEnv
    item_ids: list[str]
    indices: list[int]

    @property
    def manifest(self) -> Any:
        return self.base.manifest

    def subset(self) -> dict[str, Any]:
        """The exact subset, as results.json and a rollout's manifest record it."""
        if self.manifest is not None:
            return self.manifest.subset(self.indices, self.base.data.items).to_dict()
        return {"dataset": self.base.dataset_name, "indices": self.indices}


def prepare(spec: RunSpec) -> Prepared:
    """Make the env once (its arguments, dataset and index checked) and resolve the items to play."""
    cls = env_class(spec.env_id)
    check_prompt_style(cls, spec.env_id, spec.env_kwargs)
    base = make_env(spec.env_id, spec.env_kwargs).unwrapped
    try:
        base.check_ready()
    except (RuntimeError, OSError, ValueError) as exc:
        raise PipelineError(f"{spec.env_id} is not ready: {exc}") from None
    manifest = base.manifest
    item_ids = manifest.item_ids if manifest else [str(base.get_item(i).get("id", i)) for i in range(base.num_items())]
    if spec.tasks is not None:
        for t in spec.tasks:
            if t.index is not None and not 0 <= t.index < len(item_ids):
                raise PipelineError(f"--index {t.index} is out of range ({spec.env_id} has {len(item_ids)} items)")
        return Prepared(base, item_ids, [t.index for t in spec.tasks if t.index is not None])
    if spec.start >= len(item_ids) and not spec.subset_file:
        raise PipelineError(f"--start {spec.start} is past the end of the dataset ({len(item_ids)} items)")
    indices = resolve_subset(item_ids, spec.limit, spec.subset_file, spec.start)
    if spec.shard is not None:
        indices = spec.shard.select(indices)
    if not indices:
        raise PipelineError("the subset is empty" + (f" (shard {spec.shard})" if spec.shard else ""))
    return Prepared(base, item_ids, indices)


def resolve_subset(items_ids: Sequence[str], limit: int | None = None, subset_file: str | None = None,
                   start: int = 0) -> list[int]:
    """Dataset indices to evaluate: the first ``limit`` items from ``start``, or a subset file of item
    ids or indices (JSON list, or one per line)."""
    if not subset_file:
        stop = len(items_ids) if limit is None else min(len(items_ids), start + limit)
        return list(range(start, stop))
    path = Path(subset_file)
    if not path.is_file():
        raise PipelineError(f"subset file not found: {path}")
    text = path.read_text().strip()
    try:
        entries = json.loads(text)
        if isinstance(entries, dict):
            entries = entries.get("item_ids") or entries.get("indices") or []
    except json.JSONDecodeError:
        entries = [line.strip() for line in text.splitlines() if line.strip()]
    return indices_of(entries, items_ids)


def recorded_indices(subset: dict[str, Any], items_ids: Sequence[str]) -> list[int]:
    """The dataset indices of a subset as ``results.json`` records it (:meth:`Prepared.subset`): item ids where
    the dataset has a manifest, else indices."""
    return indices_of(subset.get("item_ids") or subset.get("indices") or [], items_ids)


def indices_of(entries: Sequence[Any], items_ids: Sequence[str]) -> list[int]:
    """Item ids or indices (an entry that is no item id but a number) as dataset indices, first mention first."""
    position = {str(i): n for n, i in enumerate(items_ids)}
    out = []
    for e in entries:
        if isinstance(e, int) or (isinstance(e, str) and e.isdigit() and e not in position):
            idx = int(e)
            if not 0 <= idx < len(items_ids):
                raise PipelineError(f"subset index {idx} is out of range (dataset has {len(items_ids)} items)")
            out.append(idx)
        elif str(e) in position:
            out.append(position[str(e)])
        else:
            raise PipelineError(f"subset entry {e!r} is neither an item id nor an index of this dataset")
    return list(dict.fromkeys(out))


# ----------------------------------------------------------------------------- the run


@dataclass
class RunOutcome:
    spec: RunSpec
    prepared: Prepared
    runner: RolloutRunner
    episodes: list[Episode]  # finished by this call
    wall_s: float
    note: str | None = None  # from storing the settings (an earlier run moved aside, say)

    def wanted_ids(self) -> set[str]:
        """Ids of every episode the run's subset asks for (some may come from an earlier, resumed call)."""
        base = self.prepared.base
        dataset = str(base.dataset_name or "")
        return {self.runner.episode_id(base.env_name, dataset, t, kk) for t in self.tasks() for kk in range(self.spec.k)}

    def tasks(self) -> list[RolloutTask]:
        return tasks_of(self.spec, self.prepared)


def tasks_of(spec: RunSpec, prepared: Prepared) -> list[RolloutTask]:
    from turngym.agents.runner import RolloutTask

    return list(spec.tasks) if spec.tasks is not None else [RolloutTask(index=i) for i in prepared.indices]


def check_model(spec: RunSpec) -> None:
    """A ``--model`` naming a local path that holds no model: one line now, not a load's hub retries later."""
    if spec.base_url is not None:
        return
    from turngym.agents.loading import check_model_reference

    try:
        check_model_reference(spec.model)
    except FileNotFoundError as exc:
        raise PipelineError(str(exc)) from None


def load_policy(spec: RunSpec, progress: RunProgress | None = None) -> Any:
    from turngym.agents.loading import load_policy as load

    if progress is not None:
        progress.stage(f"loading model {spec.model!r}")
    start = time.perf_counter()
    try:
        policy = load(spec.model, base_url=spec.base_url, **spec.server_options())
    except (RuntimeError, FileNotFoundError, ValueError) as exc:
        raise PipelineError(str(exc)) from None
    if progress is not None:
        progress.stage(f"model ready in {time.perf_counter() - start:.1f} s")
    return policy


def execute(spec: RunSpec, writer: Writer, *, policy: Any = None, progress: RunProgress | None = None,
            overwrite: bool = False) -> RunOutcome:
    """Check everything, lock the writer's output, load the policy (unless given), then play what is missing."""
    validate(spec)
    if progress is not None:
        progress.stage(f"checking {spec.env_id} and its data")
    prepared = prepare(spec)  # before the lock: a bad env or subset leaves no file behind
    try:
        with writer.lock():
            return _locked(spec, prepared, writer, policy, progress, overwrite)
    except RunError as exc:
        raise PipelineError(str(exc)) from None


def _locked(spec: RunSpec, prepared: Prepared, writer: Writer, policy: Any, progress: RunProgress | None,
            overwrite: bool) -> RunOutcome:
    run = writer.check(spec, overwrite)
    if policy is None:
        check_model(spec)
    join_ray(spec)
    if policy is None:
        policy = load_policy(spec, progress)
    factory, first = env_factory(spec, policy)
    try:
        return _play(spec, prepared, writer, policy, progress, overwrite, factory, first, run)
    finally:
        factory.shutdown()  # the Ray pool's actors; nothing for in-process envs


def _play(spec: RunSpec, prepared: Prepared, writer: Writer, policy: Any, progress: RunProgress | None,
          overwrite: bool, factory: EnvFactory, first: Any, run: RunIdentity) -> RunOutcome:
    from turngym.agents.policy import PolicyError
    from turngym.agents.runner import RolloutRunner
    from turngym.agents.tokenization import ChatTemplateError

    try:
        runner = RolloutRunner(policy, factory, _sampling(spec), k=spec.k, concurrency=spec.concurrency, seed=spec.seed,
                               batching=spec.batching, env_pool=[first], run_id=run.id, run_settings=run.settings)
    except (ValueError, ChatTemplateError) as exc:
        raise PipelineError(str(exc)) from None
    note = writer.store(spec, overwrite, run)  # the run can start
    writer.before_run(spec, prepared)
    tasks = tasks_of(spec, prepared)
    start = time.perf_counter()
    if progress is not None:
        progress.start(len(tasks) * spec.k)
    try:
        episodes = runner.run(tasks, writer.episodes_path, progress=progress.episode if progress else None,
                              on_turn=progress.turn if progress else None)
    except PolicyError as exc:
        where = f"Episodes already written are kept in {writer.episodes_path}; " if writer.episodes_path else ""
        raise PipelineError(f"the model backend failed: {exc}. {where}rerun the same command to continue") from None
    except ChatTemplateError as exc:
        raise PipelineError(str(exc)) from None
    except RuntimeError as exc:
        if spec.ray is None:
            raise
        from turngym.run.backends.ray_pool import RayPoolError

        if not isinstance(exc, RayPoolError):
            raise
        where = f"Episodes already written are kept in {writer.episodes_path}; " if writer.episodes_path else ""
        raise PipelineError(f"the Ray env pool failed: {exc}. {where}rerun the same command to continue") from None
    finally:
        if progress is not None:
            progress.finish()
    return RunOutcome(spec, prepared, runner, episodes, time.perf_counter() - start, note)


def _sampling(spec: RunSpec) -> Any:
    from turngym.agents.policy import SamplingParams

    return SamplingParams(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, seed=spec.seed)
