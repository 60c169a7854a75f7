"""Retrieval service under load: latency of light requests while one heavy request runs,
the previous service (a ThreadingHTTPServer with one global search lock, kept below only for
this comparison) against the current one (uvicorn + Starlette, chunked searches in a thread
pool), side by side in one process over the default index of the embedded corpus.

Light request: 1 query, topk 3. Heavy request: ``--heavy-queries`` queries x topk 1000 (under
the new server's cap, so both serve it), sent back to back for the whole measurement.
Also: light latency with no heavy load, and throughput of many concurrent medium requests.
Usage: python benchmarks/retrieval_service.py [--heavy-queries 24] [--light 60] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np

from turngym.corpora.corpus import default_index_dir
from turngym.corpora.datasets import load_dataset
from turngym.corpora.lucene import Hit, LuceneRetriever
from turngym.corpora.service import RetrievalServer

# ----------------------------------------------------------------- the previous service (baseline only)


class _LegacyHandler(BaseHTTPRequestHandler):
    server: LegacyRetrievalServer

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, obj: Any) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        queries, topk = body["queries"], int(body.get("topk", 3))
        hits = self.server.search(queries, topk)
        result = [[{"document": {"id": h.docid, "contents": h.contents}, "score": h.score} for h in row]
                  for row in hits]
        self._reply(200, {"result": result})


class LegacyRetrievalServer(ThreadingHTTPServer):
    """turngym's service before this change: one thread per request, one global search lock."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, retriever: LuceneRetriever, threads: int = 2):
        self.retriever, self.threads, self._lock = retriever, threads, threading.Lock()
        super().__init__(("127.0.0.1", 0), _LegacyHandler)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import jnius

        try:
            with self._lock:
                return self.retriever.batch_search(queries, topk, self.threads)
        finally:
            jnius.detach()


# ----------------------------------------------------------------- measurement


def light_latencies(url: str, queries: list[str], n: int, max_s: float = float("inf")) -> list[float]:
    """Up to ``n`` light requests one after another, stopping after ``max_s`` seconds."""
    out = []
    end = time.perf_counter() + max_s
    with httpx.Client(timeout=300) as c:
        for i in range(n):
            if time.perf_counter() > end:
                break
            t = time.perf_counter()
            r = c.post(url, json={"queries": [queries[i % len(queries)]], "topk": 3, "return_scores": True})
            r.raise_for_status()
            out.append((time.perf_counter() - t) * 1000.0)
    return out


def under_heavy(url: str, queries: list[str], heavy_queries: int, n_light: int, max_s: float) -> dict[str, Any]:
    """Heavy requests back to back in one client; light ones from another, counted only while a heavy one runs."""
    stop, heavy_s, running = threading.Event(), [], threading.Event()
    heavy_body = {"queries": [f"{q} history war" for q in queries[:heavy_queries]], "topk": 1000}

    def heavy_loop() -> None:
        with httpx.Client(timeout=600) as c:
            while not stop.is_set():
                running.set()
                t = time.perf_counter()
                c.post(url, json=heavy_body).raise_for_status()
                heavy_s.append(time.perf_counter() - t)

    th = threading.Thread(target=heavy_loop)
    th.start()
    running.wait()
    time.sleep(0.2)
    lat = light_latencies(url, queries[100:], n_light, max_s)
    stop.set()
    th.join()
    return {"light_ms": lat, "heavy_s": heavy_s}


def idle_connections(url: str, address: tuple[str, int], n: int, timeout_s: float = 30.0) -> tuple[float, float]:
    """Light-request latency (ms) with ``n`` idle connections open, then right after they all close
    together; a request that gets no answer within ``timeout_s`` counts as ``inf``."""
    import socket

    def timed() -> float:
        t = time.perf_counter()
        try:
            httpx.post(url, json={"queries": ["capital of France"], "topk": 3}, timeout=timeout_s).raise_for_status()
        except httpx.HTTPError:
            return float("inf")
        return (time.perf_counter() - t) * 1000.0

    socks = [socket.create_connection(address, timeout=10) for _ in range(n)]
    time.sleep(0.5)
    with_open = timed()
    for s in socks:
        s.close()
    return with_open, timed()


def throughput(url: str, queries: list[str], batch: int = 16, clients: int = 32) -> float:
    def client(i: int) -> int:
        with httpx.Client(timeout=120) as c:
            qs = queries[i * batch:(i + 1) * batch]
            c.post(url, json={"queries": qs, "topk": 3}).raise_for_status()
            return len(qs)

    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        done = sum(pool.map(client, range(len(queries) // batch)))
    return done / (time.perf_counter() - t)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heavy-queries", type=int, default=24, help="queries in the heavy request (topk 1000)")
    ap.add_argument("--light", type=int, default=60, help="light requests measured per arm")
    ap.add_argument("--max-seconds", type=float, default=45.0, help="time bound on the loaded light requests per arm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--throughput-queries", type=int, default=1024)
    ap.add_argument("--idle", type=int, default=3000, help="idle connections opened, then closed together")
    args = ap.parse_args()
    index = str(default_index_dir())
    queries = [it["question"] for it in load_dataset("nq").items[:2000]]

    new = RetrievalServer(index, port=0, threads=args.threads).start()
    old = LegacyRetrievalServer(new.retriever, threads=args.threads)  # the same searcher: only the service differs
    threading.Thread(target=old.serve_forever, daemon=True).start()
    arms = {"old": f"http://127.0.0.1:{old.server_address[1]}/retrieve", "new": f"{new.url}/retrieve"}
    try:
        for url in arms.values():  # warm-up
            light_latencies(url, queries, 20)
        rows = {}
        for name, url in arms.items():
            idle = light_latencies(url, queries, args.light)
            loaded = under_heavy(url, queries, args.heavy_queries, args.light, args.max_seconds)
            address = ("127.0.0.1", int(url.split(":")[2].split("/")[0]))
            rows[name] = {"idle": idle, **loaded, "qps": throughput(url, queries[: args.throughput_queries]),
                          "conns": idle_connections(url, address, args.idle)}
    finally:
        old.shutdown()
        old.server_close()
        new.shutdown()
        new.server_close()

    print(f"default index; light = 1 query top-3; heavy = {args.heavy_queries} queries x top-1000, back to back; "
          f"{args.threads} search threads")
    print(f"{'':28s}{'old (global lock)':>20s}{'new (uvicorn, chunked)':>26s}{'old/new':>10s}")  # ms/s: >1 = new faster

    def line(label: str, a: float, b: float, unit: str) -> None:
        print(f"{label:28s}{a:>17.1f} {unit:<2s}{b:>23.1f} {unit:<2s}{a / b:>10.1f}")

    o, n = rows["old"], rows["new"]
    line("light p50, idle", pct(o["idle"], 50), pct(n["idle"], 50), "ms")
    line("light p95, idle", pct(o["idle"], 95), pct(n["idle"], 95), "ms")
    line("light p50, heavy running", pct(o["light_ms"], 50), pct(n["light_ms"], 50), "ms")
    line("light p95, heavy running", pct(o["light_ms"], 95), pct(n["light_ms"], 95), "ms")
    line("light max, heavy running", max(o["light_ms"]), max(n["light_ms"]), "ms")
    print(f"{'light requests measured':28s}{len(o['light_ms']):>20d}{len(n['light_ms']):>26d}")
    line("heavy request, median", statistics.median(o["heavy_s"]), statistics.median(n["heavy_s"]), "s")
    line("throughput, 32 clients x 16", o["qps"], n["qps"], "q/s")
    line(f"light, {args.idle} idle conns open", o["conns"][0], n["conns"][0], "ms")
    line("light, right after they close", o["conns"][1], n["conns"][1], "ms")


if __name__ == "__main__":
    main()
