"""Retrieval figures on the embedded default corpus:
- index build time (write the deduplicated collection, then Anserini indexing);
- batch search throughput through turngym's retriever vs raw Anserini SimpleSearcher.batch_search
  with the same threads (goal >= 0.9x), interleaved repeats, by wall time and by process CPU time
  (steadier on a shared machine);
- a search turn: ``SearchQA.step`` vs a bare ``LuceneRetriever.search`` of the same query (goal >= 0.8x);
- service throughput: queries per second through `/retrieve` from concurrent loopback clients.
Usage: python benchmarks/retrieval.py [--queries 2000] [--threads 2] [--repeats 5] [--index DIR] [--fetch auto]
       [--distinct-hits]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from turngym.corpora.corpus import default_passages, write_collection
from turngym.corpora.datasets import QA_DATASETS, load_dataset
from turngym.corpora.lucene import LuceneRetriever, build_index, jvm
from turngym.corpora.service import RetrievalServer


def distinct_hit_queries(retriever: LuceneRetriever, n: int, threads: int) -> list[str]:
    """Up to n questions (NQ first, then the other bundled QA sets) whose top-3 passages no other
    chosen question finds: the workload where no passage repeats within a batch."""
    pool = [it["question"] for name in QA_DATASETS for it in load_dataset(name).items]
    seen: set[str] = set()
    chosen = []
    for q, hits in zip(pool, retriever.batch_search(pool, 3, threads), strict=True):
        ids = {h.docid for h in hits}
        if len(ids) == 3 and not ids & seen:
            chosen.append(q)
            seen |= ids
            if len(chosen) == n:
                break
    return chosen


def step_vs_search(retriever: LuceneRetriever, queries: list[str], repeats: int) -> float:
    """Per search turn: ``SearchQA.step`` on a search action (the search, the passages formatted, the gold check,
    the turn recorded) against the bare ``retriever.search`` of the same query; only the calls are timed (an
    episode of 3 searches is reset between, untimed), arms interleaved in a fresh order each repeat."""
    from turngym.envs.search_qa import SearchQAEnv

    env = SearchQAEnv(dataset="nq", max_turns=4, retriever=retriever)  # the same open index in both arms
    clock = time.perf_counter

    def bare() -> float:
        total = 0.0
        for q in queries:
            t = clock()
            retriever.search(q, env.topk)
            total += clock() - t
        return total

    def step() -> float:
        total = 0.0
        for i, q in enumerate(queries):
            if i % 3 == 0:
                env.reset(options={"index": i % env.num_items()})
            t = clock()
            env.step(f"<search>{q}</search>")
            total += clock() - t
        return total

    arms = {"bare": bare, "step": step}
    times: dict[str, list[float]] = {name: [] for name in arms}
    for fn in arms.values():  # warm-up
        fn()
    order = random.Random(1)
    for _ in range(max(repeats, 5)):
        names = list(arms)
        order.shuffle(names)
        for name in names:
            times[name].append(arms[name]())
    b, st = statistics.median(times["bare"]), statistics.median(times["step"])
    print(f"search turn, {len(queries)} NQ queries, top-{env.topk}: bare search {b / len(queries) * 1e3:.3f} ms, "
          f"SearchQA.step {st / len(queries) * 1e3:.3f} ms; SearchQA.step vs bare search: {b / st:.2f}x")
    return b / st


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--index", default=None, help="reuse this index of the default corpus (skips the build figure)")
    ap.add_argument("--distinct-hits", action="store_true",
                    help="questions whose top-3 passages are all different (no passage repeats in the batch)")
    ap.add_argument("--fetch", default="auto", choices=["auto", "batch", "per-hit"],
                    help="how turngym's retriever reads hits (per-hit: the path without turngym's Java class)")
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

    retriever = LuceneRetriever(tmp / "index", fetch=args.fetch)
    if args.distinct_hits:
        queries = distinct_hit_queries(retriever, args.queries, args.threads)
    else:
        queries = [it["question"] for it in load_dataset("nq").items[: args.queries]]
    found = [h.docid for hits in retriever.batch_search(queries, 3, args.threads) for h in hits]
    repeated = len(found) - len(set(found))
    print(f"{len(queries)} queries; {repeated} of their top-3 hits repeat a passage found by an earlier query")
    raw = retriever.raw_searcher()
    jlist = jvm().autoclass("java.util.ArrayList")
    jq, jid = jlist(), jlist()
    for i, q in enumerate(queries):
        jq.add(" ".join(q.split()))
        jid.add(str(i))
    for _ in range(3):  # warm-up (the JIT compiles both paths)
        retriever.batch_search(queries, 3, args.threads)
        raw.batch_search(jq, jid, 3, args.threads)
    wall: dict[str, list[float]] = {"ours": [], "bare": [], "read": []}
    cpu: dict[str, list[float]] = {"ours": [], "bare": [], "read": []}

    def timed(name: str, fn) -> None:
        t, c = time.perf_counter(), time.process_time()  # process CPU: Python and every JVM thread
        fn()
        wall[name].append(time.perf_counter() - t)
        cpu[name].append(time.process_time() - c)

    def read_hits() -> None:  # what a Pyserini user must do to use the hits
        res = raw.batch_search(jq, jid, 3, args.threads)
        _ = [[(h.docid, h.score, h.lucene_document.get("raw")) for h in res.get(str(i))] for i in range(len(queries))]

    arms = {"bare": lambda: raw.batch_search(jq, jid, 3, args.threads),  # hits stay in Java: the bare Anserini cost
            "read": read_hits,
            "ours": lambda: retriever.batch_search(queries, 3, args.threads)}  # hits as turngym Hit records
    order = random.Random(0)
    for _ in range(args.repeats):  # interleaved arms, in a fresh order each repeat (no arm always follows another)
        names = list(arms)
        order.shuffle(names)
        for name in names:
            timed(name, arms[name])
    q = {name: len(queries) / statistics.median(v) for name, v in wall.items()}
    kind = "distinct-hit" if args.distinct_hits else "NQ"
    print(f"batch search, {len(queries)} {kind} queries, top-3, {args.threads} threads, fetch={retriever.fetch!r}: "
          f"turngym {q['ours']:.0f} q/s; raw SimpleSearcher.batch_search {q['bare']:.0f} q/s (hits left in Java), "
          f"{q['read']:.0f} q/s (docid/score/raw read into Python)")
    print(f"ratio vs hits left in Java: {q['ours'] / q['bare']:.2f}x; vs hits read into Python: {q['ours'] / q['read']:.2f}x")
    per_rep = [b / o for o, b in zip(wall["ours"], wall["bare"], strict=True)]
    print("per-repeat ratio turngym/raw (wall): " + ", ".join(f"{r:.2f}" for r in per_rep)
          + f"; median {statistics.median(per_rep):.2f}")
    per_cpu = [b / o for o, b in zip(cpu["ours"], cpu["bare"], strict=True)]
    c_ours, c_bare = statistics.median(cpu["ours"]), statistics.median(cpu["bare"])
    print(f"by process CPU time: turngym {c_ours * 1e3:.0f} ms, raw {c_bare * 1e3:.0f} ms per batch, "
          f"ratio {c_bare / c_ours:.2f}x; per repeat: " + ", ".join(f"{r:.2f}" for r in per_cpu))

    step_vs_search(retriever, queries[:300], args.repeats)

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
