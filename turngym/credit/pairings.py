"""The reward ↔ estimator pairings as a markdown table, generated from the declarations.

docs/results.md opens with this table; it is written from each registered reward's declared
``estimator`` and ``official_estimator`` and each estimator's ``gives``, so it cannot drift from them
(``tests/test_docs.py`` compares the page with :func:`estimator_table`). Regenerate the page's copy with
``python -m turngym.credit.pairings docs/results.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from turngym.registry import resolve
from turngym.rewards.base import REWARDS
from turngym.training.advantages import get_estimator

BEGIN = "<!-- estimator table: generated from the declarations (python -m turngym.credit.pairings docs/results.md) -->"
END = "<!-- end of the estimator table -->"


def estimator_table() -> str:
    """One row per declared estimator: turngym's rewards that declare it, what a turn receives, and the rewards
    whose official code pairs them with another estimator."""
    declared: dict[str, list[str]] = {}
    official: dict[str, list[str]] = {}
    for name in REWARDS:
        entry = REWARDS[name]
        if not (isinstance(entry, str) and entry.startswith("turngym.")):  # turngym's own rewards, not a user's
            continue
        cls = resolve(entry)  # the class's declaration alone: no optional install is needed to read it
        declared.setdefault(cls.estimator, []).append(name)
        if cls.official_estimator not in (None, cls.estimator):
            official.setdefault(cls.estimator, []).append(f"{name}: `{cls.official_estimator}`")
    rows = ["| reward | estimator | what a turn receives | official code pairs it otherwise |", "| --- | --- | --- | --- |"]
    for est, names in sorted(declared.items()):
        spec = get_estimator(est)
        if not spec.gives:
            raise ValueError(f"estimator {est!r} declares no 'gives' (what a turn receives); the table needs it")
        rows.append(f"| {', '.join(names)} | `{est}` | {spec.gives} | {'; '.join(official.get(est, [])) or '—'} |")
    return "\n".join(rows)


def with_table(page: str) -> str:
    """``page`` with the text between the table's markers replaced by :func:`estimator_table`."""
    head, sep, rest = page.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError("the page holds no estimator table markers (BEGIN ... END)")
    return f"{head}{BEGIN}\n{estimator_table()}\n{END}{tail}"


if __name__ == "__main__":
    path = Path(sys.argv[1])
    path.write_text(with_table(path.read_text(encoding="utf-8")), encoding="utf-8")
