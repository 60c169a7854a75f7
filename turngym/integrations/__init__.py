"""turngym envs reached from other stacks: OpenEnv servers and clients (:mod:`.openenv`, the
``[openenv]`` extra). A module here imports its stack's package, so turngym itself never needs it."""
