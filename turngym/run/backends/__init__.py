"""The rollout runner's env backends: env handles whose envs live elsewhere (an OpenEnv server)."""
