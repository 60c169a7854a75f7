"""Dense and hybrid retrieval figures on the embedded corpus and the seven QA sets' shipped subsets:

1. answer recall@1/3/10 (a gold answer in one of the top k passages, the env's ``retrieval_hit`` test) for BM25,
   dense and hybrid (RRF of the two top-50 rankings, as ``HybridRetriever``) side by side, per QA set;
2. queries/s, batch and per turn (one query a call), of turngym's ``DenseRetriever`` against a plain FAISS flat
   search of the same vectors (the same model called bare: tokenizer, model, masked mean, ``IndexFlatIP.search``,
   passages from a Python list), and against Search-R1's retrieval server logic on the same index (its
   ``Encoder`` and ``DenseRetriever._batch_search`` transcribed for CPU: ``.cuda()`` dropped, corpus through
   ``datasets``); and the search stage alone (query vectors given);
3. encode throughput (passages/s) of the index build on a sample of the corpus;
4. memory per million passages (measured file sizes) and the cost at wiki-18 scale (21M passages), on paper.

The machine may be shared: every arm runs interleaved, repeated, and the figures are read as ratios; the load
average is printed before and after.
Usage: python benchmarks/dense_retrieval.py [--bm25 DIR] [--dense DIR] [--per-set N] [--speed-queries 128]
       [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

import numpy as np

from turngym.corpora.corpus import default_index_dir
from turngym.corpora.datasets import load_dataset
from turngym.corpora.dense import DenseRetriever, HybridRetriever, default_dense_index_dir
from turngym.corpora.lucene import LuceneRetriever
from turngym.corpora.subsets import SEARCHQA_EVAL_DATASETS
from turngym.envs.search_qa import contains_answer

KS = (1, 3, 10)
DEPTH = 50
WIKI18 = 21_015_324  # passages in DPR's wiki-18 dump (psgs_w100)


def load_avg() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def recall_table(bm25: LuceneRetriever, dense: DenseRetriever, per_set: int | None) -> None:
    hybrid = HybridRetriever(bm25, dense, depth=DEPTH)
    print(f"\nanswer recall@k (a gold answer in the top k; hybrid = RRF over each system's top {DEPTH})")
    print(f"{'set':<16}{'n':>5}  " + "  ".join(f"{m:>6}@{k:<2}" for m in ("bm25", "dense", "hybrid") for k in KS))
    totals: dict[str, list[float]] = {}
    n_all = 0
    for name in SEARCHQA_EVAL_DATASETS:
        items = load_dataset(f"subset:searchqa-eval-{name}").items[:per_set]
        qs, golds = [it["question"] for it in items], [[str(a) for a in it["answers"]] for it in items]
        sparse = bm25.batch_search(qs, DEPTH, 2)
        dense_rows = dense.batch_search(qs, DEPTH)
        fused = [hybrid.fuse((s, d), max(KS)) for s, d in zip(sparse, dense_rows, strict=True)]
        row = []
        for rows in (sparse, dense_rows, fused):
            for k in KS:
                hit = [any(contains_answer(h.contents, g) for h in r[:k]) for r, g in zip(rows, golds, strict=True)]
                row.append(sum(hit) / len(hit))
        for i, v in enumerate(row):
            totals.setdefault(str(i), []).append(v * len(qs))
        n_all += len(qs)
        print(f"{name:<16}{len(qs):>5}  " + "  ".join(f"{v:>9.3f}" for v in row))
    print(f"{'all (pooled)':<16}{n_all:>5}  " + "  ".join(f"{sum(totals[str(i)]) / n_all:>9.3f}" for i in range(9)))


class PlainFlat:
    """The baseline: the same model called bare and a FAISS flat index of the same vectors, passages in a list."""

    def __init__(self, dense: DenseRetriever):
        import faiss
        import torch

        self.torch, self.enc = torch, dense.encoder
        vecs = dense.index.reconstruct_n(0, dense.index.ntotal)
        self.index = faiss.IndexFlatIP(vecs.shape[1])
        self.index.add(vecs)
        self.docs = [dense.doc(i) for i in range(dense.index.ntotal)]

    def vectors(self, qs: list[str]) -> np.ndarray:
        tok, model, torch = self.enc.tokenizer, self.enc.model, self.torch
        out = []
        for lo in range(0, len(qs), 64):
            inputs = tok(qs[lo:lo + 64], max_length=256, padding=True, truncation=True, return_tensors="pt")
            with torch.inference_mode():
                h = model(**inputs).last_hidden_state
                m = inputs["attention_mask"][..., None].to(h.dtype)
                out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy())
        return np.concatenate(out)

    def search(self, vecs: np.ndarray, k: int) -> list:
        s, idx = self.index.search(vecs, k)
        return [[(self.docs[i]["id"], float(x), self.docs[i]["contents"]) for x, i in zip(sr, ir, strict=True)]
                for sr, ir in zip(s, idx, strict=True)]

    def batch(self, qs: list[str], k: int) -> list:
        return self.search(self.vectors(qs), k)


class SearchR1Dense:
    """Search-R1's ``search_r1/search/retrieval_server.py`` dense path, transcribed for CPU: ``Encoder.encode``
    (e5-style prefixes only for e5 names; masked mean pooling; normalised unless DPR), ``index.search`` per
    batch of ``retrieval_batch_size`` (512), and ``load_docs`` (``corpus[int(idx)]`` from ``datasets``)."""

    def __init__(self, dense: DenseRetriever, model_name: str):
        import datasets
        import faiss
        import torch

        self.torch, self.model_name = torch, model_name
        self.index = faiss.read_index(str(Path(dense.index_dir) / "index"))
        datasets.disable_progress_bars()
        self.corpus = datasets.load_dataset("json", data_files=str(Path(dense.index_dir) / "docs.jsonl"), split="train")
        self.tokenizer, self.model = dense.encoder.tokenizer, dense.encoder.model
        self.batch_size = 512

    def encode(self, query_list: list[str]) -> np.ndarray:
        torch = self.torch
        if "e5" in self.model_name.lower():
            query_list = [f"query: {q}" for q in query_list]
        inputs = self.tokenizer(query_list, max_length=256, padding=True, truncation=True, return_tensors="pt")
        with torch.no_grad():
            output = self.model(**inputs, return_dict=True)
            last = output.last_hidden_state.masked_fill(~inputs["attention_mask"][..., None].bool(), 0.0)
            emb = last.sum(dim=1) / inputs["attention_mask"].sum(dim=1)[..., None]
            if "dpr" not in self.model_name.lower():
                emb = torch.nn.functional.normalize(emb, dim=-1)
        return emb.detach().cpu().numpy().astype(np.float32, order="C")

    def batch(self, query_list: list[str], num: int) -> list:
        results, scores = [], []
        for start in range(0, len(query_list), self.batch_size):
            batch = query_list[start:start + self.batch_size]
            s, idxs = self.index.search(self.encode(batch), k=num)
            flat = sum(idxs.tolist(), [])
            docs = [self.corpus[int(i)] for i in flat]
            results.extend(docs[i * num:(i + 1) * num] for i in range(len(batch)))
            scores.extend(s.tolist())
        return list(zip(results, scores, strict=True))


def speed(dense: DenseRetriever, queries: list[str], repeats: int, model_name: str) -> None:
    import faiss

    plain, r1 = PlainFlat(dense), SearchR1Dense(dense, model_name)
    per_turn_qs = queries[:32]
    vecs = dense.vectors(queries)
    arms = {
        "turngym batch": lambda: dense.batch_search(queries, 3),
        "plain flat batch": lambda: plain.batch(queries, 3),
        "Search-R1 batch": lambda: r1.batch(queries, 3),
        "turngym per-turn": lambda: [dense.search(q, 3) for q in per_turn_qs],
        "plain flat per-turn": lambda: [plain.batch([q], 3) for q in per_turn_qs],
        "Search-R1 per-turn": lambda: [r1.batch([q], 3) for q in per_turn_qs],
        "turngym search stage": lambda: dense.hits(*dense.search_vectors(vecs, 3)),
        "plain flat search stage": lambda: plain.search(vecs, 3),  # passages from a list already in memory
        "FAISS search alone": lambda: plain.index.search(vecs, 3),  # ids only: the floor
    }
    n = {name: (len(per_turn_qs) if "per-turn" in name else len(queries)) for name in arms}
    for fn in arms.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in arms}
    order = random.Random(0)
    for _ in range(repeats):
        names = list(arms)
        order.shuffle(names)
        for name in names:
            t = time.perf_counter()
            arms[name]()
            times[name].append(time.perf_counter() - t)
    qps = {name: n[name] / statistics.median(v) for name, v in times.items()}
    print(f"\nqueries/s (median of {repeats} interleaved repeats; {len(queries)} queries a batch, {len(per_turn_qs)} one "
          f"at a time; top-3; FAISS threads {faiss.omp_get_max_threads()})")
    for name, v in qps.items():
        print(f"  {name:<26}{v:>10.1f} q/s")
    for mode in ("batch", "per-turn", "search stage"):
        ours = qps[f"turngym {mode}"]
        line = f"  {mode}: turngym / plain flat = {ours / qps[f'plain flat {mode}']:.2f}x"
        if f"Search-R1 {mode}" in qps:
            line += f"; turngym / Search-R1 server logic = {ours / qps[f'Search-R1 {mode}']:.2f}x"
        print(line)


def encode_rate(dense: DenseRetriever, n: int) -> float:
    contents = [dense.doc(i)["contents"] for i in range(min(n, dense.index.ntotal))]
    dense.encoder.encode(contents[:64], "passage")
    t = time.perf_counter()
    dense.encoder.encode(contents, "passage")
    rate = len(contents) / (time.perf_counter() - t)
    print(f"\nindex build encoding: {rate:.1f} passages/s ({len(contents)} passages of the corpus, batch "
          f"{dense.encoder.batch_size}, {dense.manifest['encoder']['name']}, CPU, torch threads "
          f"{dense.encoder._torch.get_num_threads()})")
    return rate


def memory(dense: DenseRetriever, rate: float) -> None:
    path, m = Path(dense.index_dir), dense.manifest
    n, dim = m["count"], m["dim"]
    sizes = {name: (path / name).stat().st_size for name in ("index", "docs.jsonl", "docs.offsets.npy", "docid")}
    per_m = {name: s / n * 1e6 / 2**30 for name, s in sizes.items()}
    print(f"\nmemory per million passages (from this index: {n} passages, dim {dim}, {m['index_type']}):")
    for name, v in per_m.items():
        print(f"  {name:<18}{v:>7.2f} GiB")
    print("  (the index is read into RAM; docs.jsonl is memory-mapped, read a hit at a time)")
    e5 = 768 * 4 * WIKI18 / 2**30
    hnsw_links = 2 * 32 * 4 * WIKI18 / 2**30
    print(f"\nwiki-18 on paper ({WIKI18:,} passages): vectors {dim * 4 * WIKI18 / 2**30:.1f} GiB at dim {dim}, "
          f"{e5:.1f} GiB at e5-base's 768 (flat, as Search-R1's e5_Flat.index); HNSW32 adds about "
          f"{hnsw_links:.1f} GiB of links; passages {per_m['docs.jsonl'] * WIKI18 / 1e6:.1f} GiB on disk at this "
          f"corpus's mean length; encoding at this machine's {rate:.0f} passages/s: "
          f"{WIKI18 / rate / 86400:.1f} days on CPU (a GPU build is the way: Search-R1 builds on 8 GPUs)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bm25", default=None, help="BM25 index of the embedded corpus (default: the cached one)")
    ap.add_argument("--dense", default=None, help="dense index of the embedded corpus (default: the cached one)")
    ap.add_argument("--per-set", type=int, default=None, help="questions per QA set (default: the whole subset)")
    ap.add_argument("--speed-queries", type=int, default=128)
    ap.add_argument("--encode-passages", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="FAISS threads")
    args = ap.parse_args()
    print(f"load average (1/5/15 min) at start: {load_avg()} on {os.cpu_count()} cores")
    bm25 = LuceneRetriever(args.bm25 or default_index_dir())
    dense = DenseRetriever(args.dense or default_dense_index_dir(), threads=args.threads)
    print(f"dense index: {dense.manifest['count']} passages, {json.dumps(dense.manifest['encoder'])}")
    recall_table(bm25, dense, args.per_set)
    queries = [it["question"] for it in load_dataset("subset:searchqa-eval-nq").items[:args.speed_queries]]
    speed(dense, queries, args.repeats, dense.manifest["encoder"]["name"])
    memory(dense, encode_rate(dense, args.encode_passages))
    print(f"\nload average at end: {load_avg()}")


if __name__ == "__main__":
    main()
