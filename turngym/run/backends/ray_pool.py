"""Envs on a pool of Ray actors, behind the rollout runner's env seam (the ``[ray]`` extra).

Generation stays with the policy in the calling process; only env work moves. Each actor
(:class:`EnvWorker`) holds ``envs_per_worker`` live turngym envs (any registered env id and its
arguments) and steps them statefully. :meth:`RayEnvPool.env` is an env factory for
:class:`turngym.agents.runner.RolloutRunner`: it hands out a :class:`RemoteEnv`, a stand-in that keeps a
local copy of the episode (the runner adds its token ids and timings to it) and forwards ``reset``,
``step`` and ``end_episode`` to one slot of one actor. The pool has ``workers × envs_per_worker`` slots;
the runner never keeps more episodes live than that (back-pressure), and Ray places the actors by their
resources (``num_cpus`` each, no GPU; ``resources`` for custom node labels).

Faults (``ray_faults.py``; docs/scale.md): every loss of an actor is one event, whatever the moment. An actor
that dies (starting, before ready, mid-episode, during a replay, with others), or misses the deadline of a
call (the env's step budget per call it holds, plus slack: then it is killed), is never handed out again; a
fresh actor takes its place and every live episode it held is restored on a live actor by replaying the
recorded actions (``turngym.envs.base.restore``), listed in the episode's run record
(``meta["ray"]["replays"]``), so nothing is lost or written twice. Losses are paid from one budget per run,
with back-off between failed starts; a spent budget, a cluster whose GCS no longer answers, or a cluster
that cannot place an actor ends the run with one :class:`RayPoolError` line. An episode whose step alone
kills its actor again and again is poison: that turn is recorded as an ``env_error`` and the episode ends
there; the run goes on.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from turngym.agents.env_handle import EnvFactory, end_with_env_error
from turngym.episode import Episode, Turn, reward_view
from turngym.extras import require
from turngym.run.backends.ray_address import check_address, gcs_answers
from turngym.run.backends.ray_faults import (
    DEADLINE_SLACK_S,
    DEFAULT_STEP_BUDGET_S,
    POISON_DEATHS,
    CallError,
    Death,
    Deaths,
    RayPoolError,
    WorkerLost,
    crossable_info,
    last_line,
    log,
    lost_errors,
)

__all__ = ["PART", "EnvWorker", "RayEnvPool", "RayPoolError", "RemoteEnv", "connect", "init_ray", "step_budget_s"]

PART = "the Ray env pool (--ray)"
POLL_S = 5.0  # a call waits at most this long between checks that the cluster's GCS still answers
# run-record fields of a turn: written by the runner on the local copy, never by the env
_RUN_TURN_FIELDS = ("action_ids", "action_logprobs", "observation_ids", "prefill_ids")
_last_line = last_line  # the name the CLI tests and older callers use


def _ray() -> Any:
    require(PART)
    import ray

    return ray


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`RayPoolError` naming ``address`` when it is not a Ray cluster's GCS (``ray_address.py``)."""
    check_address(address, timeout_s)


# Ray's driver installs a SIGSEGV handler at ``ray.init`` and resets SIGSEGV to the default at ``shutdown``.
# The JVM behind Lucene search raises SIGSEGV on purpose in normal work, so in a process that also searches,
# either step kills the process (exit 139, no message) at the JVM's next such signal. Ray's documented switch
# is the environment variable below, read when ``ray`` is imported; its module constant is what ``init`` reads.
NO_SIGNAL_HANDLER = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"


def init_ray(**kwargs: Any) -> None:
    """``ray.init(**kwargs)`` without Ray's failure signal handler in this process, so a JVM here (Lucene)
    keeps its own, whether ``ray`` was imported before or not; the processes Ray starts from here (its local
    cluster, its workers) inherit the same setting. The SIGTERM handler is kept too: Ray's exits with status 15
    at once, where turngym's flushes the episodes finished and exits 143, as a run in process does."""
    ray = _ray()
    import ray._private.ray_constants as ray_constants

    before_env, before_const = os.environ.get(NO_SIGNAL_HANDLER), ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    main = threading.current_thread() is threading.main_thread()
    before_term = signal.getsignal(signal.SIGTERM) if main else None
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
        if main and before_term is not None:
            signal.signal(signal.SIGTERM, before_term)


def connect(address: str = "auto", num_cpus: int | None = None) -> None:
    """Join a Ray cluster: ``auto`` joins the running one (``RAY_ADDRESS`` or the local head) or starts a
    local one; ``HOST:PORT`` / ``ray://HOST:PORT`` joins that one. An address is checked first (it answers as
    a Ray GCS, wants no token the driver lacks: ``ray_address.py``), so a wrong one is one line within seconds,
    not minutes of Ray's retries. Nothing happens when Ray is already initialised."""
    ray = _ray()
    if ray.is_initialized():
        return
    target = address if address != "auto" else os.environ.get("RAY_ADDRESS")
    if target and target not in ("auto", "local"):  # "local": start a cluster here, as Ray reads it
        check_address(target)
    elif address == "auto" and not target:
        check_recorded_head()
    try:
        init_ray(address=None if address == "auto" else address, num_cpus=num_cpus, log_to_driver=False,
                 include_dashboard=False, ignore_reinit_error=True)
    except Exception as exc:  # Ray raises a plain Exception for a local node that timed out while starting
        raise RayPoolError(f"cannot join the Ray cluster at {address}: {last_line(exc)}") from None


def check_recorded_head() -> None:
    """``ray.init()`` with no address joins the head the last ``ray start`` on this machine recorded (Ray's temp
    folder, ``ray_current_cluster``); a head that died without ``ray stop`` leaves it behind, and Ray would retry
    it for minutes in silence. Such a head is one line (RayPoolError) within seconds."""
    from ray._common.utils import get_ray_address_file
    from ray._private.services import find_bootstrap_address

    recorded = find_bootstrap_address(None)
    if not recorded:
        return
    try:
        check_address(recorded)
    except RayPoolError as exc:
        raise RayPoolError(f"--ray auto joins the last Ray head started on this machine, {recorded} (recorded in "
                           f"{get_ray_address_file(None)}), which does not answer ({exc}); `ray stop` forgets it, "
                           "or give the address of a running head") from None


def check_local_capacity(env_workers: int) -> None:
    """A cluster this process started (``--ray auto`` with none to join) never grows, so workers it cannot place
    (one CPU each) are refused now (RayPoolError), not after the pool's start-up wait; a joined cluster may grow."""
    ray = _ray()
    from ray._private import worker as ray_worker

    node = ray_worker._global_node  # the driver's node: its head only when this process started the cluster
    cpus = ray.cluster_resources().get("CPU", 0.0)
    if node is not None and node.head and env_workers > cpus:
        raise RayPoolError(f"--env-workers {env_workers} asks for {env_workers} CPUs (one per worker), but the local Ray "
                           f"cluster started here has {cpus:g}: use --env-workers {int(cpus)} or fewer, or join a "
                           "bigger cluster with --ray ADDRESS")


def step_budget_s(env: Any) -> float:
    """The longest one step of ``env`` may take, from what the env says of itself: its ``step_budget_s`` when it
    declares one, else a base for parsing and grading plus, for a code env, each cell's wall and start-up limits
    times the cells one action may run, and its grading timeout. A call's deadline is built from it."""
    declared = getattr(env, "step_budget_s", None)
    if declared:
        return float(declared)
    budget = DEFAULT_STEP_BUDGET_S
    limits = getattr(env, "limits", None)
    if limits is not None:
        cells = int(getattr(env, "max_code_blocks", 1) or 1)
        budget += cells * (float(getattr(limits, "wall_s", 0.0)) + float(getattr(limits, "startup_s", 0.0)))
    return budget + 2.0 * float(getattr(env, "grading_timeout_s", 0.0) or 0.0)


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
            out["step_budget_s"] = step_budget_s(e)
        return out

    def _track(self, slot: int) -> None:
        ep = self.envs[slot].unwrapped.episode
        if ep is not None and not ep.done:
            self.live.add(slot)
            self.peak = max(self.peak, len(self.live))
        else:
            self.live.discard(slot)

    def reset(self, slot: int, seed: int | None, options: dict[str, Any]) -> tuple[Any, ...]:
        obs, info = self.envs[slot].reset(seed=seed, options=options)
        self._track(slot)
        info, dropped = crossable_info(info)
        return obs, info, _env_record(self.envs[slot].unwrapped.episode), dropped

    def step(self, slot: int, action: str) -> tuple[Any, ...]:
        obs, reward, terminated, truncated, info = self.envs[slot].step(action)
        ep = self.envs[slot].unwrapped.episode
        self._track(slot)
        info, dropped = crossable_info(info)
        # once it ends, the whole record: grading may set truth on earlier turns
        return (obs, reward, terminated, truncated, info, ep.turns[-1].to_dict(), _env_record(ep) if ep.done else None,
                dropped)

    def many(self, calls: list[tuple[str, int, tuple[Any, ...]]]) -> list[Any]:
        """Several envs' ``reset`` / ``step`` calls in one message (one per actor per tick); a call that raised
        gives its error, for that env only (one that cannot be pickled as its type and message)."""
        out: list[Any] = []
        for method, slot, args in calls:
            try:
                out.append(self.reset(slot, *args) if method == "reset" else self.step(slot, *args))
            except Exception as exc:  # noqa: BLE001 - raised in the caller as EnvCallError, for that env only
                out.append(CallError.of(exc))
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
    """One ``many`` call's answers, fetched (and unpickled) once for all the envs that wait on it; a lost actor
    is found once too (every env that waited on it gets the same :class:`WorkerLost`)."""

    def __init__(self, ref: Any, worker: Worker, deadline_s: float):
        self.ref, self.worker, self.deadline_s = ref, worker, deadline_s
        self.values: list[Any] | None = None
        self.lost: WorkerLost | None = None

    def get(self, pool: RayEnvPool) -> list[Any]:
        if self.lost is not None:
            raise self.lost
        if self.values is None:
            try:
                self.values = pool.wait(self.ref, self.worker, self.deadline_s)
            except WorkerLost as lost:
                self.lost = lost
                raise
        return self.values


class _Poison(Exception):  # noqa: N818 - a verdict on an episode, handled by RemoteEnv.step
    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


@dataclass(eq=False)
class Worker:
    index: int  # the place in the pool; a replacement keeps its place
    actor: Any
    pid: int
    host: str
    generation: int = 0  # 0 for the first actor in this place, +1 per replacement
    alive: bool = True
    death: Death | None = None  # once lost: the record its moved episodes count on

    @property
    def name(self) -> str:
        return _place_name(self.index, self.generation)


def _place_name(index: int, generation: int) -> str:
    return f"worker {index}" + (f" (restart {generation})" if generation else "")


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
    restarts: int | None = None  # actors this run may lose (None: 2 per worker, at least 8); then it stops
    step_budget_s: float | None = None  # the longest one env step may take (None: the env's own, step_budget_s())
    deadline_slack_s: float = DEADLINE_SLACK_S  # added to each call's deadline: Ray's messaging and scheduling

    def __post_init__(self) -> None:
        if self.workers < 1 or self.envs_per_worker < 1:
            raise RayPoolError(f"--env-workers and --envs-per-worker must be >= 1, got {self.workers} and "
                               f"{self.envs_per_worker}")
        ray = _ray()
        if not ray.is_initialized():
            connect("auto")
        self.name = self.env_id if isinstance(self.env_id, str) else getattr(self.env_id, "__name__", repr(self.env_id))
        budget = max(8, 2 * self.workers) if self.restarts is None else int(self.restarts)
        self.deaths = Deaths(budget, what=self.name)
        # max_restarts=0: a restarted actor would come back with fresh envs under the same handle, so the pool
        # could not tell which episodes to replay; a fresh actor in the same place makes the loss explicit
        self._remote = ray.remote(num_cpus=self.num_cpus, num_gpus=0, resources=self.resources, max_restarts=0,
                                  max_task_retries=0, scheduling_strategy="SPREAD")(EnvWorker)
        self._workers: list[Worker] = []
        self._free: list[tuple[Worker, int]] = []
        self.replaced = 0  # actors started in place of dead ones
        self._queued: dict[Worker, list[tuple[RemoteEnv, str, tuple[Any, ...]]]] = {}  # calls submitted, not sent
        self.attrs: dict[str, Any] = {}
        self._budget_s = self.step_budget_s
        self._gcs = ray.get_runtime_context().gcs_address
        self._checked = time.monotonic()
        self.cluster_gone: str | None = None  # once the cluster is found gone: the line that said so
        self._starting: list[Any] = []  # actors created and not yet ready (killed if the pool cannot start)
        actors = [self._create() for _ in range(self.workers)]
        try:
            for i, actor in enumerate(actors):
                self._add(self._start(i, 0, actor))
        except BaseException:
            self.shutdown()  # none left holding the cluster's CPUs
            raise

    # ------------------------------------------------------------------ workers

    def _create(self) -> Any:
        actor = self._remote.remote(self.env_id, self.env_kwargs, self.envs_per_worker)
        self._starting.append(actor)
        return actor

    def _start(self, index: int, generation: int, actor: Any = None) -> Worker:
        """A ready actor for place ``index``: an actor that dies or freezes before it is ready is one more loss
        (from the run's budget), and the next start waits longer (back-off)."""
        failed, lost_here = 0, []
        while True:
            if actor is None:
                pause = self.deaths.pause(failed)
                if pause:
                    time.sleep(pause)
                self.check_cluster(nodes=True)
                actor = self._create()
            try:
                worker = self._ready(index, actor, generation)
            except WorkerLost as lost:
                self._kill(actor)
                failed += 1
                lost_here.append(self.deaths.spend(_place_name(index, generation),
                                                   f"lost before it was ready: {lost.cause}"))
                actor, generation = None, generation + 1
                continue
            for death in lost_here:  # each replaced once this place has a ready actor
                death.replaced_s = time.monotonic() - death.at
            return worker

    def _ready(self, index: int, actor: Any, generation: int) -> Worker:
        ray = _ray()
        ref = actor.ready.remote()
        deadline = time.monotonic() + self.startup_s
        while True:
            try:
                info = ray.get(ref, timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
                break
            except ray.exceptions.GetTimeoutError:
                if time.monotonic() < deadline:
                    self.check_cluster(nodes=True)
                    continue
                if not self._placed(ref):
                    self._kill(actor)
                    free = ray.available_resources().get("CPU", 0.0)
                    raise RayPoolError(
                        f"{self.name}: Ray worker {index} did not start within {self.startup_s:g} s; each worker "
                        f"asks for {self.num_cpus:g} CPU{' and ' + str(self.resources) if self.resources else ''} "
                        f"and the cluster has {free:g} CPU free: use fewer --env-workers or a bigger cluster") from None
                raise WorkerLost(None, f"no answer within {self.startup_s:g} s though the cluster can place it "
                                       f"(frozen while starting?)") from None
            except ray.exceptions.RayTaskError as exc:
                self._kill(actor)
                raise RayPoolError(f"{self.name}: Ray worker {index} did not start: {last_line(exc)}") from None
            except lost_errors() as exc:
                raise WorkerLost(None, last_line(exc)) from None
        if info["error"]:
            self._kill(actor)
            raise RayPoolError(f"{self.name} cannot be built on Ray worker {index} ({info['host']}): {info['error']}")
        self._starting.remove(actor)
        self.attrs = info["attrs"]
        if self._budget_s is None:
            self._budget_s = float(info["step_budget_s"])
        return Worker(index, actor, info["pid"], info["host"], generation)

    @staticmethod
    def _placed(ref: Any) -> bool:
        """Has Ray given the actor of call ``ref`` a process (placed it on a node)? Read from the GCS's actor table:
        an actor still waiting for resources has no pid; one placed that does not answer is frozen."""
        from ray._private.state import actors

        return bool((actors(ref.task_id().actor_id().hex()) or {}).get("Pid"))

    def check_cluster(self, nodes: bool = False) -> None:
        """Raise :class:`RayPoolError` (one line) when the cluster's GCS stopped answering (its head node died or
        ``ray stop`` ran), or with ``nodes`` when no node of it is alive. Said before Ray gives up on the GCS (a
        minute) and ends this process without a word, so the run's finished episodes are flushed first."""
        self._checked = time.monotonic()
        if self.cluster_gone:
            raise RayPoolError(self.cluster_gone)
        if not gcs_answers(self._gcs):
            self.cluster_gone = (f"{self.name}: the Ray cluster is gone: its GCS at {self._gcs} does not answer (the "
                                 f"head node died or `ray stop` ran)")
            raise RayPoolError(self.cluster_gone)
        if nodes and not any(n.get("Alive") for n in _ray().nodes()):
            self.cluster_gone = f"{self.name}: the Ray cluster at {self._gcs} has no live node (its raylets died)"
            raise RayPoolError(self.cluster_gone)

    def _check_now_and_then(self) -> None:
        """A call that answers needs no GCS, but Ray ends this process a minute after the GCS is lost: look every
        ``POLL_S`` seconds, so a lost cluster is found while the run can still flush and say so."""
        if time.monotonic() - self._checked >= POLL_S:
            self.check_cluster()

    def _kill(self, actor: Any) -> None:
        ray = _ray()
        if actor in self._starting:
            self._starting.remove(actor)
        if self.cluster_gone:  # nothing to free, and no GCS to ask
            return
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone, or its cluster is: nothing left to free  # nosec B110
            pass

    def _add(self, worker: Worker) -> None:
        self._workers.append(worker)
        self._free.extend((worker, s) for s in range(self.envs_per_worker))

    @property
    def slots(self) -> int:
        """Envs the pool holds: the most episodes that can be live at once."""
        return self.workers * self.envs_per_worker

    def live_workers(self) -> list[Worker]:
        return [w for w in self._workers if w.alive]

    def lost(self, worker: Worker, cause: str = "lost") -> None:
        """``worker``'s actor is gone (died, or killed for a missed deadline): never hand it out again, and start
        a fresh actor in its place. Paid from the run's budget; the same worker found lost twice costs once."""
        if not worker.alive:
            return
        worker.alive = False
        self._workers.remove(worker)
        self._free = [(w, s) for w, s in self._free if w is not worker]
        for env, _, _ in self._queued.pop(worker, []):  # calls that never went out: each env calls again
            env.forget_pending()
        self._kill(worker.actor)
        self.check_cluster(nodes=True)
        worker.death = self.deaths.spend(worker.name, cause)
        started = time.monotonic()
        fresh = self._start(worker.index, worker.generation + 1)
        worker.death.replaced_s = time.monotonic() - started
        self._add(fresh)
        self.replaced += 1

    def wait(self, ref: Any, worker: Worker, deadline_s: float) -> Any:
        """``ray.get(ref)`` within ``deadline_s``, checking the cluster every few seconds. An actor that died
        raises :class:`WorkerLost`; one that missed the deadline is killed and raises it too (said once)."""
        ray = _ray()
        self._check_now_and_then()
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                return ray.get(ref, timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
            except ray.exceptions.GetTimeoutError:
                if time.monotonic() >= deadline:
                    raise self._missed(worker, deadline_s) from None
                self.check_cluster()
            except ray.exceptions.RayTaskError as exc:  # the worker's own code raised (an env's reset and step
                raise exc.as_instanceof_cause() from None  # come back as CallError, never here)
            except lost_errors() as exc:
                raise WorkerLost(worker, last_line(exc)) from None

    def _missed(self, worker: Worker, deadline_s: float) -> WorkerLost:
        cause = f"missed its deadline of {deadline_s:.0f} s (frozen or overloaded)"
        if worker.alive:
            log.warning("%s: Ray %s (pid %s on %s) %s; it is killed and its episodes are replayed on a fresh actor",
                        self.name, worker.name, worker.pid, worker.host, cause)
        return WorkerLost(worker, cause)

    def deadline_s(self, steps: int = 1) -> float:
        """A call's deadline: ``steps`` env steps at the env's step budget, plus slack for Ray itself."""
        return self.deadline_slack_s + max(1, steps) * float(self._budget_s or DEFAULT_STEP_BUDGET_S)

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
            if not worker.alive:  # lost since the calls were queued: each env calls again
                for env, _, _ in items:
                    env.forget_pending()
                continue
            answers = _Answers(worker.actor.many.remote([(method, env.slot, args) for env, method, args in items]),
                               worker, self.deadline_s(len(items)))
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
        (a group is never split): model-free rewards (outcome, TTRL, EMPO, funrl) off the calling process. A
        share whose actor is lost is scored again on the live ones."""
        out: list[Any] = [None] * len(groups)
        todo = list(range(len(groups)))
        while todo:
            live = self.live_workers()
            shares: list[list[int]] = [todo[i::len(live)] for i in range(len(live))]
            calls = [(w, share, w.actor.score.remote(reward, config, [[e.to_dict() for e in groups[i]] for i in share]))
                     for w, share in zip(live, shares, strict=True) if share]
            todo = []
            for w, share, ref in calls:
                try:
                    scores = self.wait(ref, w, self.deadline_s(sum(len(groups[i]) for i in share)))
                except WorkerLost as lost:
                    self.lost(lost.worker, lost.cause)
                    todo.extend(share)
                    continue
                for i, sc in zip(share, scores, strict=True):
                    out[i] = sc
        return out

    def stats(self) -> list[dict[str, int]]:
        """Each live actor's live episodes now and at most (an actor found lost is replaced, and asked anew)."""
        while True:
            try:
                return [self.wait(w.actor.stats.remote(), w, self.deadline_slack_s) for w in self.live_workers()]
            except WorkerLost as lost:
                self.lost(lost.worker, lost.cause)

    def shutdown(self) -> None:
        for w in self._workers:
            if w.alive:
                self._kill(w.actor)
                w.alive = False
        for actor in list(self._starting):
            self._kill(actor)
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

    def _call(self, method: str, *args: Any, replay: bool = True, steps: int = 1) -> Any:
        """``method`` on this env's actor, alone; when the actor is lost, move to a fresh slot (the episode
        replayed there when ``replay``) and call again. A step whose call alone killed ``POISON_DEATHS`` actors
        is poison (:class:`_Poison`): the episode ends there, not the run."""
        alone_lost = 0
        while True:
            self._settle(replay)
            worker = self.worker
            guarded = method in ("reset", "step")  # the env's own code: what it raises comes back as CallError
            ref = (worker.actor.many.remote([(method, self.slot, args)]) if guarded
                   else getattr(worker.actor, method).remote(self.slot, *args))
            try:
                out = self.pool.wait(ref, worker, self.pool.deadline_s(steps))
            except WorkerLost as lost:
                self.pool.lost(lost.worker, lost.cause)
                alone_lost += 1
                if method == "step" and alone_lost >= POISON_DEATHS:
                    raise _Poison(lost.cause) from None
                continue
            if not guarded:
                return out
            if isinstance(out[0], CallError):
                raise out[0].raised()
            return out[0]

    def _settle(self, replay: bool) -> None:
        """Leave a lost actor for a free slot on a live one; restore the live episode there by replay (a slot
        whose actor is lost during the replay is left too)."""
        while not self.worker.alive:
            dead = self.worker
            self.worker, self.slot = self.pool.acquire()
            ep = self.episode
            if not replay or ep is None or ep.done:
                continue
            start = time.perf_counter()
            n = len(ep.turns)
            try:
                differ, record = self.pool.wait(self.worker.actor.restore.remote(self.slot, _env_record(ep), n),
                                                self.worker, self.pool.deadline_s(n + 1))
            except WorkerLost as lost:
                self.pool.lost(lost.worker, lost.cause)
                continue
            if record["prompt"] != ep.prompt:
                raise RayPoolError(f"episode {ep.id}: the fresh worker rendered another prompt; it cannot be restored")
            if dead.death is not None:
                dead.death.replayed += 1
            ray_meta = dict(ep.meta.get("ray") or {})
            ray_meta["replays"] = [*ray_meta.get("replays", []), {
                "lost": dead.name, "after_turns": n, "replay_differs": differ, "to": self.worker.name,
                "replay_ms": round((time.perf_counter() - start) * 1000.0, 1),
                "reason": dead.death.cause if dead.death is not None else "lost"}]
            ray_meta["worker"] = self.worker.name
            ep.add_run_record(meta={"ray": ray_meta})

    # ------------------------------------------------------------------ the env API

    def _submit(self, method: str, args: tuple[Any, ...]) -> None:
        if self._pending is not None and self._pending[1] is None:
            self.pool.unqueue(self)
        self._pending = None
        if not self.worker.alive:  # lost since its last call: the call goes out alone, from a live slot
            return
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
        if pending is not None and pending[0] == (method, args) and pending[1] is not None:
            try:
                out = pending[1].get(self.pool)[pending[2]]
            except WorkerLost as lost:
                self.pool.lost(lost.worker, lost.cause)
            else:
                if isinstance(out, CallError):
                    raise out.raised()
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
        obs, info, record, dropped = self._answer("reset", (seed, options or {}), replay=False)
        self.episode = Episode.from_dict(record)
        self.episode.add_run_record(meta={"ray": {"worker": self.worker.name}})
        self._note_dropped(dropped)
        return obs, info

    def submit_step(self, action: str) -> None:
        """Queue ``step(action)`` with the pool (sent with the tick's other calls, one message per actor, at the
        first call that waits); the next ``step(action)`` takes its answer."""
        self._submit("step", (action,))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.episode is None:
            raise RuntimeError("call reset() before step()")
        try:
            obs, reward, terminated, truncated, info, turn, record, dropped = self._answer("step", (action,), replay=True)
        except _Poison as poison:
            return self._poisoned(action, poison.cause)
        self.episode.turns.append(Turn.from_dict(turn))
        if record is not None:
            self._sync(record)
        self._note_dropped(dropped)
        return obs, reward, terminated, truncated, info

    def _note_dropped(self, keys: list[str]) -> None:
        """Info values that could not be pickled crossed as their type names: said on the episode's run record."""
        if not keys or self.episode is None:
            return
        ray_meta = dict(self.episode.meta.get("ray") or {})
        ray_meta["unpicklable_info"] = sorted({*ray_meta.get("unpicklable_info", []), *keys})
        self.episode.add_run_record(meta={"ray": ray_meta})

    def _poisoned(self, action: str, cause: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """This step killed every actor it was sent to: the episode's error record. The env (restored on a live
        actor) ends the episode as truncated (``meta["truncation"] = "env_process_died"``) and grades it; the
        step is recorded as a turn with an ``env_error`` (``end_with_env_error``, as for any env that raised)."""
        ep = self.episode
        assert ep is not None
        n = len(ep.turns)
        deaths = POISON_DEATHS + 1
        log.warning("%s: episode %s: its env's process died on turn %d on %d Ray actors (%s); that turn is recorded "
                    "as an env_error and the episode ends there; the run goes on", self.pool.name, ep.id, n, deaths,
                    cause)
        error = {"type": "WorkerDied", "message": f"the env's process died on this action ({cause})", "where": ""}
        end_with_env_error(self, action, error, n, "env_process_died")
        ray_meta = dict(ep.meta.get("ray") or {})
        ray_meta["error"] = {"episode": ep.id, "turn": n, "actors_lost": deaths, "cause": cause}
        ep.add_run_record(meta={"ray": ray_meta})
        return "", 0.0, False, True, {"episode_id": ep.id, "env_error": error}

    def end_episode(self, reason: str) -> None:
        if self.episode is None or self.episode.done:
            return
        self._sync(self._call("end_episode", reason, steps=len(self.episode.turns) + 1))

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
