"""turngym envs as OpenEnv environments, and OpenEnv environments played by turngym's runner.

Serving: :class:`TurngymEnvironment` is an OpenEnv ``Environment`` around one Gymnasium
``turngym/...`` env; :func:`make_app` builds OpenEnv's own FastAPI app for it (reset/step/state
over its WebSocket session protocol, one env per session) and :func:`serve_env` runs it on
uvicorn. The protocol is typed: :class:`TurnAction` (the agent's reply text),
:class:`TurnObservation` (the text ``env.step`` returns, the prompt's messages and tool schemas
at reset, the Gymnasium ``info`` with each turn's metrics, and the env's stop strings and
observation role, which a runner needs to generate), :class:`TurnState` (the episode record;
its labels are withheld until the episode has ended, as ``info`` withholds them).

Playing: :class:`OpenEnvTextEnv` is a Gymnasium env whose episodes happen on an OpenEnv server
(through the package's own ``GenericEnvClient``), so the rollout runner, ``ablate`` and the
viewer get ordinary turngym episodes from an outside env. On a turngym server it keeps the
server's own record (prompt, turns, outcome, reward needs); on any other OpenEnv server it
records the text fields it is told to read (``action_field``, ``observation_field``).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import gymnasium
from openenv.core import EnvClient, GenericEnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

from turngym.envs.base import ActionResult, TextEnv, outcome_reward, public_task
from turngym.episode import Episode, RewardNeeds, Turn
from turngym.integrations.envs import full_env_id, make_turngym_env  # noqa: F401 - re-exported


class TurnAction(Action):
    """One agent turn: the reply text, as it would be passed to ``env.step``."""

    text: str = Field(..., description="the agent's reply (e.g. '<calc>6*7</calc>')")
    end: str | None = Field(None, description="end the episode from outside for this reason (e.g. the client's token "
                                              "budget ran out) and grade it as it stands; text is then not played")


class TurnObservation(Observation):
    """What the env answered; ``reward``/``done`` are OpenEnv's (done = terminated or truncated)."""

    text: str = Field(default="", description="the observation env.reset/env.step returned")
    messages: list[dict[str, Any]] = Field(default_factory=list, description="the prompt's chat messages (reset only)")
    tools: list[dict[str, Any]] | None = Field(default=None, description="tool schemas for native tool calling (reset only)")
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
                               stop=list(raw.stop), observation_role=raw.observation_role, info=info,
                               done=False, reward=0.0)

    def step(self, action: TurnAction, timeout_s: float | None = None, **kwargs: Any) -> TurnObservation:
        if self.env.unwrapped.episode is None:
            raise RuntimeError("call reset before step")
        if action.end is not None:  # graded by the env as it stands, as in-process (TextEnv.end_episode)
            raw = self.env.unwrapped
            raw.end_episode(action.end)
            return TurnObservation(text="", stop=list(raw.stop), observation_role=raw.observation_role, terminated=False,
                                   truncated=True, info={"outcome": raw.episode.outcome}, done=True,
                                   reward=outcome_reward(raw.episode.outcome, raw.outcome_metric))
        text, reward, terminated, truncated, info = self.env.step(action.text)
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


# what an outside env's episodes declare unless told otherwise: no final answer to compare, no tool evidence
OUTSIDE_REWARD_NEEDS = RewardNeeds(answer_kind="none", answer_cue="answer_tag")


class OpenEnvTextEnv(TextEnv):
    """A Gymnasium env played on an OpenEnv server at ``base_url`` (one session per instance).

    ``served_by_turngym``: the server is :func:`serve_env`'s, so the record, stop strings and
    observation role come from it. Otherwise the reply goes out as ``{action_field: text}``,
    ``observation[observation_field]`` is what the agent sees, the reset observation becomes a
    one-message user prompt, and ``stop``/``observation_role``/``reward_needs`` are as given.
    """

    env_name = "turngym/OpenEnv-v0"
    dataset_name = "openenv"
    outcome_metric = None  # the server's rewards are the task's

    def __init__(self, base_url: str, served_by_turngym: bool = True, action_field: str = "text",
                 observation_field: str = "text", stop: tuple[str, ...] = (), observation_role: str | None = None,
                 reward_needs: RewardNeeds = OUTSIDE_REWARD_NEEDS, max_turns: int = 64, message_timeout_s: float = 600.0,
                 render_mode: str | None = None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.base_url, self.served_by_turngym = base_url, served_by_turngym
        self.action_field, self.observation_field = action_field, observation_field
        self.stop, self.observation_role, self.reward_needs = tuple(stop), observation_role, reward_needs
        self.client = GenericEnvClient(base_url=base_url, message_timeout_s=message_timeout_s).sync()
        self.client.connect()
        if served_by_turngym:  # ids of groups and episodes name the served env, as in-process
            state = self.client.state()
            self.env_name, self.dataset_name = state["env_id"], state["dataset_name"]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        gymnasium.Env.reset(self, seed=seed)
        options = dict(options or {})
        ep_id, group = options.pop("episode_id", None), options.pop("group", None)
        data: dict[str, Any] = {"seed": seed, **options}
        if self.served_by_turngym:
            data.update(episode_id=ep_id, group=group)
        result = self.client.reset(**{k: v for k, v in data.items() if v is not None})
        obs = result.observation
        if self.served_by_turngym:
            record = Episode.from_dict(self.client.state()["episode"])
            self.env_name, self.stop, self.observation_role = record.env_id, tuple(obs["stop"]), obs["observation_role"]
            self.reward_needs = record.reward_needs
            self.episode = record
            info = obs["info"]
        else:
            text = self._text(obs)
            task = options.get("task") or {"index": options.get("index")}
            self.episode = Episode(id=str(ep_id or f"{self.env_name}:{self.base_url}"), env_id=self.env_name,
                                   task={"dataset": "openenv", **task}, prompt=[{"role": "user", "content": text}],
                                   seed=seed, group=group, reward_needs=self.reward_needs)
            info = {"episode_id": self.episode.id, "turn_count": 0}
        self.episode.meta["openenv"] = {"base_url": self.base_url}
        text = obs["text"] if self.served_by_turngym else self._text(obs)
        return text, info

    def step(self, action: str):
        if self.episode is None or self.episode.done:
            raise RuntimeError("call reset() before step()" if self.episode is None else
                               "episode has ended; call reset() to start a new one")
        start = time.perf_counter()
        payload = {"text": action} if self.served_by_turngym else {self.action_field: action}
        result = self.client.step(payload)
        ms = round((time.perf_counter() - start) * 1000.0, 3)
        obs, ep = result.observation, self.episode
        if self.served_by_turngym:
            turn = Turn.from_dict(obs["info"]["turn"])
            turn.latency_ms = {"tool": ms}
            ep.turns.append(turn)
            terminated, truncated, info = obs["terminated"], obs["truncated"], obs["info"]
            if terminated or truncated:  # the server's graded record: outcome, final answer, labels, truth
                record = Episode.from_dict(self.client.state()["episode"])
                ep.task, ep.outcome, ep.final_answer = record.task, record.outcome, record.final_answer
                ep.terminated, ep.truncated = record.terminated, record.truncated
                for mine, theirs in zip(ep.turns, record.turns, strict=True):
                    mine.truth = theirs.truth
            return obs["text"], float(result.reward or 0.0), terminated, truncated, info
        text = self._text(obs)
        terminated = bool(result.done)
        truncated = not terminated and len(ep.turns) + 1 >= self.max_turns
        ep.turns.append(Turn(index=len(ep.turns), action=action, observation=None if terminated or truncated else text,
                             reward=float(result.reward or 0.0), latency_ms={"tool": ms},
                             metrics={k: v for k, v in obs.items() if k != self.observation_field and _scalar(v)}))
        ep.terminated, ep.truncated = terminated, truncated
        if terminated or truncated:
            ep.outcome = {"return": sum(t.reward for t in ep.turns)}
        return text, float(result.reward or 0.0), terminated, truncated, self._info()

    def _text(self, obs: dict[str, Any]) -> str:
        if self.observation_field not in obs:
            raise ValueError(f"the OpenEnv server at {self.base_url} sent an observation without "
                             f"{self.observation_field!r} (fields: {sorted(obs)}); set observation_field")
        value = obs[self.observation_field]
        return value if isinstance(value, str) else str(value)

    def act(self, action: str) -> ActionResult:  # step is the server's; never called
        raise NotImplementedError

    def grade(self, episode: Episode) -> dict[str, Any]:
        """Ended from outside (the token budget ran out): a turngym server grades the episode as it stands (an
        unanswered episode is wrong, never ungraded: running out of budget is the policy's doing); another server's
        episode scores the rewards it gave."""
        if not self.served_by_turngym:
            return {"return": sum(t.reward for t in episode.turns)}
        self.client.step({"text": "", "end": str(episode.meta.get("truncation") or "ended from outside")})
        record = Episode.from_dict(self.client.state()["episode"])
        episode.task, episode.final_answer = record.task, record.final_answer
        for mine, theirs in zip(episode.turns, record.turns, strict=True):
            mine.truth = theirs.truth
        return record.outcome

    def close(self) -> None:
        self.client.close()
        gymnasium.Env.close(self)


def _scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str)) or value is None
