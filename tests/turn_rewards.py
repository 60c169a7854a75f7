"""Test helper: a reward's per-episode value as a ``gymnasium.Wrapper`` on a single env.

Kept in tests/ (not shipped): it shows that a reward declaring ``scores_single_episodes`` can
reward a single env step by step; the wrapped env's step reward becomes the reward's value for
the turn just taken (outcome-only rewards arrive on the final step).
"""

from __future__ import annotations

import gymnasium as gym

from turngym.rewards.base import GroupReward


class EpisodeRewardEnv(gym.Wrapper):
    def __init__(self, env: gym.Env, reward: GroupReward):
        if not reward.scores_single_episodes:
            raise TypeError(f"reward {reward.name!r} scores groups only; it cannot wrap a single env")
        super().__init__(env)
        self.reward = reward

    def step(self, action: str):
        obs, _, terminated, truncated, info = self.env.step(action)
        episode = self.env.unwrapped.episode
        turn_rewards = self.reward.score_episode(episode) if (terminated or truncated) else None
        value = turn_rewards[-1] if turn_rewards else 0.0
        episode.turns[-1].reward = value
        return obs, value, terminated, truncated, {**info, "reward_name": self.reward.name}
