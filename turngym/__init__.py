"""turngym: multi-turn tool-use environments, turn-level rewards, and GRPO on TRL.

Importing turngym registers its environments with gymnasium; heavy dependencies
(torch, transformers, math-verify) are imported only by the modules that need them.
"""

from turngym._version import __version__  # noqa: E402,F401
from turngym.envs import register_envs
from turngym.episode import SCHEMA_VERSION, Episode, Turn  # noqa: F401

register_envs()
