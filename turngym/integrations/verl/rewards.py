"""turngym's group rewards in verl: each step's groups (verl's ``uid``) scored by a turngym reward, each turn's
reward on that turn's last reply token (``rm_scores``, which verl turns into ``token_level_scores``).

verl 0.9.1 scores one trajectory at a time (its reward loop's ``run_single``); SIOP, IGPO, TTRL, EMPO and SCRIBE
compare the K rollouts of one query, so they are scored where the whole step is in hand: after the agent loops
return, in :class:`TurngymAgentLoopManager` (``actor_rollout_ref.rollout.agent.agent_loop_manager_class``). The
episodes come from the ``turngym`` agent loop's ``extra_fields`` (its Episode JSON and turn spans). The reward is
``turngym.reward`` (a registry name or label, e.g. ``siop`` or ``siop[prefix=after_observation]``) with
``turngym.reward_kwargs``; without one, ``rm_scores`` stays the env's return on the last token (verl's placement of
the agent loop's ``reward_score``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopManager
from verl.utils.ray_utils import auto_await

from turngym.episode import Episode, group_episodes, reward_view
from turngym.integrations.verl.agent_loop import plain_config
from turngym.integrations.verl.estimators import check_estimator, turn_ranges
from turngym.rewards import get_reward


def score_groups(episodes: Sequence[Episode], uids: Sequence[Any], reward: Any) -> list[list[float]]:
    """Each group scored together by ``reward.score_group`` (through ``reward_view``: no truth); one list of per-turn
    rewards per episode, in batch order. Groups are turngym's (``group_episodes``, by ``Episode.group_key``): the
    agent loop made each episode's group its row's verl ``uid``, which is checked here, never regrouped."""
    for ep, uid in zip(episodes, uids, strict=True):
        if ep.group_key != str(uid):
            raise ValueError(f"episode {ep.id} is of group {ep.group_key!r} but its row's uid is {uid!r}: the batch was "
                             "reordered or its episodes do not come from the turngym agent loop")
    position = {id(ep): i for i, ep in enumerate(episodes)}
    out: list[list[float]] = [[] for _ in episodes]
    for group in group_episodes(episodes):
        scores = reward.score_group(reward_view(list(group.episodes)))
        for ep, rewards in zip(group.episodes, scores.rewards, strict=True):
            out[position[id(ep)]] = [float(r) for r in rewards]
    return out


def place_turn_rewards(rewards: Sequence[Sequence[float]], spans: Sequence[Sequence[Sequence[int]]],
                       response_mask: torch.Tensor) -> torch.Tensor:
    """``rm_scores``: turn t's reward on the last token of turn t's reply, 0 elsewhere. The spans must be the
    mask's runs of 1s, which is how the estimators read turns back; a mismatch is refused, naming the row."""
    out = torch.zeros_like(response_mask, dtype=torch.float32)
    for i, (row, row_spans) in enumerate(zip(rewards, spans, strict=True)):
        row_spans = [tuple(int(x) for x in s) for s in row_spans]
        if row_spans != turn_ranges(response_mask[i]):
            raise ValueError(f"row {i}: the agent loop's turn spans {row_spans} are not the response mask's runs "
                             f"{turn_ranges(response_mask[i])} (a turn whose observation has no tokens joins the next)")
        if len(row) != len(row_spans):
            raise ValueError(f"row {i}: {len(row)} turn rewards for {len(row_spans)} turns")
        for value, (_start, end) in zip(row, row_spans, strict=True):
            out[i, end - 1] += value
    return out


def reward_settings(config: Any) -> tuple[str | None, dict[str, Any]]:
    section = plain_config(config.get("turngym")) or {}
    return section.get("reward"), dict(section.get("reward_kwargs") or {})


def apply_group_rewards(output: Any, uids: Sequence[Any], reward: Any) -> Any:
    """Score the step's turngym episodes by group and write ``rm_scores`` (and ``turngym_return``, each episode's
    summed reward, as reward extra info) into verl's ``DataProto`` in place; returns it."""
    if "turngym_episode" not in output.non_tensor_batch:
        raise ValueError("turngym.reward scores turngym episodes, but this batch has none: play it with the agent "
                         "loop 'turngym' (actor_rollout_ref.rollout.agent.default_agent_loop=turngym)")
    episodes = [Episode.from_json(s) for s in output.non_tensor_batch["turngym_episode"]]
    rewards = score_groups(episodes, uids, reward)
    output.batch["rm_scores"] = place_turn_rewards(rewards, output.non_tensor_batch["turn_spans"],
                                                   output.batch["response_mask"])
    output.non_tensor_batch["turngym_return"] = np.array([sum(r) for r in rewards], dtype=np.float64)
    keys = [k for k in output.meta_info.get("reward_extra_keys", []) if k != "turngym_return"]
    output.meta_info["reward_extra_keys"] = keys + ["turngym_return"]
    return output


class TurngymAgentLoopManager(AgentLoopManager):
    """verl's agent loop manager, plus turngym's group rewards on each step's batch. Its construction, at the
    trainer's start-up, refuses a ``turngym_<name>`` estimator verl cannot feed and builds the reward (so a bad
    name or option fails before any rollout)."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        check_estimator(str(config.algorithm.adv_estimator))
        name, reward_kwargs = reward_settings(config)
        self.turngym_reward = get_reward(name, **reward_kwargs) if name else None
        super().__init__(config, *args, **kwargs)

    @auto_await
    async def generate_sequences(self, prompts: Any) -> Any:
        output = await super().generate_sequences(prompts)
        if self.turngym_reward is None:
            return output
        return apply_group_rewards(output, prompts.non_tensor_batch["uid"], self.turngym_reward)
