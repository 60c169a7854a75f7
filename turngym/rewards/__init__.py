"""Rewards: score a group of episodes turn by turn. Entry point: ``get_reward(name, **config)``."""

from turngym.rewards.base import REWARDS, GroupReward, GroupScores, get_reward  # noqa: F401
