"""The env handle contract: what the rollout runner steps, declared beside :class:`~turngym.agents.policy.Policy`.

The runner plays an env through two faces. The handle (:class:`EnvHandle`) is the Gymnasium face it resets
and steps, wrappers included (``gymnasium.make``'s turn limit and order checks). Its ``unwrapped``
(:class:`EnvFace`) is the env itself: the declared attributes a generation needs (stop strings, the
observation role, whether replies start with a forced prefix), the episode it is recording, ending an
episode from outside, and the batched forms ``submit_reset`` / ``submit_step``, which announce the next
``reset`` / ``step`` so that envs living elsewhere (a Ray actor pool) get every call of a tick in one round of
messages; an in-process env answers at once, so for it they do nothing (``TextEnv``'s defaults).

Where handles come from is an :class:`EnvFactory`: ``factory()`` is a fresh handle, ``slots`` the most that
can be live at once (None: no bound), ``shutdown()`` releases what the factory holds. A plain callable making
in-process envs is one through :func:`env_factory`. Implemented by every ``TextEnv`` (in process, and the
OpenEnv client, whose episodes run on a server), and by the Ray pool's ``RemoteEnv`` / ``RayEnvPool``;
``turngym.agents.checker.check_env_handle`` / ``check_env_factory`` refuse one whose members disagree.
Nothing probes an env or a factory with ``getattr`` (``tests/test_env_handle.py``).

Failures have two kinds. An env's own ``step`` that raises (in process, or :class:`EnvRaised` from a process
elsewhere) is that episode's error record (:func:`end_with_env_error`) and the run goes on, the same episodes
ending the same way wherever the env lives. :class:`EnvBackendError` (a lost cluster, a spent restart budget)
is where the envs live failing, not an env: it ends the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from turngym.episode import Episode, Turn


class EnvBackendError(RuntimeError):
    """Where the envs live cannot go on (a cluster lost, a crash loop): not one env's fault, so the run ends."""


class EnvRaised(Exception):  # noqa: N818 - what happened, carried across a process boundary
    """An env's own call raised in another process. ``error`` is what the turn record says of it (type, message,
    where: taken where it raised, as ``turngym.envs.base.describe_error`` does in process)."""

    def __init__(self, error: dict[str, str], message: str | None = None):
        super().__init__(message or f"{error['type']}: {error['message']}")
        self.error = dict(error)


def end_with_env_error(env: EnvFace, action: str, error: dict[str, str], turns_before: int, reason: str) -> None:
    """End ``env``'s live episode at ``action`` with its error record: turns the failed call left are dropped,
    the env grades the episode as it stands (``end_episode(reason)``: truncated), and the action is recorded as
    a turn holding ``metrics["env_error"]``, so a runner's token ids stay aligned with the turns."""
    ep = env.episode
    assert ep is not None
    del ep.turns[turns_before:]
    try:
        env.end_episode(reason)
    except Exception as exc:  # noqa: BLE001 - an env that cannot even end: the record says so, the run goes on
        ep.truncated, ep.meta["truncation"] = True, reason
        ep.meta["end_error"] = f"{type(exc).__name__}: {exc}"[:2000]
    ep.turns.append(Turn(index=turns_before, action=action, parse_error=f"{error['type']}: {error['message']}",
                         metrics={"env_error": dict(error)}))


@runtime_checkable
class EnvFace(Protocol):
    """The env behind a handle (``handle.unwrapped``): every member the runner reads or calls on it."""

    env_name: str
    dataset_name: str
    stop: tuple[str, ...]
    prefills: bool
    observation_role: str | None
    max_turns: int
    episode: Episode | None

    def reply_prefill(self) -> str:
        """The forced start of the next reply ('' for none)."""
        ...

    def end_episode(self, reason: str) -> None:
        """End the live episode from outside (a full context) and grade it as it stands."""
        ...

    def submit_reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Announce the next ``reset`` with these arguments (sent with the tick's other calls)."""
        ...

    def submit_step(self, action: str) -> None:
        """Announce the next ``step(action)`` (sent with the tick's other calls)."""
        ...


@runtime_checkable
class EnvHandle(Protocol):
    """The Gymnasium face the runner resets and steps; ``unwrapped`` is the :class:`EnvFace`."""

    @property
    def unwrapped(self) -> Any: ...

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        ...

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        ...

    def close(self) -> None:
        ...


class EnvFactory:
    """A source of :class:`EnvHandle` s for the runner: subclass it, or wrap a callable with :func:`env_factory`.

    ``slots``: the most handles that can be live at once (the runner keeps no more episodes live: back-pressure);
    None, no bound. ``shutdown``: release what the factory holds (a pool's actors); a no-op by default.
    """

    slots: int | None = None

    def __call__(self) -> EnvHandle:
        raise NotImplementedError(f"{type(self).__name__} makes no env")

    def shutdown(self) -> None:
        return None


@dataclass
class LocalEnvs(EnvFactory):
    """In-process envs from ``make`` (e.g. ``lambda: gymnasium.make(...)``): no bound, nothing to release."""

    make: Callable[[], Any]

    def __call__(self) -> EnvHandle:
        return self.make()


def env_factory(source: EnvFactory | Callable[[], Any]) -> EnvFactory:
    """``source`` as an :class:`EnvFactory`: a declared factory as it is, a plain callable as :class:`LocalEnvs`."""
    return source if isinstance(source, EnvFactory) else LocalEnvs(source)
