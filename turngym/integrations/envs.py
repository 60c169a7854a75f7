"""Registered turngym envs by name, for the integrations (no other stack imported here)."""

from __future__ import annotations

from typing import Any

import gymnasium


def full_env_id(name: str) -> str:
    """``Calculator-v0`` → ``turngym/Calculator-v0``; a namespaced id is kept."""
    return name if "/" in name else f"turngym/{name}"


def make_turngym_env(env_id: str, **env_kwargs: Any) -> Any:
    """``gymnasium.make`` for a registered turngym env, with one clear error for an unknown id."""
    import turngym  # noqa: F401 - registers the envs

    env_id = full_env_id(env_id)
    if env_id not in gymnasium.registry:
        known = sorted(k for k in gymnasium.registry if k.startswith("turngym/"))
        raise ValueError(f"unknown env {env_id!r}; turngym envs: {', '.join(known)}")
    return gymnasium.make(env_id, **env_kwargs)
