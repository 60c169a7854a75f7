"""turngym envs as verifiers v1 tasksets: the API of verifiers 0.4 (``import verifiers.v1 as vf``;
0.3.1 ships it too, beside the classic API that :mod:`.verifiers_env` uses).

A v1 run is a taskset (one task per item) and an env whose ``run(task, agents)`` is the rollout.
Here the env plays the user side of the chat as verifiers' own OpenEnv taskset does: it resets a
Gymnasium ``turngym/...`` env on the task's item, opens the model's interaction with the env's
system prompt, sends the item's user message, and turns every model reply into one ``env.step``
(the reply cut after the first stop string, the stop string a spec-following server dropped put
back when the call's finish reason is ``stop``, as in :mod:`.verifiers_env`); the observation is the
next user message, and the exchange ends when the turngym env terminates or truncates. The finished
episode (``Episode.to_dict``) is in the trace's ``info["turngym_record"]``; the trace's reward is
the turngym reward's total for the episode (v1 scores each trace on its own, so a group reward sees
a group of one) and each turn's reward is a metric ``turngym_turn_<t>``.

Run it with verifiers' ``vf-eval``, naming this module as the taskset::

    vf-eval turngym.integrations.verifiers_v1 --env.taskset.env Calculator-v0 ...
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from pydantic import Field

from turngym.episode import Episode
from turngym.integrations.edges import check_indices, probe, reply_action, score_groups
from turngym.integrations.envs import full_env_id, make_turngym_env
from turngym.rewards.base import reward_class

RECORD_KEY = "turngym_record"


class TurngymTaskData(vf.TaskData):
    env_id: str
    index: int
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    reward: str = "outcome"
    reward_config: dict[str, Any] = Field(default_factory=dict)


class TurngymTasksetConfig(vf.TasksetConfig):
    env: str = "Calculator-v0"
    """The turngym env (a registered id, e.g. Calculator-v0)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Arguments for ``gymnasium.make`` (e.g. ``{"dataset": "nq"}``)."""
    indices: list[int] | None = None
    """The items to play (default: the first ``num_examples``, or all)."""
    num_examples: int | None = None
    reward: str = "outcome"
    """A turngym reward (``turngym.rewards.get_reward``) scoring each episode."""
    reward_config: dict[str, Any] = Field(default_factory=dict)


class TurngymTask(vf.Task[TurngymTaskData]):
    pass


class TurngymTaskset(vf.Taskset[TurngymTask, TurngymTasksetConfig]):
    def load(self) -> Iterator[TurngymTask]:
        config = self.config
        env_id = full_env_id(config.env)
        if not reward_class(config.reward).scores_single_episodes:  # each trace is scored alone: a group of one
            raise ValueError(f"reward {config.reward!r} scores groups only (its baseline is the group's); a verifiers "
                             "trace is scored alone, so name a reward that scores single episodes (e.g. outcome, funrl)")
        with probe(env_id, **config.env_kwargs) as raw:  # unknown ids and bad arguments fail here
            if raw.observation_role not in (None, "user"):
                raise ValueError(f"{env_id} answers as {raw.observation_role!r} messages; this integration sends "
                                 "observations as user messages")
            n = raw.num_items()
            if config.indices is not None:
                indices = check_indices(config.indices, n, env_id)
            else:
                indices = list(range(n if config.num_examples is None else min(config.num_examples, n)))
        for index in indices:
            yield TurngymTask(TurngymTaskData(name=f"{env_id}#{index}", prompt=None, env_id=env_id, index=index,
                                              env_kwargs=dict(config.env_kwargs), reward=config.reward,
                                              reward_config=dict(config.reward_config)),
                              config.task)


class TurngymEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, runtime=vf.SubprocessConfig())
    """The model's seat: verifiers' tool-less chat program (the ``null`` harness), run as a local
    subprocess (``--env.player.runtime.type`` picks another runtime)."""


class TurngymEnv(vf.Env[TurngymEnvConfig]):
    async def run(self, task, agents):
        data: TurngymTaskData = task.data
        env = make_turngym_env(data.env_id, **data.env_kwargs)
        raw = env.unwrapped
        stop = tuple(raw.stop)
        try:
            env.reset(options={"index": data.index})
            prompt = raw.episode.prompt
            system = "\n\n".join(m["content"] for m in prompt if m["role"] == "system")
            opening = "\n\n".join(m["content"] for m in prompt if m["role"] != "system")
            opened = type(task)(task.data.model_copy(update={"system_prompt": system or None}), task.config)
            async with agents.player.interaction(opened) as interaction:
                segment = await interaction.turn(opening)
                while not segment.terminated:
                    calls = interaction.trace.calls
                    finish = calls[-1].finish_reason if calls else None
                    text, _, terminated, truncated, _ = env.step(reply_action(segment.last_reply, finish, stop))
                    if terminated or truncated:
                        break
                    segment = await interaction.turn(text)
            if not raw.episode.done:  # the agent's own limits ended the exchange first
                raw.end_episode("the verifiers run ended the exchange")
            episode: Episode = raw.episode
        finally:
            env.close()
        trace = interaction.trace
        from turngym.rewards import get_reward

        scores = score_groups(get_reward(data.reward, **data.reward_config), [episode])
        trace.info[RECORD_KEY] = episode.to_dict()
        trace.record_reward(f"turngym_{data.reward}", scores.totals[0])
        for t, r in enumerate(scores.rewards[0]):
            trace.record_metric(f"turngym_turn_{t}", r)


__all__ = ["TurngymTaskset", "TurngymEnv"]
