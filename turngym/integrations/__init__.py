"""turngym envs and rewards reached from other stacks: OpenEnv servers (:mod:`.openenv`) and
verifiers environments (:mod:`.verifiers_env`). Each module imports its stack's package only
when used, so turngym itself never needs either (extras ``[openenv]`` and ``[verifiers]``)."""
