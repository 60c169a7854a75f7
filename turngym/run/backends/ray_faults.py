"""What the Ray env pool does when an actor dies, freezes or sends back what cannot cross (``ray_pool.py``).

Every loss is one event, whatever the moment (starting, before ready, mid-episode, during a replay, several
actors at once): the actor is killed if it still runs, a fresh one takes its place, and its live episodes are
replayed there. Losses are paid from one budget per run (:class:`Deaths`), with a growing pause between
starts that fail in a row, so an env that cannot live (a crash loop) ends the run in bounded time with one
line naming the last cause, instead of retrying forever.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from turngym.agents.env_handle import EnvBackendError, EnvRaised

log = logging.getLogger("turngym.ray")

BACKOFF_S = 0.5  # the pause before the 2nd start in a row of one place; doubled per failed start
BACKOFF_MAX_S = 8.0
DEADLINE_SLACK_S = 10.0  # added to every call's step budget: Ray's own message and scheduling time
DEFAULT_STEP_BUDGET_S = 10.0  # one step of an env that declares nothing longer (parsing, a cheap tool, grading)
POISON_DEATHS = 2  # an episode whose call, sent alone, killed this many actors is poison, not a victim


class RayPoolError(EnvBackendError):
    """The pool cannot run as asked (Ray missing, cluster unreachable or gone, env not buildable, a crash loop)."""


class WorkerLost(Exception):  # noqa: N818 - an event, not an error of the caller's
    """An actor was lost (died, froze past its deadline, its node went away): the caller replays elsewhere."""

    def __init__(self, worker: Any, cause: str):
        super().__init__(cause)
        self.worker, self.cause = worker, cause


class EnvCallError(EnvRaised):
    """An env's reset or step raised on its Ray worker: ``error`` as the turn record says it (taken on the worker,
    where the traceback is); ``__cause__`` is the exception itself when it could be pickled back."""


@dataclass
class CallError:
    """Sent back in place of an env call's answer when the env raised, for that env only."""

    error: dict[str, str]
    exc: Exception | None  # None: it cannot be pickled (a lock inside, a required argument)

    @classmethod
    def of(cls, exc: Exception) -> CallError:
        from ray import cloudpickle

        from turngym.envs.base import describe_error

        try:
            cloudpickle.loads(cloudpickle.dumps(exc))
            kept: Exception | None = exc
        except Exception:  # noqa: BLE001 - an exception that cannot cross
            kept = None
        return cls(describe_error(exc), kept)

    def raised(self) -> EnvCallError:
        e = self.error
        said = "" if self.exc is not None else "; it cannot be pickled, so its type and message are sent"
        out = EnvCallError(e, f"{e['type']}: {e['message']} (raised by the env on its Ray worker{said})")
        out.__cause__ = self.exc
        return out


def lost_errors() -> tuple[type[BaseException], ...]:
    """Ray's exceptions that mean the actor (or the node under it) is gone, not that the env raised."""
    import ray.exceptions as rex

    names = ("RayActorError", "ActorUnavailableError", "ObjectLostError", "OwnerDiedError", "WorkerCrashedError",
             "NodeDiedError", "LocalRayletDiedError", "RaySystemError")
    return tuple(getattr(rex, n) for n in names if hasattr(rex, n))


def last_line(exc: BaseException) -> str:
    """The line of a Ray error that says what went wrong (the cause's ``Type: message``, after Ray's traceback)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


@dataclass
class Death:
    """One lost actor, for the run's record and the chaos benchmark."""

    worker: str  # "worker 1 (restart 2)"
    cause: str
    at: float  # time.monotonic() when it was found
    replaced_s: float | None = None  # until a fresh actor in its place was ready
    replayed: int = 0  # live episodes moved off it and replayed


@dataclass
class Deaths:
    """The run's budget of lost actors; spending past it ends the run (:class:`RayPoolError`, one line)."""

    budget: int
    what: str = "the Ray env pool"
    backoff_s: float = BACKOFF_S
    backoff_max_s: float = BACKOFF_MAX_S
    record: list[Death] = field(default_factory=list)

    def spend(self, worker: str, cause: str) -> Death:
        death = Death(worker, cause, time.monotonic())
        self.record.append(death)
        if len(self.record) > self.budget:
            raise RayPoolError(f"{self.what}: {len(self.record)} Ray env actors lost in this run, more than its "
                               f"budget of {self.budget} (a crash loop?); the last, {worker}: {cause}")
        return death

    def pause(self, failed_in_a_row: int) -> float:
        """Seconds to wait before the next start of a place whose last ``failed_in_a_row`` starts failed."""
        if failed_in_a_row <= 0:
            return 0.0
        return min(self.backoff_max_s, self.backoff_s * 2 ** (failed_in_a_row - 1))


def crossable_info(info: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``info`` as it can be sent back from a worker: a value that cannot be pickled becomes its type name (the
    runner never reads ``info``; the episode record crosses whole). Also the keys so replaced."""
    from ray import cloudpickle

    try:
        cloudpickle.dumps(info)
        return info, []
    except Exception:  # noqa: BLE001 - any pickling failure: the values are checked one by one below
        pass
    out, dropped = {}, []
    for key, value in info.items():
        try:
            cloudpickle.dumps(value)
            out[key] = value
        except Exception:  # noqa: BLE001 - the value stays here; its type name crosses
            out[key] = f"<not picklable: {type(value).__name__}>"
            dropped.append(str(key))
    return out, dropped
