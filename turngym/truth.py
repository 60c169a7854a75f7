"""Per-turn truth: what a turn was worth, kept where no reward looks.

Credit tables compare a reward's credit with a per-turn truth no reward saw. That truth used to
sit in ``Turn.metrics``, which rewards read (toolcall_dense reads ``tool_ok``), and was guessed from four
metric names. Here it has its own namespace, ``Turn.truth``: key → :class:`TruthValue` (the value
as recorded, never cast, and its source). Envs declare the keys they write (``truth_keys``), an
importer or the planted benchmark writes its own; rewards get episodes through
:func:`turngym.episode.reward_view`, which empties the namespace, so no reward can read it.

A table turns values into labels 1 / 0 / skip with :func:`turngym.episode.turn_labels`: binary values (True /
False, 1 / 0) map as they are; anything else (a human −1 / 0 / +1 label, a Monte-Carlo advantage)
needs a :class:`TruthMap` such as ``"+1:1,-1:0,0:skip"`` and is refused without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TRUTH_SOURCES = ("planted", "env", "human", "mc", "exact")
Scalar = bool | int | float | str | None


class TruthError(ValueError):
    """Truth that cannot become a label as asked (a non-binary value without a map, a missing or ambiguous key)."""


@dataclass(frozen=True)
class TruthValue:
    """One turn's truth under one key: the value as recorded and where it came from."""

    value: Scalar
    source: str

    def __post_init__(self) -> None:
        if self.source not in TRUTH_SOURCES:
            raise ValueError(f"truth source must be one of {TRUTH_SOURCES}, got {self.source!r}")
        if not isinstance(self.value, (bool, int, float, str, type(None))):
            raise ValueError(f"a truth value is a scalar (bool, number, text or None), got {type(self.value).__name__}")

    @classmethod
    def from_any(cls, d: Any) -> TruthValue:
        """From a record read back from JSON (``{"value": v, "source": s}``)."""
        if isinstance(d, TruthValue):
            return d
        if not isinstance(d, dict) or "value" not in d or "source" not in d:
            raise ValueError(f"a turn's truth entry must be {{'value': ..., 'source': ...}}, got {d!r}")
        return cls(d["value"], d["source"])


def _canon(x: Any) -> float | str:
    """Numbers (bools included) compare as floats; text as lower-case text."""
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)):
        return float(x)
    return str(x).strip().lower()


@dataclass(frozen=True)
class TruthMap:
    """Recorded value → label (1, 0, or None = skip the turn). ``TruthMap.parse("+1:1,-1:0,0:skip")``."""

    table: tuple[tuple[float | str, int | None], ...]

    @classmethod
    def parse(cls, text: str) -> TruthMap:
        rows: list[tuple[float | str, int | None]] = []
        for part in (p.strip() for p in text.split(",") if p.strip()):
            src, sep, dst = part.rpartition(":")
            if not sep or not src.strip():
                raise TruthError(f"--truth-map entries are VALUE:LABEL with LABEL 1, 0 or skip; got {part!r} in {text!r}")
            dst = dst.strip().lower()
            if dst not in ("1", "0", "skip"):
                raise TruthError(f"--truth-map label must be 1, 0 or skip; got {dst!r} in {part!r}")
            key = src.strip()
            try:
                canon: float | str = float(key)
            except ValueError:
                canon = {"true": 1.0, "false": 0.0}.get(key.lower(), key.lower())
            rows.append((canon, None if dst == "skip" else int(dst)))
        if not rows:
            raise TruthError("--truth-map is empty; give VALUE:LABEL pairs such as '+1:1,-1:0,0:skip'")
        return cls(tuple(rows))

    def label(self, value: Scalar) -> tuple[bool, int | None]:
        """(found, label) for ``value``."""
        c = _canon(value)
        for k, lab in self.table:
            if k == c:
                return True, lab
        return False, None


def binary_label(value: Scalar) -> int | None:
    """1 / 0 for True / False / 1 / 0 (None: no truth); raises ValueError for anything else."""
    if value is None:
        return None
    c = _canon(value)
    if c in (0.0, 1.0):
        return int(c)
    raise ValueError(value)


def check_declared(turn_truth: dict[str, Any], declared: Sequence[str], env_name: str) -> dict[str, TruthValue]:
    """An env's truth for one turn as :class:`TruthValue` (source ``env``); a key it did not declare is refused."""
    if not turn_truth:
        return {}
    extra = sorted(set(turn_truth) - set(declared))
    if extra:
        raise ValueError(f"{env_name} wrote truth key(s) {extra} it does not declare in truth_keys {tuple(declared)}")
    return {k: v if isinstance(v, TruthValue) else TruthValue(v, "env") for k, v in turn_truth.items()}
