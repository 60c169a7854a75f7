"""A contract checker for turngym envs, in the spirit of Gymnasium's ``check_env``.

Gymnasium's checker sees spaces, seeding and the reset/step signatures. The rollout runner,
the rewards and the trainer also rely on what a :class:`TextEnv` records and exposes; this
checks that part, so a new env that breaks it fails here rather than deep inside a run.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from gymnasium.utils.env_checker import check_env

from turngym.envs.base import TextEnv
from turngym.episode import Episode, RewardNeeds

OBSERVATION_ROLES = (None, "user", "tool")


class ContractError(AssertionError):
    """An env breaks the turngym env contract; the message says which rule."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ContractError(message)


def check_text_env(env: Any, actions: Sequence[str] = ("", "not a tool call", "\ud800 <search>"), *,
                   reset_options: dict[str, Any] | None = None) -> None:
    """Raise :class:`ContractError` unless ``env`` keeps the turngym env contract.

    ``actions`` are played one per step after a reset (the defaults are malformed on purpose:
    bad actions must become observations, never exceptions). ``reset_options`` picks the item.
    """
    raw = env.unwrapped
    _require(isinstance(raw, TextEnv), f"{type(raw).__name__} is not a turngym TextEnv")
    check_env(raw, skip_render_check=True)
    name = raw.env_name
    _require(isinstance(name, str) and "/" in name, f"env_name must be a namespaced id like 'turngym/X-v0', got {name!r}")
    _require(isinstance(raw.dataset_name, str), f"{name}: dataset_name must be a string")
    _require(raw.observation_role in OBSERVATION_ROLES, f"{name}: observation_role must be one of {OBSERVATION_ROLES}")
    _require(isinstance(raw.stop, tuple) and all(isinstance(s, str) and s for s in raw.stop),
             f"{name}: stop must be a tuple of non-empty strings")
    _require(isinstance(raw.max_turns, int) and raw.max_turns >= 1, f"{name}: max_turns must be an int >= 1")
    _require(isinstance(raw.reward_needs, RewardNeeds),
             f"{name}: reward_needs must declare what rewards need (a turngym.episode.RewardNeeds), "
             f"got {raw.reward_needs!r}")

    options = dict(reset_options or {"index": 0})
    obs, info = raw.reset(seed=123, options=copy.deepcopy(options))
    _require(isinstance(obs, str) and obs, f"{name}: reset must return the rendered prompt")
    ep = raw.episode
    _require(isinstance(ep, Episode) and not ep.turns and not ep.done, f"{name}: reset must start a fresh Episode")
    _require(ep.env_id == name, f"{name}: the episode's env_id must be the env's name")
    _require(ep.reward_needs == raw.reward_needs, f"{name}: the episode must carry the env's reward_needs")
    _require(all(isinstance(m, dict) and set(m) >= {"role", "content"} for m in ep.prompt),
             f"{name}: the prompt must be a list of {{'role', 'content'}} messages")
    _require(ep.tools is None or all(isinstance(t, dict) for t in ep.tools), f"{name}: tools must be a list of schemas")
    _, info_again = raw.reset(seed=123, options=copy.deepcopy(options))
    _require(info == info_again, f"{name}: info after reset must be deterministic")

    for i, action in enumerate(actions):
        try:
            obs, reward, terminated, truncated, info = raw.step(action)
        except Exception as exc:  # noqa: BLE001 - the contract is that nothing escapes
            raise ContractError(f"{name}: step({action!r}) raised {type(exc).__name__}: {exc}") from exc
        ep = raw.episode
        _require(len(ep.turns) == i + 1, f"{name}: each step must record exactly one turn")
        turn = ep.turns[-1]
        _require(turn.action == action, f"{name}: the turn must record the action as given")
        _require(not turn.tool_calls or bool(raw.reward_needs.tool_ok_metrics),
                 f"{name}: a turn made tool calls, so reward_needs must declare tool_ok_metrics (the per-turn "
                 "metric that says whether they ran)")
        _require(isinstance(obs, str) and isinstance(reward, float), f"{name}: step must return a str and a float")
        _require(info.get("turn_count") == len(ep.turns) and "latency_ms" not in info.get("turn", {}),
                 f"{name}: info must carry the turn without timing fields")
        if terminated or truncated:
            _require(ep.done and isinstance(ep.outcome, dict), f"{name}: an ended episode must be graded")
            _require(turn.observation is None, f"{name}: the final turn has no observation")
            break
        _require(turn.observation is not None, f"{name}: a turn that does not end the episode needs an observation")
        _require(turn.observation_role in OBSERVATION_ROLES, f"{name}: bad observation_role on a turn")
    if not raw.episode.done:
        raw.end_episode("checker")
        _require(raw.episode.truncated and raw.episode.meta.get("truncation") == "checker",
                 f"{name}: end_episode must truncate the episode and say why")
    _require(raw.episode.reward_needs == raw.reward_needs, f"{name}: the ended episode must still carry reward_needs")
    again = Episode.from_dict(raw.episode.to_dict())
    _require(again.to_dict() == raw.episode.to_dict(), f"{name}: the episode must round-trip through its dict form")
    raw.close()
