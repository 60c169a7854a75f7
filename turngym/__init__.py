"""turngym: multi-turn tool-use environments, turn-level rewards, and GRPO on TRL.

Importing turngym registers its environments with gymnasium; heavy dependencies
(torch, transformers, math-verify) are imported only by the modules that need them.
"""

from turngym.episode import SCHEMA_VERSION, Episode, Turn  # noqa: F401
from turngym.envs import register_envs

__version__ = "0.1.0"

register_envs()
