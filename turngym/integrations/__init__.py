"""turngym envs reached from other stacks: OpenEnv servers and clients (:mod:`.openenv`, the
``[openenv]`` extra), verifiers environments (:mod:`.verifiers_env`, the ``[verifiers]`` extra) and
lm-eval tasks played as turngym episodes (:mod:`.lm_eval_bridge`, the ``[lm-eval]`` extra).
A module here imports its stack's package, so turngym itself never needs it."""
