"""Gymnasium environments; ``register_envs`` makes them available to ``gymnasium.make``.

Each env is registered under ``turngym.envs:<Class>``: this module imports the class on first use,
after checking the optional install its env needs (``turngym.extras.NEEDS``), so ``gymnasium.make`` on an
env whose extra is missing says which one to install instead of failing inside an import.
"""

from __future__ import annotations

from typing import Any

ENTRY_POINTS = {
    "turngym/Calculator-v0": "turngym.envs.calculator:CalculatorEnv",
    "turngym/Digits-v0": "turngym.envs.digits:DigitsEnv",
    "turngym/MathCode-v0": "turngym.envs.math_code:MathCodeEnv",
    "turngym/SearchQA-v0": "turngym.envs.search_qa:SearchQAEnv",
    "turngym/BFCL-v0": "turngym.envs.bfcl.env:BFCLEnv",
    # exact credit oracles (small MDPs with exact advantages, turngym.oracles)
    "turngym/DelayedEffect-v0": "turngym.envs.credit_mdps:DelayedEffectEnv",
    "turngym/Recovery-v0": "turngym.envs.credit_mdps:RecoveryEnv",
    "turngym/VariableHorizon-v0": "turngym.envs.credit_mdps:VariableHorizonEnv",
}
_BY_CLASS = {entry.partition(":")[2]: env_id for env_id, entry in ENTRY_POINTS.items()}


def register_envs() -> None:
    import gymnasium  # here, not at the top: `import turngym` registers these when gymnasium loads

    for env_id, entry in ENTRY_POINTS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=f"{__name__}:{entry.partition(':')[2]}", disable_env_checker=True)


def __getattr__(name: str) -> Any:
    """An env class by name, its extra checked first (gymnasium resolves the registered entry points here)."""
    env_id = _BY_CLASS.get(name)
    if env_id is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    from turngym.extras import NEEDS, require

    part = env_id.partition("/")[2]
    if part in NEEDS:
        require(part)
    module, _, attr = ENTRY_POINTS[env_id].partition(":")
    return getattr(importlib.import_module(module), attr)
