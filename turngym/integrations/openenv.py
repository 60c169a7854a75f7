"""turngym envs as OpenEnv environments (the outward adapter; the client the runner plays is in ``turngym.run.backends``).

Serving: :class:`TurngymEnvironment` is an OpenEnv ``Environment`` around one Gymnasium
``turngym/...`` env; :func:`make_app` builds OpenEnv's own FastAPI app for it (reset/step/state
over its WebSocket session protocol, one env per session) and :func:`serve_env` runs it on
uvicorn. The protocol is typed: :class:`TurnAction` (the agent's reply text),
:class:`TurnObservation` (the text ``env.step`` returns, the prompt's messages and tool schemas
at reset, the Gymnasium ``info`` with each turn's metrics, and the env's stop strings and
observation role, which a runner needs to generate), :class:`TurnState` (the episode record;
its labels are withheld until the episode has ended, as ``info`` withholds them).

Playing an OpenEnv server's episodes with turngym's runner is a backend of the runner's, not an
adapter: :class:`turngym.run.backends.openenv.OpenEnvTextEnv`.
"""

from __future__ import annotations

import copy
from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

from turngym.envs.base import outcome_reward, public_task
from turngym.envs.tools import find_tool
from turngym.episode import Episode
from turngym.integrations.envs import full_env_id, make_turngym_env  # noqa: F401 - re-exported


class TurnAction(Action):
    """One agent turn: the reply text, as it would be passed to ``env.step``."""

    text: str = Field(..., description="the agent's reply (e.g. '<calc>6*7</calc>'); '' with a tool call")
    tool: str | None = Field(None, description="a call of one of the env's declared tools (env_tools at reset), in "
                                               "place of text: the server writes it as the env's action")
    arguments: dict[str, Any] = Field(default_factory=dict, description="the tool call's arguments")
    end: str | None = Field(None, description="end the episode from outside for this reason (e.g. the client's token "
                                              "budget ran out) and grade it as it stands; text is then not played")


class TurnObservation(Observation):
    """What the env answered; ``reward``/``done`` are OpenEnv's (done = terminated or truncated)."""

    text: str = Field(default="", description="the observation env.reset/env.step returned")
    messages: list[dict[str, Any]] = Field(default_factory=list, description="the prompt's chat messages (reset only)")
    tools: list[dict[str, Any]] | None = Field(default=None, description="tool schemas for native tool calling (reset only)")
    env_tools: list[dict[str, Any]] = Field(default_factory=list, description="the env's declared tools as function "
                                            "schemas, callable by name with TurnAction.tool (reset only)")
    stop: list[str] = Field(default_factory=list, description="stop strings that end the agent's turn")
    observation_role: str | None = Field(default=None, description="None: appended to the reply; else a chat role")
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict, description="Gymnasium info: episode_id, task, turn, outcome")


class TurnState(State):
    """The env id, its dataset's name and the episode record (``Episode.to_dict``; labels only once
    the episode has ended)."""

    env_id: str = ""
    dataset_name: str = ""
    episode: dict[str, Any] | None = None


class TurngymEnvironment(Environment[TurnAction, TurnObservation, TurnState]):
    """One session's env. ``reset`` takes turngym's options as keyword arguments: ``index`` (a
    dataset item) or ``task`` (an ad-hoc task dict), ``group``, plus OpenEnv's ``seed`` and
    ``episode_id``; anything else is refused with the list of what is taken."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session gets its own Gymnasium env from the factory
    RESET_OPTIONS = ("index", "task", "group")

    def __init__(self, env_id: str, **env_kwargs: Any):
        super().__init__()
        self.env_id = full_env_id(env_id)
        self.env = make_turngym_env(self.env_id, **env_kwargs)
        self._steps = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TurnObservation:
        unknown = sorted(set(kwargs) - set(self.RESET_OPTIONS))
        if unknown:
            raise ValueError(f"reset takes seed, episode_id, {', '.join(self.RESET_OPTIONS)}; got {unknown}")
        options = {k: v for k, v in kwargs.items() if v is not None}
        if episode_id is not None:
            options["episode_id"] = episode_id
        text, info = self.env.reset(seed=seed, options=options)
        self._steps = 0
        ep = self.env.unwrapped.episode
        raw = self.env.unwrapped
        return TurnObservation(text=text, messages=copy.deepcopy(ep.prompt), tools=copy.deepcopy(ep.tools),
                               env_tools=[t.schema() for t in raw.declared_tools()], stop=list(raw.stop),
                               observation_role=raw.observation_role, info=info, done=False, reward=0.0)

    def step(self, action: TurnAction, timeout_s: float | None = None, **kwargs: Any) -> TurnObservation:
        if self.env.unwrapped.episode is None:
            raise RuntimeError("call reset before step")
        if action.end is not None:  # graded by the env as it stands, as in-process (TextEnv.end_episode)
            raw = self.env.unwrapped
            raw.end_episode(action.end)
            return TurnObservation(text="", stop=list(raw.stop), observation_role=raw.observation_role, terminated=False,
                                   truncated=True, info={"outcome": raw.episode.outcome}, done=True,
                                   reward=outcome_reward(raw.episode.outcome, raw.outcome_metric))
        played = action.text
        if action.tool is not None:  # a tool call, written as the env's action by the env's declaration
            played = find_tool(self.env.unwrapped.declared_tools(), action.tool).to_action(action.arguments)
        text, reward, terminated, truncated, info = self.env.step(played)
        self._steps += 1
        raw = self.env.unwrapped
        return TurnObservation(text=text, stop=list(raw.stop), observation_role=raw.observation_role,
                               terminated=terminated, truncated=truncated, info=info, done=terminated or truncated,
                               reward=float(reward))

    @property
    def state(self) -> TurnState:
        ep: Episode | None = self.env.unwrapped.episode
        record = None
        if ep is not None:
            record = ep.to_dict()
            if not ep.done:  # the labels stay on the server until the episode is graded
                record["task"] = public_task(ep.task, self.env.unwrapped.gold_keys)
        return TurnState(episode_id=None if ep is None else ep.id, step_count=self._steps, env_id=self.env_id,
                         dataset_name=str(getattr(self.env.unwrapped, "dataset_name", "") or ""), episode=record)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=self.env_id, description=(type(self.env.unwrapped).__doc__ or "").strip()[:500],
                                   version="turngym")

    def close(self) -> None:
        self.env.close()


def make_app(env_id: str, max_concurrent_envs: int = 64, **env_kwargs: Any) -> Any:
    """OpenEnv's FastAPI app serving ``env_id``: one Gymnasium env per WebSocket session, at most
    ``max_concurrent_envs`` sessions. The env is made once here, so bad arguments fail now."""
    TurngymEnvironment(env_id, **env_kwargs).close()
    return create_app(lambda: TurngymEnvironment(env_id, **env_kwargs), TurnAction, TurnObservation,
                      env_name=full_env_id(env_id).split("/", 1)[1], max_concurrent_envs=max_concurrent_envs,
                      state_cls=TurnState)


def serve_env(env_id: str, host: str = "127.0.0.1", port: int = 8000, max_concurrent_envs: int = 64,
              **env_kwargs: Any) -> None:
    """Serve ``env_id`` as an OpenEnv environment until interrupted."""
    import uvicorn

    uvicorn.run(make_app(env_id, max_concurrent_envs=max_concurrent_envs, **env_kwargs), host=host, port=port,
                log_level="warning")




class TurngymEnvClient(EnvClient[TurnAction, TurnObservation, TurnState]):
    """OpenEnv's client typed for a turngym server: ``reset(index=3)``, ``step(TurnAction(text=...))``,
    ``state()`` → :class:`TurnState` (async by default; ``.sync()`` for plain calls)."""

    def _step_payload(self, action: TurnAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TurnObservation]:
        obs = TurnObservation(**payload.get("observation", {}), done=payload.get("done", False), reward=payload.get("reward"))
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> TurnState:
        return TurnState(**payload)
