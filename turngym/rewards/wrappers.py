"""Per-episode rewards as a ``gymnasium.Wrapper`` on a single env.

The wrapped env's step reward becomes the reward wrapper's value for the turn just taken;
rewards that are only known when the episode ends (outcome) arrive on the final step.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym


class TurnRewardWrapper(gym.Wrapper):
    def __init__(self, env: gym.Env, reward: Any):
        if not hasattr(reward, "score_episode"):
            raise TypeError(f"reward {getattr(reward, 'name', reward)!r} scores groups only; it cannot wrap a single env")
        super().__init__(env)
        self.reward = reward

    def step(self, action: str):
        obs, _, terminated, truncated, info = self.env.step(action)
        episode = self.env.unwrapped.episode
        turn_rewards = self.reward.score_episode(episode) if (terminated or truncated) else None
        value = turn_rewards[-1] if turn_rewards else 0.0
        episode.turns[-1].reward = value
        info = {**info, "reward_name": self.reward.name}
        return obs, value, terminated, truncated, info
