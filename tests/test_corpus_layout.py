"""The stored document layout: Search-R1's ``{"id", "contents"}`` only, read back to the exact
(title, text) it was written from by every reader (``split_contents``, ``parse_raw`` and the Java
``BatchHits`` reader), including titles that start or end with a double quote."""

import json

import pytest

from turngym.corpora.corpus import _key, default_passages, split_contents, write_collection
from turngym.corpora.lucene import LuceneRetriever, jvm, parse_raw

EDGE_PASSAGES = [
    {"id": "q1", "title": '"Weird Al" Yankovic', "text": "weird al parody musician accordion"},
    {"id": "q2", "title": 'The song "Heroes"', "text": "heroes song bowie berlin accordion"},
    {"id": "q3", "title": '"', "text": "lone quote title accordion"},
    {"id": "q4", "title": '""', "text": "two quotes title accordion"},
    {"id": "q5", "title": "Plain", "text": "plain title accordion\nsecond line"},
    {"id": "q6", "title": "Two\nlines", "text": "a title with a line break accordion"},
    {"id": "q7", "title": "", "text": "an empty title accordion"},
]


@pytest.fixture(scope="module")
def batch_hits():
    return jvm().autoclass("turngym.lucene.BatchHits")


def java_parse(batch_hits, raw):
    got = batch_hits.parseRaw(raw)
    return None if got is None else (got[0], got[1], got[2])


@pytest.mark.parametrize("contents, want", [
    ('"Title"\ntext', ("Title", "text")),
    ('""Weird Al" Yankovic"\nx', ('"Weird Al" Yankovic', "x")),  # strip('"') would lose the inner quote
    ('"""Quoted"""\nx', ('""Quoted""', "x")),
    ('  "T"  \nx\ny', ("T", "x\ny")),
    ('No quotes\nx', ("No quotes", "x")),
    ('"\nx', ('"', "x")),
    ('"T"', ("T", "")),
])
def test_split_contents_removes_one_enclosing_pair(batch_hits, contents, want):
    assert split_contents(contents) == want
    raw = json.dumps({"id": "d", "contents": contents})
    assert parse_raw(raw) == ("d", *want)
    assert java_parse(batch_hits, raw) == ("d", *want)


def written(passages, tmp_path):
    n = write_collection(passages, tmp_path)
    docs = [json.loads(line) for f in sorted(tmp_path.glob("*.jsonl")) for line in f.open(encoding="utf-8")]
    assert len(docs) == n
    return docs


def test_write_collection_stores_contents_only(tmp_path, batch_hits):
    docs = written(EDGE_PASSAGES, tmp_path)
    for p, d in zip(EDGE_PASSAGES, docs, strict=True):
        assert d["contents"] == f"\"{p['title']}\"\n{p['text']}"
        # a title with a line break cannot ride on contents' first line: the fields stay for it alone
        assert set(d) == ({"id", "contents", "title", "text"} if "\n" in p["title"] else {"id", "contents"})
        raw = json.dumps(d, ensure_ascii=False)
        assert parse_raw(raw) == (p["id"], p["title"], p["text"])
        assert java_parse(batch_hits, raw) == (p["id"], p["title"], p["text"])


def test_every_default_passage_reads_back_the_same(tmp_path, batch_hits):
    """The default corpus through the contents-only layout gives what the old title/text layout gave."""
    passages, seen = [], set()
    for p in default_passages():  # deduplicated as write_collection does, so the two lists align
        if p["text"] and _key(p) not in seen:
            seen.add(_key(p))
            passages.append(p)
    docs = written(passages, tmp_path)
    for p, d in zip(passages, docs, strict=True):
        old = json.dumps({**d, "title": p["title"], "text": p["text"]}, ensure_ascii=False)
        new = json.dumps(d, ensure_ascii=False)
        want = (d["id"], p["title"], p["text"])
        assert parse_raw(old) == parse_raw(new) == want
        assert java_parse(batch_hits, new) == want


@pytest.mark.parametrize("fetch", ["batch", "per-hit"])
def test_search_returns_exact_quoted_titles(lucene_index, fetch):
    r = LuceneRetriever(lucene_index(EDGE_PASSAGES), fetch=fetch)
    hits = r.batch_search(["accordion"], k=len(EDGE_PASSAGES), threads=1)[0]
    got = {h.docid: (h.title, h.text) for h in hits}
    assert got == {p["id"]: (p["title"], p["text"]) for p in EDGE_PASSAGES}
    assert {h.docid: h.contents for h in hits} == {p["id"]: f"\"{p['title']}\"\n{p['text']}" for p in EDGE_PASSAGES}
