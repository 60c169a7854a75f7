"""SQuAD v1.1 answer normalisation, exact match and token F1 (max over gold answers)."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation and the articles a/an/the, collapse white space (SQuAD v1.1)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str | None, golds: Iterable[str]) -> float:
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def _f1(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, golds: Iterable[str]) -> float:
    if prediction is None:
        return 0.0
    return max((_f1(prediction, g) for g in golds), default=0.0)
