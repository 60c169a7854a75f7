"""turngym inside verl (verl 0.9.1, in its own environment: ``scripts/setup_verl.sh`` builds ``.venv-verl``).

Importing this package registers, in the importing process:

- the agent loop ``turngym`` (:class:`~.agent_loop.TurngymAgentLoop`, verl's ``experimental.agent_loop.register``):
  any registered turngym env played through verl's server manager, token ids in and out;
- the advantage estimators ``turngym_<name>`` (verl's ``core_algos.register_adv_est``) for every estimator in
  turngym's registry (:mod:`.estimators`), reading turns from ``response_mask`` runs.

:class:`~.rewards.TurngymAgentLoopManager` (``actor_rollout_ref.rollout.agent.agent_loop_manager_class``) scores
each step's groups (verl's ``uid``) with a turngym reward and puts each turn's reward on that turn's last response
token. :class:`~.server.PolicyServerClient` answers verl's ``generate`` with a turngym policy (a local model on CPU,
for tests and benchmarks). docs/verl.md says how to run it.
"""

from __future__ import annotations

try:
    import verl.experimental.agent_loop.agent_loop  # noqa: F401 - verl's agent loop stack (ray, hydra, tensordict)
except ImportError as exc:  # one line naming the environment that has it
    raise ImportError(f"turngym.integrations.verl needs verl 0.9.1 with its agent loop's modules ({exc}); build its "
                      "own environment with: bash scripts/setup_verl.sh (then use .venv-verl/bin/python)") from None

from turngym.integrations.verl.agent_loop import TurngymAgentLoop  # noqa: E402
from turngym.integrations.verl.estimators import check_estimator, register_estimators, turn_ranges  # noqa: E402

register_estimators()

__all__ = ["TurngymAgentLoop", "check_estimator", "register_estimators", "turn_ranges"]
