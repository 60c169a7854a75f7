"""turngym envs as SkyRL environments (``skyrl-gym``, the ``[skyrl]`` extra), and turngym's per-turn
rewards and advantages in SkyRL's token-level form.

:class:`TurngymSkyRLEnv` is a ``skyrl_gym`` ``BaseTextEnv`` around one Gymnasium ``turngym/...`` env:
SkyRL's generator makes it with ``skyrl_gym.make(env_class, env_config=..., extras=row)``, calls
``init(prompt)`` (the env owns its prompt: turngym's chat messages come back), then ``step(reply)``
until ``done``, then ``get_metrics()`` (numeric outcome fields, and the whole episode under
``EPISODE_METRIC`` for group rewards) and ``close()``. Each step's reward is ``env.step``'s (the
outcome on the last step); its metadata holds the turn's metrics and per-turn truth, and on the
last step the outcome and every turn's truth (truth known only at grading is set then).
Importing this module registers every turngym env in skyrl-gym's registry as ``turngym/<EnvId>``.

:func:`token_level_rewards` places per-turn rewards the way SkyRL's generator places per-step
rewards (NovaSky-AI/SkyRL a9564572e, ``skyrl/train/generators/skyrl_gym_generator.py:629-642``, "Build
token-level rewards placed at assistant turn boundaries", with ``response_end_idx`` the reply's last
token, line 1117): turn t's reward on the last token of its reply, over the response tokens
(everything after the prompt). :func:`token_level_advantages` puts turn t's
advantage on its reply tokens (where the loss mask is 1), as turngym's trainer does.
:func:`generator_output` builds SkyRL's ``GeneratorOutput`` fields from recorded episodes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from turngym.extras import require

require("the SkyRL integration")

import skyrl_gym  # noqa: E402 - after the extra check, so a missing skyrl-gym is one message
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402
from skyrl_gym.tools.core import ToolGroup, tool  # noqa: E402

from turngym.envs.tools import EnvTool  # noqa: E402
from turngym.episode import Episode  # noqa: E402
from turngym.integrations.edges import score_groups  # noqa: E402
from turngym.integrations.envs import full_env_id, make_turngym_env  # noqa: E402

# the get_metrics key holding the trajectory's episode (a JSON-safe dict): SkyRL's generator copies each row's
# get_metrics() into GeneratorOutput["env_metrics"], where a group reward reads it back
# (turngym.integrations.skyrl_generator); skyrl-gym's metric averaging skips non-numeric values
EPISODE_METRIC = "turngym_episode"

# row (SkyRL's env_extras) fields that choose the episode; SkyRL's own (reward_spec, extra_info, ...) are ignored
OPTION_KEYS = ("index", "task", "group", "episode_id")


def _options(extras: Mapping[str, Any]) -> tuple[int | None, dict[str, Any]]:
    info = extras.get("extra_info") if isinstance(extras.get("extra_info"), Mapping) else {}
    merged = {**info, **extras}  # a top-level field wins over the same one in extra_info
    options = {k: merged[k] for k in OPTION_KEYS if merged.get(k) is not None}
    return merged.get("seed"), options


TOOL_GROUP = "turngym"  # the SkyRL tool group holding an env's declared tools


def tool_group(tools: Sequence[EnvTool]) -> ToolGroup:
    """A SkyRL ``ToolGroup`` named ``turngym`` with one tool per declared env tool; calling one with the call's
    arguments gives the env's action text (the env itself runs the tool when stepped with it)."""

    def one(t: EnvTool) -> tool:
        def run(group: ToolGroup, arguments: Mapping[str, Any]) -> str:
            return t.to_action(arguments)

        run.__name__ = t.name
        return tool(run)

    cls = type("TurngymTools", (ToolGroup,), {t.name: one(t) for t in tools})
    return cls(TOOL_GROUP)


class TurngymSkyRLEnv(BaseTextEnv):
    """One SkyRL trajectory's turngym env. ``env_config`` (SkyRL's per-env config section) holds the
    env's constructor arguments; ``extras`` (the dataset row) chooses the item (``index`` or ``task``,
    at the top level or in ``extra_info``; a random item when neither) and may set ``max_turns``."""

    def __init__(self, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None,
                 env_id: str = "", **env_kwargs: Any):
        super().__init__()
        if not env_id:
            raise ValueError("TurngymSkyRLEnv needs env_id (a registered turngym env, e.g. 'Calculator-v0')")
        extras = dict(extras or {})
        kwargs = {**dict(env_config or {}), **env_kwargs}
        if extras.get("max_turns") is not None:  # SkyRL's generator writes its own cap into the row
            kwargs["max_turns"] = int(extras["max_turns"])
        self.env_id = full_env_id(env_id)
        self.env = make_turngym_env(self.env_id, **kwargs)
        self.raw = self.env.unwrapped
        self.max_turns = self.raw.max_turns
        self.seed, self.options = _options(extras)
        self.init_tool_groups([tool_group(self.raw.declared_tools())])

    def tool_action(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The env's action for a call of its declared tool ``name`` (through SkyRL's tool group ``turngym``):
        pass it to :meth:`step`."""
        return self._execute_tool(TOOL_GROUP, name, [arguments])

    @property
    def episode(self) -> Episode | None:
        """The turngym record of this trajectory (turns, truth, metrics, outcome)."""
        return self.raw.episode

    def init(self, prompt: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        _text, info = self.env.reset(seed=self.seed, options=dict(self.options))
        self.turns = 0
        ep = self.raw.episode
        return copy.deepcopy(ep.prompt), {"episode_id": ep.id, "task": info["task"], "tools": copy.deepcopy(ep.tools),
                                          "env_tools": [t.schema() for t in self.raw.declared_tools()],
                                          "stop": list(self.raw.stop)}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        text, reward, terminated, truncated, _info = self.env.step(action)
        self.turns += 1
        ep = self.raw.episode
        turn = ep.turns[-1]
        done = bool(terminated or truncated)
        metadata: dict[str, Any] = {"turn": turn.index, "metrics": copy.deepcopy(turn.metrics),
                                    "truth": {k: v.value for k, v in turn.truth.items()},
                                    "parse_error": turn.parse_error, "terminated": bool(terminated),
                                    "truncated": bool(truncated)}
        if done:
            metadata["outcome"] = copy.deepcopy(ep.outcome)
            metadata["final_answer"] = ep.final_answer
            metadata["truth_by_turn"] = [{k: v.value for k, v in t.truth.items()} for t in ep.turns]
        role = turn.observation_role or self.raw.observation_role or "user"
        observations = [] if done else [{"role": role, "content": text}]
        return BaseTextEnvStepOutput(observations=observations, reward=float(reward), done=done, metadata=metadata,
                                     postprocessed_action=None)

    def get_metrics(self) -> dict[str, Any]:
        ep = self.raw.episode
        if ep is None:
            return {}
        metrics: dict[str, Any] = {"turns": len(ep.turns)}
        for key, value in (ep.outcome or {}).items():
            if isinstance(value, (bool, int, float)):
                metrics[key] = float(value)
        metrics[EPISODE_METRIC] = json.loads(ep.to_json())
        return metrics

    def close(self) -> None:
        self.env.close()


def make_env(env_id: str, env_config: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None,
             **env_kwargs: Any) -> TurngymSkyRLEnv:
    """A SkyRL env for the turngym env ``env_id`` (an unknown id is one error listing the registered ones)."""
    return TurngymSkyRLEnv(env_config=env_config, extras=extras, env_id=env_id, **env_kwargs)


def register_envs() -> list[str]:
    """Register every turngym env in skyrl-gym's registry as ``turngym/<EnvId>``; returns the ids."""
    import gymnasium

    import turngym  # noqa: F401 - registers the turngym envs

    ids = sorted(k for k in gymnasium.registry if k.startswith("turngym/"))
    for env_id in ids:
        if env_id not in skyrl_gym.registry:
            skyrl_gym.register(id=env_id, entry_point=f"{__name__}:TurngymSkyRLEnv", kwargs={"env_id": env_id})
    return ids


register_envs()


# --------------------------------------------------------------------------- token-level export


def _response_layout(episode: Episode):
    layout = episode.token_layout()
    n = len(layout.ids) - layout.prompt_end
    return layout, n


def token_level_rewards(episode: Episode, per_turn: Sequence[float]) -> list[float]:
    """Per-turn rewards as SkyRL's token-level rewards: one value per response token (after the prompt),
    turn t's reward on the last token of turn t's reply, 0 elsewhere."""
    layout, n = _response_layout(episode)
    if len(per_turn) != len(layout.action_ends):
        raise ValueError(f"episode {episode.id} has {len(layout.action_ends)} turns but {len(per_turn)} rewards")
    out = [0.0] * n
    for t, (reward, end) in enumerate(zip(per_turn, layout.action_ends, strict=True)):
        if not any(layout.trained[i] for i in range(layout.prompt_end, end) if layout.turn_of[i] == t):
            raise ValueError(f"episode {episode.id} turn {t} has no reply tokens to carry its reward")
        out[end - 1 - layout.prompt_end] += float(reward)
    return out


def token_level_advantages(episode: Episode, per_turn: Sequence[float]) -> list[float]:
    """Per-turn advantages over the response tokens: turn t's value on turn t's reply tokens (loss mask 1),
    0 on observation tokens."""
    layout, n = _response_layout(episode)
    if len(per_turn) != len(layout.action_ends):
        raise ValueError(f"episode {episode.id} has {len(layout.action_ends)} turns but {len(per_turn)} advantages")
    start = layout.prompt_end
    return [float(per_turn[layout.turn_of[i]]) if layout.trained[i] else 0.0 for i in range(start, start + n)]


def group_scores(episodes: Sequence[Episode], reward: str | Any = "outcome", estimator: str | None = None,
                 **estimator_kwargs: Any) -> tuple[list[list[float]], list[list[float]]]:
    """A group's per-turn rewards (a turngym reward's ``score_group``) and advantages (its declared estimator, or
    ``estimator`` from turngym's registry), through :func:`turngym.integrations.edges.score_groups`."""
    scores = score_groups(reward, episodes, estimator, **estimator_kwargs)
    return scores.rewards, scores.advantages


def generator_output(episodes: Sequence[Episode], per_turn_rewards: Sequence[Sequence[float]]) -> dict[str, Any]:
    """SkyRL's ``GeneratorOutput`` fields (``skyrl/train/generators/base.py:37-45``) for recorded episodes with
    token ids: prompt ids, response ids (replies and observations after the prompt), token-level rewards,
    loss masks (1 on reply tokens), rollout log-probabilities and stop reasons."""
    if len(episodes) != len(per_turn_rewards):
        raise ValueError(f"{len(episodes)} episodes but {len(per_turn_rewards)} reward lists")
    out: dict[str, Any] = {"prompt_token_ids": [], "response_ids": [], "rewards": [], "loss_masks": [],
                           "rollout_logprobs": [], "stop_reasons": [], "rollout_metrics": None}
    for ep, rewards in zip(episodes, per_turn_rewards, strict=True):
        layout, _n = _response_layout(ep)
        p = layout.prompt_end
        out["prompt_token_ids"].append(layout.ids[:p])
        out["response_ids"].append(layout.ids[p:])
        out["rewards"].append(token_level_rewards(ep, rewards))
        out["loss_masks"].append(layout.trained[p:])
        out["rollout_logprobs"].append(layout.logprobs[p:])
        out["stop_reasons"].append("length" if ep.truncated else "stop")
    return out
