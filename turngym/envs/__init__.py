"""Gymnasium environments; ``register_envs`` makes them available to ``gymnasium.make``."""

from __future__ import annotations

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


def register_envs() -> None:
    import gymnasium  # here, not at the top: `import turngym` registers these when gymnasium loads

    for env_id, entry in ENTRY_POINTS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry, disable_env_checker=True)
