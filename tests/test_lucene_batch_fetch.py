"""The streamed batch fetch (turngym's ``BatchHits`` Java class, one JNI call per chunk of queries) must give exactly the hits of
the per-hit path (Anserini's objects read one by one): ids, float scores, titles and texts, on
real Lucene indexes holding title/text documents, Search-R1 ``contents`` documents, documents
whose used fields are not strings, non-JSON stored documents (a TREC collection) and no stored
documents at all. Python's ``parse_raw`` reads every stored document on both paths."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from turngym.corpora.java_helper import compile_helper
from turngym.corpora.lucene import LuceneRetriever, RetrieverError, build_index, decode_hits, jvm

ROOT = Path(__file__).resolve().parents[1]

DOCS = [
    {"id": "a1", "contents": "\"Alpha Centauri\"\nalpha star system nearest", "title": "Alpha Centauri",
     "text": "alpha star system nearest"},
    {"id": "a2", "contents": "  \"Beta\u00a0\u2003\"  \nbeta star \u0001 ctrl \u0000 nul 😀 東京 \"q\" \\ back\ttab"},
    {"id": "a3", "contents": "no quotes title line without newline gamma star"},
    {"id": 7, "contents": "\"Numeric id\"\ndelta star with a numeric id"},
    {"id": "a5", "contents": "\"Null title\"\nepsilon star", "title": None, "text": "epsilon star text"},
    {"id": "a6", "contents": "\"Number text\"\nzeta star", "title": "Zeta", "text": 42},
    {"contents": "\"Nested\"\neta star", "id": "a7", "meta": {"x": [1, 2.5e3, True, None, {"y": "z"}], "e": ""}},
    {"id": "a8", "contents": "\"\"\"Quoted\"\"\"\ntheta star\nsecond line"},
    {"id": "a9", "contents": "\"Escapes\"\niota star \u2028 line sep \u0085 nel \U0001f642 / slash"},
    {"id": "a10", "contents": "\"Ctrl\"\nomega star", "title": "Ctrl \u0001 title", "text": "omega star \u0002\u0003 x"},
    {"id": "a11", "contents": "\"Every character\"\nexhaust star " + "".join(map(chr, range(1, 0xD800)))
     + "".join(map(chr, range(0xE000, 0x10000))) + " \U0001f642"},  # no character is left free in this one
] + [{"id": f"f{i}", "contents": f"\"Filler {i}\"\nstar filler number {i} kappa"} for i in range(30)]

QUERIES = ["alpha star", "beta star", "gamma star", "delta star", "epsilon star", "zeta star", "eta star",
           "theta star", "iota star", "star", "", "   ", "zzzz-no-match", "東京", "kappa filler 3", "😀 beta"]


@pytest.fixture(scope="module")
def json_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("batchfetch")
    (root / "coll").mkdir()
    (root / "coll" / "docs.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in DOCS),
                                              encoding="utf-8")
    build_index(root / "coll", root / "index", threads=1)
    build_index(root / "coll", root / "noraw", threads=1, store_raw=False)
    return root


@pytest.fixture(scope="module")
def trec_index(tmp_path_factory):
    """A TREC collection: the stored raw documents are SGML, not JSON."""
    root = tmp_path_factory.mktemp("trec")
    (root / "coll").mkdir()
    docs = "".join(f"<DOC>\n<DOCNO>t{i}</DOCNO>\n<TEXT>\nlambda star {i} \"{i}\" {{not json}}\n</TEXT>\n</DOC>\n"
                   for i in range(5)) + "<DOC>\n<DOCNO>t5</DOCNO>\n<TEXT>\nmu only \x01 sep \x02 esc\n</TEXT>\n</DOC>\n"
    (root / "coll" / "docs.trec").write_text(docs, encoding="utf-8")
    jvm().autoclass("io.anserini.index.IndexCollection").main(
        ["-collection", "TrecCollection", "-input", str(root / "coll"), "-index", str(root / "index"),
         "-generator", "DefaultLuceneDocumentGenerator", "-threads", "1", "-storeRaw", "-quiet"])
    return root / "index"


def as_tuples(batch):
    return [[(h.docid, h.score, h.title, h.text) for h in hits] for hits in batch]


def both(index):
    fast, slow = LuceneRetriever(index, fetch="batch"), LuceneRetriever(index, fetch="per-hit")
    assert (fast.fetch, slow.fetch) == ("batch", "per-hit")
    return fast, slow


@pytest.mark.parametrize("k", [1, 3, 50])
def test_batch_fetch_equals_per_hit_on_json_documents(json_index, k):
    fast, slow = both(json_index / "index")
    got, want = as_tuples(fast.batch_search(QUERIES, k=k, threads=2)), as_tuples(slow.batch_search(QUERIES, k=k))
    assert got == want
    assert [len(h) for h in got][QUERIES.index("")] == 0 and len(got[QUERIES.index("star")]) == min(k, len(DOCS))
    for q, hits in zip(QUERIES, got, strict=True):
        if q.strip():
            assert as_tuples([fast.search(q, k)]) == as_tuples([slow.search(q, k)]) == [hits]
    by_id = {h[0]: h for hits in got for h in hits}
    if k == 50:  # the shapes this index holds, as the per-hit path reads them
        assert by_id["a1"][2:] == ("Alpha Centauri", "alpha star system nearest")
        assert by_id["a2"][2] == "Beta\u00a0\u2003" and "\u0001 ctrl \u0000 nul 😀 東京" in by_id["a2"][3]
        assert by_id["a3"][2:] == ("no quotes title line without newline gamma star", "")
        assert by_id["7"][2] == "Numeric id" and by_id["a5"][2] == "None" and by_id["a6"][3] == "42"
        assert by_id["a8"][2:] == ('""Quoted""', "theta star\nsecond line")  # one enclosing pair removed
        assert by_id["a10"][2:] == ("Ctrl \u0001 title", "omega star \u0002\u0003 x")  # not mistaken for separators
        assert by_id["a11"][3] == DOCS[-31]["contents"].partition("\n")[2]
        assert all(isinstance(h[1], float) for h in by_id.values())


def test_batch_fetch_equals_per_hit_without_stored_documents(json_index):
    fast, slow = both(json_index / "noraw")
    got = as_tuples(fast.batch_search(QUERIES, k=5))
    assert got == as_tuples(slow.batch_search(QUERIES, k=5))
    assert got[0] and all(h[2:] == ("", "") for hits in got for h in hits)


def test_batch_fetch_equals_per_hit_on_non_json_documents(trec_index):
    fast, slow = both(trec_index)
    got = as_tuples(fast.batch_search(["lambda star", "lambda 3"], k=10))
    assert got == as_tuples(slow.batch_search(["lambda star", "lambda 3"], k=10))
    assert len(got[0]) == 5 and got[1][0][0] == "t3" and got[1][0][2] == "" and "<TEXT>" in got[1][0][3]


def test_batch_fetch_scores_are_anserinis_floats_on_many_queries(json_index):
    """Every score equals Anserini's float exactly (no decimal rounding on the way)."""
    fast = LuceneRetriever(json_index / "index", fetch="batch")
    queries = [f"star filler number {i} kappa" for i in range(30)] + ["alpha", "nearest system"]
    got = fast.batch_search(queries, k=10)
    for q, hits in zip(queries, got, strict=True):
        assert [(h.docid, h.score) for h in hits] == [(h.docid, float(h.score))
                                                      for h in fast.raw_searcher().search(q, 10)]


def test_streamed_chunks_come_back_in_query_order(json_index, monkeypatch):
    """Java's workers finish chunks out of order; Python still gets every query's hits in place."""
    import turngym.corpora.lucene as lucene

    fast, slow = both(json_index / "index")
    queries = [f"{q} {i % 7}".strip() if i % 5 else q for i, q in enumerate(QUERIES * 25)]  # 400, empties included
    want = as_tuples(slow.batch_search(queries, k=4))
    assert lucene.stream_chunk(len(queries)) == 64 and lucene.stream_chunk(16_000) == 1000
    for threads in (1, 3):
        assert as_tuples(fast.batch_search(queries, k=4, threads=threads)) == want
    monkeypatch.setattr(lucene, "stream_chunk", lambda n: 1)  # one JNI hand-over per query
    assert as_tuples(fast.batch_search(queries[:50], k=4, threads=2)) == want[:50]


def test_a_query_anserini_refuses_is_one_error_and_the_retriever_goes_on(json_index, monkeypatch):
    """Lucene refuses a query of over 1,024 distinct terms; in a worker thread or in the first query
    (searched on the caller's thread) it is one RetrieverError, and the next batch is answered."""
    import turngym.corpora.lucene as lucene

    fast, slow = both(json_index / "index")
    monkeypatch.setattr(lucene, "MAX_QUERY_WORDS", 5000)
    huge = " ".join(f"w{i}" for i in range(1500))
    for queries in (["alpha star"] * 150 + [huge] + ["beta star"] * 150, [huge, "alpha star"]):
        with pytest.raises(RetrieverError, match="batch search failed: .*TooManyClauses"):
            fast.batch_search(queries, k=3, threads=2)
    assert as_tuples(fast.batch_search(QUERIES, k=3, threads=2)) == as_tuples(slow.batch_search(QUERIES, k=3))


def batchhits_threads():
    threads = jvm().autoclass("java.lang.Thread").getAllStackTraces().keySet().toArray()
    return [t for t in threads if t.getName().startswith("turngym-batchhits-")]


def test_a_batch_given_up_on_stops_its_workers(json_index, batch_hits):
    fast = LuceneRetriever(json_index / "index", fetch="batch")
    pending = batch_hits.start(fast.raw_searcher(), ["alpha star"] * 200_000, 3, 2, 10)
    first = pending.next()
    assert batchhits_threads()  # still searching
    pending.close()  # Python walked away after one chunk: the workers stop, the searcher still serves
    assert [hits[0].docid for hits in decode_hits(first, 10)] == ["a1"] * 10
    deadline = time.monotonic() + 30
    while batchhits_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not batchhits_threads()
    with pytest.raises(jvm().JavaException, match="closed"):
        pending.next()  # refuses, never hangs
    assert [h.docid for h in fast.batch_search(["alpha star"], k=1)[0]] == ["a1"]


def test_an_error_while_decoding_closes_the_batch(json_index, monkeypatch):
    """Python stops reading after an error: the retriever closes the batch, so Java stops searching."""
    import turngym.corpora.lucene as lucene

    fast = LuceneRetriever(json_index / "index", fetch="batch")
    calls = []

    def failing(*args):
        calls.append(1)
        raise RuntimeError("decoding failed")

    monkeypatch.setattr(lucene, "decode_hits", failing)
    monkeypatch.setattr(lucene, "stream_chunk", lambda n: 10)  # the first chunk comes at once
    with pytest.raises(RuntimeError, match="decoding failed"):
        fast.batch_search(["alpha star"] * 200_000, k=3, threads=2)
    assert calls == [1]
    deadline = time.monotonic() + 30
    while batchhits_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not batchhits_threads()


@pytest.mark.parametrize("fetch", ["batch", "per-hit"])
def test_bad_k_and_unusable_queries_get_one_clear_message(json_index, fetch):
    r = LuceneRetriever(json_index / "index", fetch=fetch)
    for k in (0, -1, True, 1.5, "3", None):
        with pytest.raises(ValueError, match="k \\(hits per query\\) must be a whole number >= 1"):
            r.batch_search(["alpha star"], k=k)
        with pytest.raises(ValueError, match="k \\(hits per query\\)"):
            r.search("alpha star", k=k)
    with pytest.raises(ValueError, match="lone surrogate"):
        r.search("alpha \ud800 star")
    got = r.batch_search(["alpha \ud800 star", "alpha star", "\udfff"], k=1)
    assert [[h.docid for h in hits] for hits in got] == [[], ["a1"], []]


SIGNAL_OWNER = """
import ctypes, faulthandler
from turngym.corpora.lucene import LuceneRetriever

class SigAction(ctypes.Structure):  # glibc's struct sigaction starts with the handler
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]

class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]

libc = ctypes.CDLL(None)

def owner():  # the shared object whose function handles SIGSEGV now
    action, info = SigAction(), DlInfo()
    assert libc.sigaction(11, None, ctypes.byref(action)) == 0
    libc.dladdr(ctypes.c_void_p(action.handler), ctypes.byref(info))
    return (info.fname or b"?").decode().rsplit("/", 1)[-1]

r = LuceneRetriever(INDEX)
before = owner()
faulthandler.enable()  # as pytest, absl or torch elastic may do once turngym has started the JVM
after = owner()
print(before, after, faulthandler.is_enabled(), len(r.batch_search(["alpha star"] * 500, k=3, threads=2)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads glibc's sigaction")
def test_a_faulthandler_enabled_after_the_jvm_leaves_the_jvm_its_signal_handler(json_index):
    """The JVM raises SIGSEGV on purpose; had faulthandler taken the signal, such a process dies within
    seconds of searching. turngym turns faulthandler on before it starts the JVM, so a later enable()
    changes nothing."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"} | {"PYTHONPATH": str(ROOT)}
    code = SIGNAL_OWNER.replace("INDEX", repr(str(json_index / "index")))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["libjvm.so", "libjvm.so", "True", "500"]


RAY_AFTER_THE_JVM = SIGNAL_OWNER.split("r = LuceneRetriever")[0] + """
from turngym.run.backends.ray_pool import init_ray
import ray
r = LuceneRetriever(INDEX)
init_ray(num_cpus=1, include_dashboard=False, log_to_driver=False)
during = owner()
ray.shutdown()
print(during, owner(), len(r.batch_search(["alpha star"] * 500, k=3, threads=2)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads glibc's sigaction")
def test_ray_started_and_stopped_beside_the_jvm_leaves_the_jvm_its_signal_handler(json_index):
    """Plain ``ray.init`` takes SIGSEGV for its own handler and ``ray.shutdown`` resets it to the default:
    a process that searched and then ran the Ray pool died at its next search (exit 139, no message)."""
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONFAULTHANDLER", "RAY_ADDRESS")}
    code = RAY_AFTER_THE_JVM.replace("INDEX", repr(str(json_index / "index")))
    proc = subprocess.run([sys.executable, "-c", code], env=env | {"PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-3:] == ["libjvm.so", "libjvm.so", "500"]


# ----------------------------------------------------------------------------- the escaped form

def test_a_stored_document_holding_the_separator_is_sent_escaped(trec_index, batch_hits):
    """A stored document that holds BatchHits' separator or escape character (possible outside JSON)
    goes through the escaped form and reads back exactly as the per-hit path reads it."""
    fast, slow = both(trec_index)
    chunk = batch_hits.searchOne(fast.raw_searcher(), "mu", 3)
    assert chunk.startswith("\x02")  # the escaped form
    got = fast.search("mu", 3)
    assert as_tuples([got]) == as_tuples([slow.search("mu", 3)])
    assert "\x01" in got[0].text and "\x02" in got[0].text


# ----------------------------------------------------------------------------- without a compiler

def test_no_javac_gives_a_reason_and_the_per_hit_path_says_so(json_index, tmp_path):
    env = {**os.environ, "TURNGYM_CACHE": str(tmp_path / "cache"), "PATH": str(Path(sys.executable).parent),
           "PYTHONPATH": str(ROOT)}
    code = ("import logging, sys; logging.basicConfig()\n"
            "from turngym.corpora.lucene import LuceneRetriever, RetrieverError\n"
            f"r = LuceneRetriever({str(json_index / 'index')!r}); r2 = LuceneRetriever({str(json_index / 'index')!r})\n"
            "print(r.fetch, r2.fetch, r.batch_search(['alpha star'], 1)[0][0].docid)\n"
            "try:\n"
            f"    LuceneRetriever({str(json_index / 'index')!r}, fetch='batch')\n"
            "except RetrieverError as e:\n"
            "    print('refused:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "per-hit per-hit a1"
    assert lines[1].startswith("refused: fetch='batch' needs turngym's BatchHits class: no javac on PATH")
    assert proc.stderr.count("fetch='per-hit'") == 1 and "no javac on PATH" in proc.stderr


def test_compiled_class_is_cached_by_source(tmp_path, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path))
    assert compile_helper(javac=str(tmp_path / "no-such-javac")).classpath is None
    first = compile_helper()
    assert first.classpath and first.classpath.startswith(str(tmp_path))
    cls = Path(first.classpath, "turngym", "lucene", "BatchHits.class")
    stamp = cls.stat().st_mtime_ns
    assert compile_helper(javac=str(tmp_path / "no-such-javac")) == first and cls.stat().st_mtime_ns == stamp
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path / "a-file"))  # a cache that cannot be written
    assert "cannot write the BatchHits build" in compile_helper().reason


def test_fetch_must_be_a_known_mode(json_index):
    with pytest.raises(ValueError, match="fetch must be one of"):
        LuceneRetriever(json_index / "index", fetch="fast")
    with pytest.raises(RetrieverError, match="not found"):
        LuceneRetriever(json_index / "missing", fetch="batch")
