"""turngym envs reached from other stacks: OpenEnv servers and clients (:mod:`.openenv`, the
``[openenv]`` extra) and verifiers environments (:mod:`.verifiers_env`, the ``[verifiers]`` extra).
A module here imports its stack's package, so turngym itself never needs it."""
