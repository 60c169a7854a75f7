"""verifiers v1 plugin entry (verifiers 0.4): ``vf-eval turngym-taskset --env.taskset.env Calculator-v0``.

verifiers imports a taskset by a top-level module name and takes the ``Taskset`` and ``Env`` subclasses
it exports in ``__all__``; both live in :mod:`turngym.integrations.verifiers_v1`.
"""

from turngym.integrations.verifiers_v1 import TurngymEnv, TurngymTaskset

__all__ = ["TurngymTaskset", "TurngymEnv"]
