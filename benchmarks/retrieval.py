"""Retrieval figures on the embedded default corpus:
- index build time (write the deduplicated collection, then Anserini indexing);
- batch search throughput through turngym's retriever vs raw Anserini SimpleSearcher.batch_search
  with the same threads (goal >= 0.9x), interleaved repeats;
- service throughput: queries per second through `/retrieve` from concurrent loopback clients.
Usage: python benchmarks/retrieval.py [--queries 2000] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from turngym.corpora.corpus import default_passages, write_collection
from turngym.corpora.datasets import load_dataset
from turngym.corpora.lucene import LuceneRetriever, build_index, jvm
from turngym.corpora.service import RetrievalServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--index", default=None, help="reuse this index of the default corpus (skips the build figure)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="turngym-bench-"))
    if args.index:
        (tmp / "index").symlink_to(Path(args.index).resolve())
    else:
        start = time.perf_counter()
        n = write_collection(default_passages(), tmp / "collection")
        collect_s = time.perf_counter() - start
        index_s = build_index(tmp / "collection", tmp / "index", threads=args.threads)
        print(f"default corpus: {n} passages; collection {collect_s:.1f} s + Anserini index {index_s:.1f} s")

    queries = [it["question"] for it in load_dataset("nq").items[: args.queries]]
    retriever = LuceneRetriever(tmp / "index")
    raw = retriever.raw_searcher()
    jlist = jvm().autoclass("java.util.ArrayList")
    jq, jid = jlist(), jlist()
    for i, q in enumerate(queries):
        jq.add(" ".join(q.split()))
        jid.add(str(i))
    retriever.batch_search(queries[:50], 3, args.threads)  # warm-up
    ours, bare, read = [], [], []
    for _ in range(args.repeats):  # interleaved arms
        t = time.perf_counter()
        raw.batch_search(jq, jid, 3, args.threads)  # hits stay in Java: the bare Anserini cost
        bare.append(time.perf_counter() - t)
        t = time.perf_counter()
        res = raw.batch_search(jq, jid, 3, args.threads)  # what a Pyserini user must do to use the hits
        _ = [[(h.docid, h.score, h.lucene_document.get("raw")) for h in res.get(str(i))] for i in range(len(queries))]
        read.append(time.perf_counter() - t)
        t = time.perf_counter()
        retriever.batch_search(queries, 3, args.threads)  # hits parsed into turngym Hit records
        ours.append(time.perf_counter() - t)
    q = {name: len(queries) / statistics.median(v) for name, v in (("ours", ours), ("bare", bare), ("read", read))}
    print(f"batch search, {len(queries)} NQ queries, top-3, {args.threads} threads: turngym {q['ours']:.0f} q/s; "
          f"raw SimpleSearcher.batch_search {q['bare']:.0f} q/s (hits left in Java), "
          f"{q['read']:.0f} q/s (docid/score/raw read into Python)")
    print(f"ratio vs hits left in Java: {q['ours'] / q['bare']:.2f}x; vs hits read into Python: {q['ours'] / q['read']:.2f}x")
    print("per-repeat ratio turngym/raw: " + ", ".join(f"{b / o:.2f}" for o, b in zip(ours, bare, strict=True)))

    server = RetrievalServer(str(tmp / "index"), port=0, threads=args.threads)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    batch = 16

    def client(i: int) -> int:
        with httpx.Client(timeout=60) as c:
            qs = queries[i * batch:(i + 1) * batch]
            r = c.post(url, json={"queries": qs, "topk": 3, "return_scores": True})
            r.raise_for_status()
            return len(qs)

    n_req = len(queries) // batch
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=32) as pool:
        done = sum(pool.map(client, range(n_req)))
    wall = time.perf_counter() - t
    print(f"service: {n_req} requests x {batch} queries from 32 concurrent clients: {done / wall:.0f} q/s, "
          f"{n_req / wall:.1f} requests/s")
    server.shutdown()


if __name__ == "__main__":
    main()
