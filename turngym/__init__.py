"""turngym: multi-turn tool-use environments, turn-level rewards, and GRPO on TRL.

Importing turngym is light (the ``turngym`` command's ``--help`` needs no numpy): its environments
are registered with gymnasium the moment gymnasium is imported (at once if it already is), so
``import turngym; gymnasium.make("turngym/Calculator-v0")`` works in either import order. Heavy
dependencies (torch, transformers, math-verify) are imported only by the modules that need them.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from turngym._version import __version__  # noqa: F401

_LAZY = {"Episode", "Turn", "SCHEMA_VERSION"}  # turngym.episode's records, imported on first use


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from turngym import episode

        return getattr(episode, name)
    raise AttributeError(f"module 'turngym' has no attribute {name!r}")


def _register() -> None:
    from turngym.envs import register_envs

    register_envs()


class _RegisterWithGymnasium:
    """A meta-path finder (importlib.abc.MetaPathFinder's protocol, not imported: it costs 0.1 s) that finds
    nothing itself: when ``gymnasium`` is first imported, registers turngym's envs right after it loads."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "gymnasium":
            return None
        sys.meta_path.remove(self)  # one use; the real finders locate gymnasium
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            load(module)
            _register()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's own loader instance
        return spec


if "gymnasium" in sys.modules:
    _register()
elif not any(isinstance(f, _RegisterWithGymnasium) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWithGymnasium())
