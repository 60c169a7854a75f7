"""Where turngym keeps what it builds once per machine (converted models, indexes, compiled Java):
``$TURNGYM_CACHE``, else ``~/.cache/turngym``. One definition, read on every call so a test or a
user can point it elsewhere."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("TURNGYM_CACHE", Path.home() / ".cache" / "turngym"))
