"""Stored documents read back to the exact (title, text) they were written from by both readers
(``split_contents`` and ``parse_raw``), in turngym's layout
(``{"id", "contents", "title", "text"}``) and in Search-R1's (``{"id", "contents"}``), including
titles that start or end with a double quote."""

import json

import pytest

from turngym.corpora.corpus import _key, default_passages, write_collection
from turngym.corpora.lucene import LuceneRetriever, build_index, parse_raw, split_contents

EDGE_PASSAGES = [
    {"id": "q1", "title": '"Weird Al" Yankovic', "text": "weird al parody musician accordion"},
    {"id": "q2", "title": 'The song "Heroes"', "text": "heroes song bowie berlin accordion"},
    {"id": "q3", "title": '"', "text": "lone quote title accordion"},
    {"id": "q4", "title": '""', "text": "two quotes title accordion"},
    {"id": "q5", "title": "Plain", "text": "plain title accordion\nsecond line"},
    {"id": "q6", "title": "Two\nlines", "text": "a title with a line break accordion"},
    {"id": "q7", "title": "", "text": "an empty title accordion"},
]




@pytest.mark.parametrize("contents, want", [
    ('"Title"\ntext', ("Title", "text")),
    ('""Weird Al" Yankovic"\nx', ('"Weird Al" Yankovic', "x")),  # strip('"') would lose the inner quote
    ('"""Quoted"""\nx', ('""Quoted""', "x")),
    ('  "T"  \nx\ny', ("T", "x\ny")),
    ('No quotes\nx', ("No quotes", "x")),
    ('"\nx', ('"', "x")),
    ('"T"', ("T", "")),
])
def test_split_contents_removes_one_enclosing_pair(contents, want):
    assert split_contents(contents) == want
    raw = json.dumps({"id": "d", "contents": contents})
    assert parse_raw(raw) == ("d", *want)


def written(passages, tmp_path):
    n = write_collection(passages, tmp_path)
    docs = [json.loads(line) for f in sorted(tmp_path.glob("*.jsonl")) for line in f.open(encoding="utf-8")]
    assert len(docs) == n
    return docs


def contents_only(d):
    return {"id": d["id"], "contents": d["contents"]}


def test_written_documents_read_back_in_both_layouts(tmp_path):
    docs = written(EDGE_PASSAGES, tmp_path)
    for p, d in zip(EDGE_PASSAGES, docs, strict=True):
        assert d == {"id": p["id"], "contents": f"\"{p['title']}\"\n{p['text']}", "title": p["title"], "text": p["text"]}
        layouts = [d] if "\n" in p["title"] else [d, contents_only(d)]  # contents' first line cannot hold a line break
        for doc in layouts:
            raw = json.dumps(doc, ensure_ascii=False)
            assert parse_raw(raw) == (p["id"], p["title"], p["text"])


def test_every_default_passage_reads_back_the_same(tmp_path):
    """Every passage of the default corpus gives the same (title, text) from either layout."""
    passages, seen = [], set()
    for p in default_passages():  # deduplicated as write_collection does, so the two lists align
        if p["text"] and _key(p) not in seen:
            seen.add(_key(p))
            passages.append(p)
    docs = written(passages, tmp_path)
    for p, d in zip(passages, docs, strict=True):
        want = (d["id"], p["title"], p["text"])
        for doc in (d, contents_only(d)):
            raw = json.dumps(doc, ensure_ascii=False)
            assert parse_raw(raw) == want


@pytest.fixture(scope="module")
def contents_index(tmp_path_factory):
    """An index of Search-R1-form documents (``{"id", "contents"}``) with quote-edged titles."""
    root = tmp_path_factory.mktemp("contents")
    (root / "coll").mkdir()
    rows = [contents_only(d) for d in written(EDGE_PASSAGES, root / "w") if "\n" not in d["title"]]
    (root / "coll" / "docs.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                              encoding="utf-8")
    build_index(root / "coll", root / "index", threads=1)
    return root / "index"


@pytest.mark.parametrize("fetch", ["batch", "per-hit"])
@pytest.mark.parametrize("layout", ["turngym", "search-r1"])
def test_search_returns_exact_quoted_titles(lucene_index, contents_index, fetch, layout):
    want = [p for p in EDGE_PASSAGES if layout == "turngym" or "\n" not in p["title"]]
    r = LuceneRetriever(lucene_index(EDGE_PASSAGES) if layout == "turngym" else contents_index, fetch=fetch)
    hits = r.batch_search(["accordion"], k=len(EDGE_PASSAGES), threads=1)[0]
    assert {h.docid: (h.title, h.text) for h in hits} == {p["id"]: (p["title"], p["text"]) for p in want}
    assert {h.docid: h.contents for h in hits} == {p["id"]: f"\"{p['title']}\"\n{p['text']}" for p in want}
