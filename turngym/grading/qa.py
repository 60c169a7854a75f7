"""SQuAD v1.1 answer normalisation, exact match and token F1 (max over gold answers)."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_PUNCT = re.compile("[" + re.escape(string.punctuation) + "]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation and the articles a/an/the, collapse white space (SQuAD v1.1).

    SQuAD's per-character loop over the same punctuation set, as one compiled character class: every
    search turn normalises its passages for the gold check, and the loop was a quarter of ``SearchQA.step``."""
    return _words_without_articles(_unpunctuated(s))


def _unpunctuated(s: str) -> str:
    """SQuAD's first two steps: lower case, punctuation dropped."""
    return _PUNCT.sub("", s.lower())


def _words_without_articles(s: str) -> str:
    """SQuAD's last two steps: the articles dropped, white space collapsed."""
    return " ".join(_ARTICLES.sub(" ", s).split())


def contains_normalized(text: str, normalized_answers: Iterable[str]) -> bool:
    """Whether some (already normalised, non-empty) answer is a run of whole words of ``normalize_answer(text)``.

    Every word of such an answer is a substring of ``text`` lower-cased without punctuation, so an answer
    with a word missing there is ruled out before the articles and spaces are normalised: on a search turn
    most passages hold no gold answer, and the full normalisation of each was most of ``SearchQA.step``."""
    bare = _unpunctuated(text)
    candidates = [n for n in normalized_answers if n and all(w in bare for w in n.split())]
    if not candidates:
        return False
    hay = f" {_words_without_articles(bare)} "
    return any(f" {n} " in hay for n in candidates)


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
