"""SQuAD v1.1 answer normalisation, exact match and token F1 (max over gold answers)."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_PUNCT_BYTES = string.punctuation.encode("ascii")
_ASCII_LOWER = bytes.maketrans(string.ascii_uppercase.encode("ascii"), string.ascii_lowercase.encode("ascii"))
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation and the articles a/an/the, collapse white space (SQuAD v1.1).

    SQuAD's per-character loop over the same punctuation set, as one bytes deletion (see :func:`_unpunctuated_utf8`):
    every search turn normalises its passages for the gold check, and the loop was a quarter of ``SearchQA.step``."""
    return _words_without_articles(_unpunctuated_utf8(s).decode("utf-8", "surrogatepass"))


def _unpunctuated_utf8(s: str) -> bytes:
    """SQuAD's first two steps (lower case, punctuation dropped), as UTF-8 (lone surrogates passed through).

    The punctuation is ASCII and no byte of a multi-byte UTF-8 character is, so deleting those bytes from the
    UTF-8 text drops exactly SQuAD's characters; ASCII text is lower-cased in the same pass (2.5-4x a regex
    character class on Wikipedia passages)."""
    if s.isascii():
        return s.encode("ascii").translate(_ASCII_LOWER, _PUNCT_BYTES)
    return s.lower().encode("utf-8", "surrogatepass").translate(None, _PUNCT_BYTES)


_ARTICLE_WORDS = frozenset({"a", "an", "the"})


def _words_without_articles(s: str) -> str:
    """SQuAD's last two steps: the articles dropped, white space collapsed.

    Where every word is letters and digits only (what ``str.isalnum`` and the regex's ``\\w`` both accept), the
    regex's ``\\b(a|an|the)\\b`` can match only a whole word, so the words equal to an article are dropped
    without it (the regex was most of normalising a passage); any other word takes SQuAD's regex."""
    words = s.split()
    if "".join(words).isalnum():
        return " ".join(w for w in words if w not in _ARTICLE_WORDS)
    return " ".join(_ARTICLES.sub(" ", s).split())


@dataclass(frozen=True)
class NormalizedGolds:
    """Gold answers normalised once for many gold checks (an episode's search turns): each non-empty one as
    text, and its words as UTF-8 for the check that rules most passages out."""

    answers: tuple[str, ...]
    words: tuple[tuple[bytes, ...], ...]


def normalized_golds(answers: Iterable[str]) -> NormalizedGolds:
    texts = tuple(n for n in map(normalize_answer, answers) if n)
    return NormalizedGolds(texts, tuple(tuple(w.encode("utf-8", "surrogatepass") for w in n.split()) for n in texts))


def contains_gold(text: str, golds: NormalizedGolds) -> bool:
    """Whether some gold answer, normalised, is a run of whole words of ``normalize_answer(text)``.

    Every word of such an answer is a substring of ``text`` lower-cased without punctuation (in UTF-8, as
    in text: no character's bytes start inside another's), so an answer with a word missing there is ruled
    out before the articles and spaces are normalised: on a search turn most passages hold no gold answer,
    and the full normalisation of each was most of ``SearchQA.step``."""
    return _contains_gold(_unpunctuated_utf8(text), golds)


def any_contains_gold(texts: Sequence[str], golds: NormalizedGolds) -> bool:
    """Whether some text of ``texts`` passes :func:`contains_gold`. An answer with a word in none of them is
    ruled out for all at once (one pass over the texts joined), so most search turns read their passages once."""
    if not golds.answers or not texts:
        return False
    bares = [_unpunctuated_utf8(t) for t in texts]
    joined = b"\n".join(bares)
    if not any(all(w in joined for w in words) for words in golds.words):
        return False
    return any(_contains_gold(b, golds) for b in bares)


def _contains_gold(bare: bytes, golds: NormalizedGolds) -> bool:
    hay = None
    for answer, words in zip(golds.answers, golds.words, strict=True):
        if all(w in bare for w in words):
            if hay is None:  # normalised only once some answer's words are all there
                hay = f" {_words_without_articles(bare.decode('utf-8', 'surrogatepass'))} "
            if f" {answer} " in hay:
                return True
    return False


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
