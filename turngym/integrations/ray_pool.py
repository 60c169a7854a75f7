"""Envs on a pool of Ray actors, behind the rollout runner's env seam (the ``[ray]`` extra).

Generation stays with the policy in the calling process; only env work moves. Each actor
(:class:`EnvWorker`) holds ``envs_per_worker`` live turngym envs (any registered env id and its
arguments) and steps them statefully. :meth:`RayEnvPool.env` is an env factory for
:class:`turngym.agents.runner.RolloutRunner`: it hands out a :class:`RemoteEnv`, a stand-in that keeps a
local copy of the episode (the runner adds its token ids and timings to it) and forwards ``reset``,
``step`` and ``end_episode`` to one slot of one actor. The pool has ``workers × envs_per_worker`` slots;
the runner never keeps more episodes live than that (back-pressure), and Ray places the actors by their
resources (``num_cpus`` each, no GPU; ``resources`` for custom node labels).

Faults: when an actor dies (its process killed), every env it held is moved to a slot on a live actor
and its episode restored there by replaying the recorded actions (``turngym.envs.base.restore``); the
episode's run record lists each replay (``meta["ray"]["replays"]``), so nothing is lost or written
twice. The dead actor is never handed out again; a fresh actor takes its place.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from turngym.agents.env_handle import EnvFactory
from turngym.episode import Episode, Turn, reward_view
from turngym.extras import require

PART = "the Ray env pool (--ray)"
MAX_RECOVERIES = 3  # actor losses one call survives before the run stops
# run-record fields of a turn: written by the runner on the local copy, never by the env
_RUN_TURN_FIELDS = ("action_ids", "action_logprobs", "observation_ids", "prefill_ids")


class RayPoolError(RuntimeError):
    """The pool cannot run as asked (Ray missing, cluster unreachable, env not buildable on a worker)."""


def _ray() -> Any:
    require(PART)
    import ray

    return ray


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`RayPoolError` naming ``address`` when no TCP connection to it opens."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise RayPoolError(f"--ray {address}: give 'auto' or HOST:PORT (a Ray head's GCS address) or ray://HOST:PORT")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise RayPoolError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None


# Ray's driver installs a SIGSEGV handler at ``ray.init`` and resets SIGSEGV to the default at ``shutdown``.
# The JVM behind Lucene search raises SIGSEGV on purpose in normal work, so in a process that also searches,
# either step kills the process (exit 139, no message) at the JVM's next such signal. Ray's documented switch
# is the environment variable below, read when ``ray`` is imported; its module constant is what ``init`` reads.
NO_SIGNAL_HANDLER = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"


def init_ray(**kwargs: Any) -> None:
    """``ray.init(**kwargs)`` without Ray's failure signal handler in this process, so a JVM here (Lucene)
    keeps its own, whether ``ray`` was imported before or not; the processes Ray starts from here (its local
    cluster, its workers) inherit the same setting."""
    ray = _ray()
    import ray._private.ray_constants as ray_constants

    before_env, before_const = os.environ.get(NO_SIGNAL_HANDLER), ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    os.environ[NO_SIGNAL_HANDLER] = "1"
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    try:
        ray.init(**kwargs)
    finally:
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = before_const
        if before_env is None:
            os.environ.pop(NO_SIGNAL_HANDLER, None)
        else:
            os.environ[NO_SIGNAL_HANDLER] = before_env


def connect(address: str = "auto", num_cpus: int | None = None) -> None:
    """Join a Ray cluster: ``auto`` joins the running one (``RAY_ADDRESS`` or the local head) or starts a
    local one; ``HOST:PORT`` / ``ray://HOST:PORT`` joins that one, checked first so an unreachable address
    is one message, not a minute of retries. Nothing happens when Ray is already initialised."""
    ray = _ray()
    if ray.is_initialized():
        return
    if address != "auto":
        _reachable(address)
    try:
        init_ray(address=None if address == "auto" else address, num_cpus=num_cpus, log_to_driver=False,
                 include_dashboard=False, ignore_reinit_error=True)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayPoolError(f"cannot join the Ray cluster at {address}: {exc}") from None


def _last_line(exc: BaseException) -> str:
    """The line of a Ray error that says what went wrong (the cause's ``Type: message``, after Ray's traceback)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _env_record(ep: Episode) -> dict[str, Any]:
    """What the env wrote on an episode (no run records): what a worker sends back and replays from."""
    d = ep.to_dict()
    for t in d["turns"]:
        for key in _RUN_TURN_FIELDS:
            t[key] = None
    d["prompt_ids"] = None
    return d


class EnvWorker:
    """The actor: ``n_envs`` envs of one id, addressed by slot number. Built eagerly, so a worker that cannot
    build them says so in :meth:`ready`, before any episode."""

    def __init__(self, env_id: str | Callable[..., Any], env_kwargs: dict[str, Any], n_envs: int):
        self.envs: list[Any] = []
        self.error: str | None = None
        self.live: set[int] = set()
        self.peak = 0
        try:
            import gymnasium

            import turngym  # noqa: F401 - registers the envs

            make = env_id if callable(env_id) else gymnasium.make
            args = () if callable(env_id) else (env_id,)
            self.envs = [make(*args, **env_kwargs) for _ in range(n_envs)]
        except Exception as exc:  # noqa: BLE001 - reported by ready() as the worker's error
            self.error = f"{type(exc).__name__}: {exc}"

    def ready(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname(), "error": self.error}
        if self.envs:
            e = self.envs[0].unwrapped
            out["attrs"] = {"env_name": e.env_name, "dataset_name": e.dataset_name, "stop": tuple(e.stop),
                            "prefills": bool(e.prefills), "observation_role": e.observation_role,
                            "max_turns": e.max_turns}
        return out

    def _track(self, slot: int) -> None:
        ep = self.envs[slot].unwrapped.episode
        if ep is not None and not ep.done:
            self.live.add(slot)
            self.peak = max(self.peak, len(self.live))
        else:
            self.live.discard(slot)

    def reset(self, slot: int, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
        obs, info = self.envs[slot].reset(seed=seed, options=options)
        self._track(slot)
        return obs, info, _env_record(self.envs[slot].unwrapped.episode)

    def step(self, slot: int, action: str) -> tuple[Any, ...]:
        obs, reward, terminated, truncated, info = self.envs[slot].step(action)
        ep = self.envs[slot].unwrapped.episode
        self._track(slot)
        # once it ends, the whole record: grading may set truth on earlier turns
        return obs, reward, terminated, truncated, info, ep.turns[-1].to_dict(), _env_record(ep) if ep.done else None

    def many(self, calls: list[tuple[str, int, tuple[Any, ...]]]) -> list[Any]:
        """Several envs' ``reset`` / ``step`` calls in one message (one per actor per tick); a call that raised
        gives its error, for that env only."""
        out: list[Any] = []
        for method, slot, args in calls:
            try:
                out.append(self.reset(slot, *args) if method == "reset" else self.step(slot, *args))
            except Exception as exc:  # noqa: BLE001 - re-raised in the caller, for that env only
                out.append(_CallError(exc))
        return out

    def restore(self, slot: int, episode: dict[str, Any], turns: int) -> tuple[list[int], dict[str, Any]]:
        from turngym.envs.base import restore

        differ = restore(self.envs[slot], Episode.from_dict(episode), turns)
        self._track(slot)
        return differ, _env_record(self.envs[slot].unwrapped.episode)

    def end_episode(self, slot: int, reason: str) -> dict[str, Any]:
        self.envs[slot].unwrapped.end_episode(reason)
        self._track(slot)
        return _env_record(self.envs[slot].unwrapped.episode)

    def reply_prefill(self, slot: int) -> str:
        return self.envs[slot].unwrapped.reply_prefill()

    def reseed(self, slot: int, rng: Any) -> None:
        self.envs[slot].unwrapped.np_random = rng

    def score(self, reward: str, config: dict[str, Any], groups: list[list[dict[str, Any]]]) -> list[Any]:
        """Score groups of episodes with a model-free reward here (``turngym.rewards.get_reward``)."""
        from turngym.rewards import get_reward

        scorer = get_reward(reward, **config)
        return [scorer.score_group(reward_view([Episode.from_dict(d) for d in group])) for group in groups]

    def stats(self) -> dict[str, int]:
        """Live episodes now and at most (the back-pressure bound is checked on this)."""
        return {"live": len(self.live), "peak": self.peak, "pid": os.getpid()}


class _Answers:
    """One ``many`` call's answers, fetched (and unpickled) once for all the envs that wait on it."""

    def __init__(self, ref: Any):
        self.ref, self.values = ref, None

    def get(self, wait: Callable[[Any], Any]) -> list[Any]:
        if self.values is None:
            self.values = wait(self.ref)
        return self.values


@dataclass
class _CallError:
    """An env's reset or step raised on the worker (a bug or a bad task; a bad action is recorded on the turn)."""

    error: Exception


@dataclass(eq=False)
class Worker:
    index: int  # the place in the pool; a replacement keeps its place
    actor: Any
    pid: int
    host: str
    generation: int = 0  # 0 for the first actor in this place, +1 per replacement
    alive: bool = True

    @property
    def name(self) -> str:
        return f"worker {self.index}" + (f" (restart {self.generation})" if self.generation else "")


@dataclass
class RayEnvPool(EnvFactory):
    """``workers`` actors with ``envs_per_worker`` envs each; :meth:`env` is the runner's env factory (a declared
    :class:`~turngym.agents.env_handle.EnvFactory`: ``slots``, ``shutdown``)."""

    env_id: str | Callable[..., Any]  # a registered env id, or a class / function making the env from env_kwargs
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    workers: int = 2
    envs_per_worker: int = 8
    num_cpus: float = 1.0  # per actor; envs run on CPU (no GPU is ever asked for)
    resources: dict[str, float] | None = None  # custom Ray resources per actor (e.g. {"env_node": 0.01})
    startup_s: float = 300.0  # how long an actor may take to be placed and build its envs

    def __post_init__(self) -> None:
        if self.workers < 1 or self.envs_per_worker < 1:
            raise RayPoolError(f"--env-workers and --envs-per-worker must be >= 1, got {self.workers} and "
                               f"{self.envs_per_worker}")
        ray = _ray()
        if not ray.is_initialized():
            connect("auto")
        self.name = self.env_id if isinstance(self.env_id, str) else getattr(self.env_id, "__name__", repr(self.env_id))
        self._remote = ray.remote(num_cpus=self.num_cpus, num_gpus=0, resources=self.resources, max_restarts=0,
                                  scheduling_strategy="SPREAD")(EnvWorker)
        self._workers: list[Worker] = []
        self._free: list[tuple[Worker, int]] = []
        self.replaced = 0  # actors started in place of dead ones
        self._queued: dict[Worker, list[tuple[RemoteEnv, str, tuple[Any, ...]]]] = {}  # calls submitted, not sent
        self.attrs: dict[str, Any] = {}
        actors = [self._remote.remote(self.env_id, self.env_kwargs, self.envs_per_worker) for _ in range(self.workers)]
        try:
            for i, actor in enumerate(actors):
                self._add(self._ready(i, actor, 0))
        except BaseException:
            for actor in actors:  # none left holding the cluster's CPUs
                ray.kill(actor)
            self._workers.clear()
            raise

    # ------------------------------------------------------------------ workers

    def _ready(self, index: int, actor: Any, generation: int) -> Worker:
        ray = _ray()
        try:
            info = ray.get(actor.ready.remote(), timeout=self.startup_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor)
            free = ray.available_resources().get("CPU", 0.0)
            raise RayPoolError(f"{self.name}: Ray worker {index} did not start within {self.startup_s:g} s; each worker "
                               f"asks for {self.num_cpus:g} CPU{' and ' + str(self.resources) if self.resources else ''} "
                               f"and the cluster has {free:g} CPU free: use fewer --env-workers or a bigger cluster") from None
        except ray.exceptions.RayError as exc:
            raise RayPoolError(f"{self.name}: Ray worker {index} did not start: {_last_line(exc)}") from None
        if info["error"]:
            ray.kill(actor)
            raise RayPoolError(f"{self.name} cannot be built on Ray worker {index} ({info['host']}): {info['error']}")
        self.attrs = info["attrs"]
        return Worker(index, actor, info["pid"], info["host"], generation)

    def _add(self, worker: Worker) -> None:
        self._workers.append(worker)
        self._free.extend((worker, s) for s in range(self.envs_per_worker))

    @property
    def slots(self) -> int:
        """Envs the pool holds: the most episodes that can be live at once."""
        return self.workers * self.envs_per_worker

    def live_workers(self) -> list[Worker]:
        return [w for w in self._workers if w.alive]

    def lost(self, worker: Worker) -> None:
        """``worker``'s actor died: never hand it out again, and start a fresh actor in its place."""
        if not worker.alive:
            return
        worker.alive = False
        self._workers.remove(worker)
        self._free = [(w, s) for w, s in self._free if w is not worker]
        for env, _, _ in self._queued.pop(worker, []):  # calls that never went out: each env calls again
            env.forget_pending()
        actor = self._remote.remote(self.env_id, self.env_kwargs, self.envs_per_worker)
        self._add(self._ready(worker.index, actor, worker.generation + 1))
        self.replaced += 1

    def acquire(self) -> tuple[Worker, int]:
        """A free slot on a live actor, from the least loaded one (Ray placed the actors)."""
        if not self._free:
            raise RayPoolError(f"all {self.slots} env slots of the Ray pool are in use; run at most {self.slots} "
                               f"episodes at once (--concurrency) or add --env-workers / --envs-per-worker")
        load = dict.fromkeys(self._workers, 0)
        for w, _ in self._free:
            load[w] -= 1
        best = min(range(len(self._free)), key=lambda i: load[self._free[i][0]])
        return self._free.pop(best)

    def queue(self, env: RemoteEnv, method: str, args: tuple[Any, ...]) -> None:
        """Hold ``env``'s call until :meth:`send`: a tick's resets and steps go out as one message per actor."""
        self._queued.setdefault(env.worker, []).append((env, method, args))

    def unqueue(self, env: RemoteEnv) -> None:
        """Drop ``env``'s queued call (it is being replaced before it went out)."""
        items = self._queued.get(env.worker, [])
        items[:] = [item for item in items if item[0] is not env]

    def send(self) -> None:
        """Send every queued call, one ``many`` message per actor; each env learns where its answer is."""
        queued, self._queued = self._queued, {}
        for worker, items in queued.items():
            if not items:
                continue
            answers = _Answers(worker.actor.many.remote([(method, env.slot, args) for env, method, args in items]))
            for i, (env, method, args) in enumerate(items):
                env.sent((method, args), answers, i)

    def release(self, worker: Worker, slot: int) -> None:
        if worker.alive:
            self._free.append((worker, slot))

    def env(self) -> RemoteEnv:
        """The env factory: a new env bound to a free slot."""
        worker, slot = self.acquire()
        return RemoteEnv(self, worker, slot)

    __call__ = env  # the pool itself is the runner's env_factory (the runner reads ``slots`` from it)

    def score(self, reward: str, groups: list[list[Episode]], **config: Any) -> list[Any]:
        """``get_reward(reward, **config).score_group(group)`` for every group, the groups dealt out to the actors
        (a group is never split): model-free rewards (outcome, TTRL, EMPO, funrl) off the calling process."""
        ray = _ray()
        live = self.live_workers()
        shares: list[list[int]] = [[] for _ in live]
        for i in range(len(groups)):
            shares[i % len(live)].append(i)
        refs = [w.actor.score.remote(reward, config, [[e.to_dict() for e in groups[i]] for i in share])
                for w, share in zip(live, shares, strict=True) if share]
        out: list[Any] = [None] * len(groups)
        try:
            answers = ray.get(refs)
        except ray.exceptions.RayTaskError as exc:
            raise exc.as_instanceof_cause() from None
        for share, scores in zip((s for s in shares if s), answers, strict=True):
            for i, sc in zip(share, scores, strict=True):
                out[i] = sc
        return out

    def stats(self) -> list[dict[str, int]]:
        """Each live actor's live episodes now and at most."""
        ray = _ray()
        return ray.get([w.actor.stats.remote() for w in self.live_workers()])

    def shutdown(self) -> None:
        ray = _ray()
        for w in self._workers:
            if w.alive:
                ray.kill(w.actor)
                w.alive = False
        self._workers.clear()
        self._free.clear()

    def __enter__(self) -> RayEnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class RemoteEnv:
    """One env slot on a pool actor, as the runner sees an env: an env handle (``turngym.agents.env_handle``:
    ``reset``, ``step``, ``close``, and as ``unwrapped`` itself, with the env's declared attributes and ``episode``
    a local copy). ``submit_reset`` / ``submit_step`` queue a call without waiting, so the runner steps all its
    envs in one round of messages."""

    def __init__(self, pool: RayEnvPool, worker: Worker, slot: int):
        self.pool, self.worker, self.slot = pool, worker, slot
        self.episode: Episode | None = None
        self._pending: tuple[tuple[str, tuple[Any, ...]], _Answers | None, int] | None = None  # a call submitted
        for key, value in pool.attrs.items():
            setattr(self, key, value)

    @property
    def unwrapped(self) -> RemoteEnv:
        return self

    # ------------------------------------------------------------------ calls

    def _send(self, method: str, *args: Any) -> Any:
        return getattr(self.worker.actor, method).remote(self.slot, *args)

    def _wait(self, ref: Any) -> Any:
        ray = _ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # the env itself raised: the same exception as in process
            raise exc.as_instanceof_cause() from None

    def _lost_errors(self) -> tuple[type[BaseException], ...]:
        ray = _ray()
        return (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)

    def _call(self, method: str, *args: Any, replay: bool = True) -> Any:
        """``method`` on this env's actor; when the actor is lost, move to a fresh slot (the episode replayed
        there when ``replay``) and call again."""
        for attempt in range(MAX_RECOVERIES + 1):
            try:
                return self._wait(self._send(method, *args))
            except self._lost_errors() as exc:
                if attempt == MAX_RECOVERIES:
                    raise RayPoolError(f"{self.pool.name}: Ray workers died {attempt + 1} times under one call "
                                       f"({_last_line(exc)})") from None
                self._recover(exc, replay)
        raise AssertionError("unreachable")

    def _recover(self, exc: BaseException, replay: bool) -> None:
        """Leave the dead actor for a free slot on a live one; restore the live episode there by replay."""
        dead = self.worker
        self.pool.lost(dead)
        self.worker, self.slot = self.pool.acquire()
        ep = self.episode
        if not replay or ep is None or ep.done:
            return
        start = time.perf_counter()
        n = len(ep.turns)
        differ, record = self._wait(self._send("restore", _env_record(ep), n))
        if record["prompt"] != ep.prompt:
            raise RayPoolError(f"episode {ep.id}: the fresh worker rendered another prompt; it cannot be restored")
        ray_meta = dict(ep.meta.get("ray") or {})
        ray_meta["replays"] = [*ray_meta.get("replays", []), {
            "lost": dead.name, "after_turns": n, "replay_differs": differ, "to": self.worker.name,
            "replay_ms": round((time.perf_counter() - start) * 1000.0, 1), "reason": type(exc).__name__}]
        ray_meta["worker"] = self.worker.name
        ep.add_run_record(meta={"ray": ray_meta})

    # ------------------------------------------------------------------ the env API

    def _submit(self, method: str, args: tuple[Any, ...]) -> None:
        if self._pending is not None and self._pending[1] is None:
            self.pool.unqueue(self)
        self._pending = ((method, args), None, 0)
        self.pool.queue(self, method, args)

    def sent(self, call: tuple[str, tuple[Any, ...]], answers: _Answers, index: int) -> None:
        self._pending = (call, answers, index)

    def forget_pending(self) -> None:
        self._pending = None

    def _answer(self, method: str, args: tuple[Any, ...], replay: bool) -> Any:
        """The answer to a call submitted earlier with these arguments (sending the queue first), else a call now."""
        pending = self._pending
        if pending is not None and pending[0] == (method, args) and pending[1] is None:
            self.pool.send()  # this env's call and every other queued one
            pending = self._pending
        self._pending = None
        if pending is not None and pending[0] == (method, args):
            try:
                out = pending[1].get(self._wait)[pending[2]]
            except self._lost_errors() as exc:
                self._recover(exc, replay)
            else:
                if isinstance(out, _CallError):
                    raise out.error
                return out
        elif pending is not None and pending[1] is None:
            self.pool.unqueue(self)
        return self._call(method, *args, replay=replay)

    def submit_reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Queue ``reset``; the next ``reset`` with the same arguments takes its answer (see :meth:`submit_step`)."""
        self.episode = None
        self._submit("reset", (seed, options or {}))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self.episode = None  # nothing to replay: a lost actor only moves the reset
        obs, info, record = self._answer("reset", (seed, options or {}), replay=False)
        self.episode = Episode.from_dict(record)
        self.episode.add_run_record(meta={"ray": {"worker": self.worker.name}})
        return obs, info

    def submit_step(self, action: str) -> None:
        """Queue ``step(action)`` with the pool (sent with the tick's other calls, one message per actor, at the
        first call that waits); the next ``step(action)`` takes its answer."""
        self._submit("step", (action,))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.episode is None:
            raise RuntimeError("call reset() before step()")
        obs, reward, terminated, truncated, info, turn, record = self._answer("step", (action,), replay=True)
        self.episode.turns.append(Turn.from_dict(turn))
        if record is not None:
            self._sync(record)
        return obs, reward, terminated, truncated, info

    def end_episode(self, reason: str) -> None:
        if self.episode is None or self.episode.done:
            return
        self._sync(self._call("end_episode", reason))

    def reply_prefill(self) -> str:
        return self._call("reply_prefill") if self.prefills else ""

    @property
    def np_random(self) -> Any:
        raise AttributeError("a pool env's random generator lives on its worker")

    @np_random.setter
    def np_random(self, rng: Any) -> None:
        self._call("reseed", rng)

    def _sync(self, record: dict[str, Any]) -> None:
        """Take what the env wrote once the episode ended (outcome, truth set at grading, the last observation
        dropped), keeping the runner's token ids and timings on the local copy."""
        ep, remote = self.episode, Episode.from_dict(record)
        assert ep is not None
        for mine, theirs in zip(ep.turns, remote.turns, strict=True):
            kept = {k: getattr(mine, k) for k in _RUN_TURN_FIELDS}
            generate = mine.latency_ms.get("generate")
            finish = mine.metrics.get("finish_reason")
            mine.__dict__.update({k: v for k, v in theirs.__dict__.items() if k not in _RUN_TURN_FIELDS})
            mine.__dict__.update(kept)
            if generate is not None:
                mine.latency_ms["generate"] = generate
            if finish is not None:
                mine.metrics.setdefault("finish_reason", finish)
        ep.final_answer, ep.outcome = remote.final_answer, remote.outcome
        ep.terminated, ep.truncated = remote.terminated, remote.truncated
        ep.meta.update({k: v for k, v in remote.meta.items() if k not in ep.meta})
        if "truncation" in remote.meta:
            ep.meta["truncation"] = remote.meta["truncation"]

    def close(self) -> None:
        self.pool.release(self.worker, self.slot)
