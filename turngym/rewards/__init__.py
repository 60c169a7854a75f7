"""Reward wrappers: score a group of episodes turn by turn. Entry point: ``get_reward(name, **config)``."""

from turngym.rewards.base import REWARDS, GroupScores, RewardWrapper, get_reward  # noqa: F401
