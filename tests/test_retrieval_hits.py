"""turngym's hits must equal what Anserini's own objects say, hit by hit (ids, float32 scores,
stored raw documents with quotes, backslashes and non-BMP text), single and batch search,
on a real Lucene index."""


import pytest

from turngym.corpora.lucene import LuceneRetriever, jvm, parse_raw

PASSAGES = [
    {"id": "p1", "title": "Scott Derrickson", "text": "Scott Derrickson is an American director born in Denver."},
    {"id": "p2", "title": "Ed Wood", "text": "Edward Davis Wood Jr. was an American filmmaker and actor."},
    {"id": "p3", "title": "Paris", "text": "Paris is the capital and most populous city of France."},
    {"id": "p4", "title": "Berlin", "text": "Berlin is the capital of Germany; \"quotes\" \\ backslash\ttab."},
    {"id": "p5", "title": "東京", "text": "東京 は 日本 の 首都 です。 Tokyo is the capital of Japan. 🙂"},
] + [{"id": f"x{i}", "title": f"Filler {i}", "text": f"capital city number {i} of some country {i % 7}"} for i in range(40)]

QUERIES = ["capital of France", "Tokyo Japan", "American director", "capital city country 3", "",
           "zzzz-no-match", "Berlin backslash quotes", "東京"]


@pytest.fixture(scope="module")
def retriever(lucene_index):
    return LuceneRetriever(lucene_index(PASSAGES))


def anserini_hits(retriever, query, k):
    """The hits read object by object from Anserini's own ScoredDoc array (the reference)."""
    if not query:
        return []
    out = []
    for h in retriever.raw_searcher().search(query, k):
        docid, title, text = parse_raw(h.lucene_document.get("raw"))
        out.append((docid, float(h.score), title, text))
    return out


@pytest.mark.parametrize("k", [1, 3, 10])
def test_batch_and_single_search_equal_anserini_hit_by_hit(retriever, k):
    batch = retriever.batch_search(QUERIES, k=k, threads=2)
    assert len(batch) == len(QUERIES)
    for q, hits in zip(QUERIES, batch, strict=True):
        expected = anserini_hits(retriever, q, k)
        got = [(h.docid, h.score, h.title, h.text) for h in hits]
        assert got == expected
        if q:
            assert [(h.docid, h.score, h.title, h.text) for h in retriever.search(q, k)] == expected
    assert any(len(h) == k for h in batch) and batch[QUERIES.index("")] == []
    assert batch[0][0].docid == "p3" and "🙂" in next(h.text for h in batch[1] if h.docid == "p5")


def test_raw_batch_search_agrees_with_turngyms_batch_search(retriever):
    jl = jvm().autoclass("java.util.ArrayList")
    qs, ids = jl(), jl()
    for i, q in enumerate(QUERIES):
        if q:
            qs.add(q)
            ids.add(str(i))
    raw = retriever.raw_searcher().batch_search(qs, ids, 3, 1)
    ours = retriever.batch_search(QUERIES, k=3)
    for i, q in enumerate(QUERIES):
        ref = [(h.docid, float(h.score)) for h in (raw.get(str(i)) or [])] if q else []
        assert [(h.docid, h.score) for h in ours[i]] == ref


def test_concurrent_batch_searches_from_threads_get_their_own_hits(retriever):
    """The retrieval service searches from a thread pool: every thread must get its own batch's hits."""
    from concurrent.futures import ThreadPoolExecutor

    batches = [QUERIES[i:] + QUERIES[:i] for i in range(len(QUERIES))]
    expected = [[[(h.docid, h.score) for h in hits] for hits in retriever.batch_search(b, k=3)] for b in batches]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(5):
            got = list(pool.map(lambda b: [[(h.docid, h.score) for h in hits] for hits in retriever.batch_search(b, k=3)],
                                batches * 4))
            assert got == expected * 4
