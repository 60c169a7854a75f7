"""Import bfcl-eval's checkers, decoders and backends without its side effects.

bfcl-eval (PyPI ``bfcl-eval``) is installed with ``--no-deps``: its metadata pins
``numpy==1.26.4`` and ~70 packages that would break numpy-2 users (pyarrow, datasets,
pyserini), while the parts used here (data, AST checker, multi-turn checker, backend
classes, prompting decoders) run on numpy 2.

Two things are arranged before the first import:

* ``BFCL_PROJECT_ROOT`` points at a turngym cache folder; otherwise bfcl-eval creates
  ``result/``, ``score/`` and lock folders inside site-packages at import time.
* ``bfcl_eval.constants.model_config`` is provided by :func:`_model_config_module`.
  The real module imports every API client bfcl-eval supports (anthropic, cohere,
  mistralai, google-genai, qwen-agent, boto3, writer, ...) only to build its model
  table. The AST checker reads that table for one thing: whether a model's function
  names had ``.`` replaced by ``_`` (``underscore_to_dot``). turngym decodes calls
  with their original names, so the provided module holds a single entry,
  ``turngym``, with ``underscore_to_dot=False``. If the real module is already
  imported (a user with all clients installed), the entry is added to its table.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKER_MODEL_NAME = "turngym"
BFCL_VERSION = "2026.3.23"
_INSTALL_HINT = (
    f"BFCL-v0 needs bfcl-eval: pip install --no-deps bfcl-eval=={BFCL_VERSION} "
    "and pip install 'turngym[bfcl]' for its runtime dependencies (scripts/setup.sh does both)"
)
_lock = threading.Lock()
_loaded: dict[str, Any] = {}


class BFCLUnavailable(ImportError):
    """bfcl-eval (or one of the modules it needs) is not installed."""


@dataclass(frozen=True)
class _CheckerModelConfig:
    """The one field of bfcl-eval's ``ModelConfig`` that its AST checker reads."""

    model_name: str = CHECKER_MODEL_NAME
    underscore_to_dot: bool = False
    is_fc_model: bool = False


def bfcl_project_root() -> Path:
    """Where bfcl-eval may write its result/score/lock folders (never site-packages)."""
    explicit = os.environ.get("TURNGYM_BFCL_ROOT")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "turngym" / "bfcl"


def _model_config_module() -> types.ModuleType:
    module = types.ModuleType("bfcl_eval.constants.model_config")
    module.__doc__ = "Provided by turngym.envs.bfcl.upstream: the checker's model table, without API clients."
    module.ModelConfig = _CheckerModelConfig  # type: ignore[attr-defined]
    module.MODEL_CONFIG_MAPPING = {CHECKER_MODEL_NAME: _CheckerModelConfig()}  # type: ignore[attr-defined]
    return module


def bfcl() -> dict[str, Any]:
    """The bfcl-eval modules turngym uses, imported once (thread-safe)."""
    with _lock:
        if _loaded:
            return _loaded
        root = bfcl_project_root()
        root.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("BFCL_PROJECT_ROOT", str(root))
        try:
            importlib.import_module("bfcl_eval")
        except ImportError as exc:
            raise BFCLUnavailable(f"{_INSTALL_HINT} ({exc})") from None
        name = "bfcl_eval.constants.model_config"
        if name not in sys.modules:
            sys.modules[name] = _model_config_module()
        else:
            sys.modules[name].MODEL_CONFIG_MAPPING.setdefault(CHECKER_MODEL_NAME, _CheckerModelConfig())
        try:
            mods = {
                "ast_checker": importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker"),
                "multi_turn_checker": importlib.import_module(
                    "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker"),
                "multi_turn_utils": importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"),
                "agentic_checker": importlib.import_module("bfcl_eval.eval_checker.agentic_eval.agentic_checker"),
                "handler_utils": importlib.import_module("bfcl_eval.model_handler.utils"),
                "utils": importlib.import_module("bfcl_eval.utils"),
                "enums": importlib.import_module("bfcl_eval.constants.enums"),
                "prompts": importlib.import_module("bfcl_eval.constants.default_prompts"),
                "backend_config": importlib.import_module("bfcl_eval.constants.executable_backend_config"),
                "eval_config": importlib.import_module("bfcl_eval.constants.eval_config"),
                "type_mappings": importlib.import_module("bfcl_eval.constants.type_mappings"),
            }
        except ImportError as exc:
            raise BFCLUnavailable(f"{_INSTALL_HINT} ({exc})") from None
        _loaded.update(mods)
        return _loaded
