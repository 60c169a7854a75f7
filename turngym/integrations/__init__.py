"""Outward adapters: turngym envs and episodes in other stacks (OpenEnv servers, TRL, SkyRL, verifiers, lm-eval),
a stage above training (``tests/test_layers.py``). What they do at a rollout's edges is shared (:mod:`.edges`).
A module here imports its stack's package, so turngym itself never needs it."""
