"""OpenEnv environments played by turngym's rollout runner: a backend of the runner's env seam.

:class:`OpenEnvTextEnv` is a Gymnasium env implementing the runner's env handle and face
(``turngym.agents.env_handle``) directly, not a ``TextEnv``: its episodes happen on an OpenEnv server, through
the package's own ``GenericEnvClient``, so the rollout runner,
``ablate`` and the viewer get ordinary turngym episodes from an outside env. On a turngym server
(``turngym serve-env``, :mod:`turngym.integrations.openenv`) it keeps the server's own record (prompt, turns,
outcome, reward needs); on any other OpenEnv server it records the text fields it is told to read
(``action_field``, ``observation_field``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import gymnasium
from openenv.core import GenericEnvClient

from turngym.envs.base import UnicodeText, describe_error, render_episode
from turngym.episode import Episode, RewardNeeds, Turn

log = logging.getLogger(__name__)

# what an outside env's episodes declare unless told otherwise: no final answer to compare, no tool evidence
OUTSIDE_REWARD_NEEDS = RewardNeeds(answer_kind="none", answer_cue="answer_tag")


class OpenEnvTextEnv(gymnasium.Env):
    """A Gymnasium env played on an OpenEnv server at ``base_url`` (one session per instance).

    ``served_by_turngym``: the server is :func:`serve_env`'s, so the record, stop strings and
    observation role come from it. Otherwise the reply goes out as ``{action_field: text}``,
    ``observation[observation_field]`` is what the agent sees, the reset observation becomes a
    one-message user prompt, and ``stop``/``observation_role``/``reward_needs`` are as given.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    env_name = "turngym/OpenEnv-v0"
    dataset_name = "openenv"
    prefills = False  # a reply never starts with forced text

    def __init__(self, base_url: str, served_by_turngym: bool = True, action_field: str = "text",
                 observation_field: str = "text", stop: tuple[str, ...] = (), observation_role: str | None = None,
                 reward_needs: RewardNeeds = OUTSIDE_REWARD_NEEDS, max_turns: int = 64, message_timeout_s: float = 600.0,
                 render_mode: str | None = None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.max_turns, self.render_mode = int(max_turns), render_mode
        self.observation_space, self.action_space = UnicodeText(), UnicodeText()
        self.episode: Episode | None = None
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
            info = self._info()
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

    def _info(self) -> dict[str, Any]:
        ep = self.episode
        assert ep is not None
        return {"episode_id": ep.id, "turn_count": len(ep.turns)}

    def reply_prefill(self) -> str:
        return ""

    def submit_reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Nothing to send ahead: each session answers its own ``reset`` (the env face's batched form)."""
        return None

    def submit_step(self, action: str) -> None:
        return None

    def end_episode(self, reason: str) -> None:
        """Ended from outside (the token budget ran out): truncated and graded as it stands. A turngym server grades
        it (an unanswered episode is wrong, never ungraded: running out of budget is the policy's doing); another
        server's episode scores the rewards it gave. A server that cannot grade leaves ``graded: False`` and the
        error on the outcome."""
        ep = self.episode
        if ep is None or ep.done:
            return
        ep.truncated, ep.meta["truncation"] = True, reason
        if not self.served_by_turngym:
            ep.outcome = {"return": sum(t.reward for t in ep.turns)}
            return
        try:
            self.client.step({"text": "", "end": reason})
            record = Episode.from_dict(self.client.state()["episode"])
        except Exception as exc:  # noqa: BLE001 - recorded on the outcome; the episode is kept
            log.warning("%s: the server could not grade episode %s: %s", self.base_url, ep.id, exc)
            ep.outcome = {"graded": False, "grading_error": describe_error(exc)}
            return
        ep.task, ep.final_answer, ep.outcome = record.task, record.final_answer, record.outcome
        for mine, theirs in zip(ep.turns, record.turns, strict=True):
            mine.truth = theirs.truth

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.episode is None:
            return None
        return render_episode(self.episode)

    def close(self) -> None:
        self.client.close()
        super().close()


def _scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str)) or value is None
