"""Training: the GRPO trainer (TRL subclass), the advantage estimators and the train config.

The layer after rewards: it plays episodes with the rollout layer (``turngym.agents``), scores
them with a reward and turns the scores into per-turn advantages.
"""
