"""turngym envs for TRL's ``GRPOTrainer(environment_factory=...)``.

TRL (1.16, ``trl/trainer/grpo_trainer.py``) makes one instance per rollout from a zero-argument
factory, calls ``reset(**row)`` before generation (a returned string is appended to the last user
message), exposes every public method except ``reset``/``get_reward`` as a tool (its JSON schema is
read from the method's type hints and Google-style docstring), calls those methods with the model's
native tool-call arguments, and calls ``get_reward()`` once per finished rollout.

:func:`environment_factory` returns such a factory for a registered turngym env that declares its tools
(``TextEnv.declared_tools``, :mod:`turngym.envs.tools`): one method per declared tool, typed and described
as declared, which writes the call in the env's own action protocol by the declaration and sends it to
``env.step``, so the rollout is an ordinary turngym :class:`~turngym.episode.Episode` (turns, per-turn
metrics and truth, outcome) kept on the instance as ``episode``; the declared answering tool ends it.
:func:`episode_reward_func` scores the rollouts' episodes with any turngym reward (per-turn rewards summed
per episode) as a TRL reward function. Nothing here imports TRL: the contract is duck-typed.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

from turngym.envs.base import outcome_reward
from turngym.envs.tools import EnvTool
from turngym.episode import Episode
from turngym.integrations.edges import (
    UntypedToolsError,  # noqa: F401 - re-exported: environment_factory raises it
    probe,
    score_groups,
    task_text,
    tool_step,
    tools_of,
)
from turngym.integrations.envs import full_env_id, make_turngym_env

# reset(**row) receives the dataset row; these columns choose the episode (the rest, e.g. "prompt", are TRL's)
RESET_COLUMNS = ("index", "task", "group", "seed", "episode_id")


class TurngymToolEnv:
    """One rollout's turngym env seen as a TRL environment (subclassed per env with a method per declared tool).

    ``reset`` starts an episode on the row's ``index`` (or ``task``; a random item when neither) and
    returns the task text; each tool call is one turn; ``get_reward`` ends an episode the model left
    unanswered (truncated, graded as given) and returns the env's outcome reward (Calculator: 1.0 when
    correct). ``episode`` is the turngym record of the current rollout; ``on_episode`` (if given) is
    called with each finished one.
    """

    env_id: str = ""
    env_kwargs: dict[str, Any] = {}
    on_episode: Callable[[Episode], None] | None = None

    def __init__(self) -> None:
        self.env = make_turngym_env(self.env_id, **self.env_kwargs)
        self.raw = self.env.unwrapped
        self.episode: Episode | None = None
        self._reported = False

    def reset(self, **row: Any) -> str:
        options = {k: row[k] for k in ("index", "task", "group", "episode_id") if row.get(k) is not None}
        if "group" not in options:  # TRL hands the K generations of a row the same row: they form one group
            options["group"] = f"{self.env_id}|" + json.dumps({k: options.get(k) for k in ("index", "task")},
                                                             sort_keys=True, default=str)
        self.env.reset(seed=row.get("seed"), options=options)
        self.episode, self._reported = self.raw.episode, False
        self.episode.meta["trl"] = {"tool_calls": []}
        return task_text(self.episode)

    def get_reward(self) -> float:
        ep = self._require_episode()
        if not ep.done:
            self.raw.end_episode("the model stopped without calling answer")
        if not self._reported and self.on_episode is not None:
            self.on_episode(ep)
        self._reported = True
        return outcome_reward(ep.outcome, self.raw.outcome_metric)

    def _require_episode(self) -> Episode:
        if self.episode is None:
            raise RuntimeError("call reset before a tool")
        return self.episode

    def _step(self, tool: EnvTool, arguments: dict[str, Any]) -> str:
        """Send one tool call, written as the env's action by its declaration, to ``env.step``; the observation
        is the tool's result (a refused call or one after the end raises: TRL makes it the {"error": ...} result)."""
        ep = self._require_episode()
        result = tool_step(self.env, tool, arguments)
        ep.meta["trl"]["tool_calls"].append({"name": tool.name, "arguments": arguments})
        return result


def tool_method(tool: EnvTool) -> Callable[..., str]:
    """The method TRL exposes for ``tool``: its name, typed keyword parameters and a Google-style docstring (what
    TRL reads to write the tool's JSON schema), sending the call as the env's action."""

    signature = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=p.type) for p in tool.params],
        return_annotation=str)

    def method(self: TurngymToolEnv, *args: Any, **kwargs: Any) -> str:
        arguments = signature.bind(self, *args, **kwargs).arguments
        return self._step(tool, {k: v for k, v in arguments.items() if k != "self"})

    method.__name__ = method.__qualname__ = tool.name
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__annotations__ = {**{p.name: p.type for p in tool.params}, "return": str}
    args = "".join(f"\n    {p.name}: {p.description}" for p in tool.params)
    method.__doc__ = f"{tool.description}\n\nArgs:{args}\n" if tool.params else tool.description
    return method


def environment_factory(env_id: str, on_episode: Callable[[Episode], None] | None = None,
                        **env_kwargs: Any) -> Callable[[], TurngymToolEnv]:
    """The zero-argument callable ``GRPOTrainer(environment_factory=...)`` expects, for ``env_id``
    made with ``env_kwargs``. The env is made once here, so an unknown id or bad argument fails now."""
    full = full_env_id(env_id)
    with probe(full, **env_kwargs) as raw:  # unknown ids and bad arguments: one line, now
        tools = tools_of(raw, full, "a TRL environment_factory env")
    name = full.split("/", 1)[-1].split("-v", 1)[0] + "ToolEnv"
    members: dict[str, Any] = {t.name: tool_method(t) for t in tools}
    cls = type(name, (TurngymToolEnv,), {**members, "env_id": full, "env_kwargs": dict(env_kwargs),
                                         "on_episode": staticmethod(on_episode) if on_episode else None,
                                         "__doc__": f"{full} with native tools: {', '.join(t.name for t in tools)}."})

    def factory() -> TurngymToolEnv:
        return cls()

    factory.env_class = cls  # type: ignore[attr-defined]
    return factory


def episode_reward_func(reward: str | Any, **reward_kwargs: Any) -> Callable[..., list[float]]:
    """A TRL reward function that scores the rollouts' turngym episodes with a turngym reward
    (:func:`turngym.rewards.get_reward`): episodes of one group (``Episode.group_key``: the K rollouts of one
    dataset row) are scored together, and each rollout's reward is its per-turn rewards summed. TRL passes the
    rollouts' env instances as ``environments``."""
    from turngym.rewards import get_reward

    scorer = get_reward(reward, **reward_kwargs) if isinstance(reward, str) else reward

    def turngym_reward(environments: Sequence[TurngymToolEnv] | None = None, **_: Any) -> list[float]:
        if environments is None:
            raise ValueError("episode_reward_func needs TRL's environment_factory (it reads each rollout's episode)")
        for env in environments:
            env.get_reward()  # ends an unanswered episode, so it can be graded
        return score_groups(scorer, [env.episode for env in environments]).totals

    turngym_reward.__name__ = f"turngym_{getattr(scorer, 'name', 'reward')}"
    return turngym_reward
