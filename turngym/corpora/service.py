"""Retrieval over HTTP with Search-R1's ``/retrieve`` shape, and the client the env uses.

Request: ``{"queries": [...], "topk": 3, "return_scores": true}``. Response:
``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}`` (without scores,
each inner item is just the document). One index serves many trainer processes.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

import httpx

from turngym.corpora.lucene import Hit, LuceneRetriever, RetrieverError, parse_raw

MAX_QUERIES_PER_REQUEST = 4096
MAX_TOPK = 1000


@dataclass
class RemoteRetriever:
    url: str
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if not self.url.endswith("/retrieve"):
            self.url += "/retrieve"
        self._client = httpx.Client(timeout=self.timeout_s)

    def __deepcopy__(self, memo: dict) -> "RemoteRetriever":
        return self  # an HTTP client is a shared resource

    def batch_search(self, queries: Sequence[str], k: int = 3, threads: int = 1) -> list[list[Hit]]:
        try:
            resp = self._client.post(self.url, json={"queries": list(queries), "topk": int(k), "return_scores": True})
        except httpx.TransportError as exc:
            raise RetrieverError(f"retrieval server {self.url} is unreachable ({type(exc).__name__})") from None
        if resp.status_code != 200:
            raise RetrieverError(f"retrieval server {self.url} answered HTTP {resp.status_code}: {resp.text[:200]}")
        try:
            result = resp.json()["result"]
        except (ValueError, KeyError):
            raise RetrieverError(f"retrieval server {self.url} sent a body without 'result'") from None
        out = []
        for items in result:
            hits = []
            for item in items:
                doc, score = (item["document"], item.get("score", 0.0)) if "document" in item else (item, 0.0)
                _, title, text = parse_raw(json.dumps(doc))
                hits.append(Hit(docid=str(doc.get("id")), score=float(score), title=title, text=text))
            out.append(hits)
        return out

    def search(self, query: str, k: int = 3) -> list[Hit]:
        return self.batch_search([query], k)[0]


def make_retriever(spec: Any) -> Any:
    """None → the default index; ``http(s)://`` → a server; a path → a local index; else the object."""
    if spec is None or spec == "default":
        from turngym.corpora.corpus import default_index_dir

        return LuceneRetriever(default_index_dir())
    if isinstance(spec, str) and spec.startswith(("http://", "https://")):
        return RemoteRetriever(spec)
    if isinstance(spec, str):
        return LuceneRetriever(spec)
    return spec


class _Handler(BaseHTTPRequestHandler):
    server: "RetrievalServer"

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, obj: Any) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/health":
            self._reply(200, {"status": "ok", "index": self.server.retriever.index_dir})
        else:
            self._reply(404, {"error": "use POST /retrieve"})

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/retrieve":
            return self._reply(404, {"error": "use POST /retrieve"})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            queries = body["queries"]
            if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
                raise ValueError("'queries' must be a list of strings")
            if len(queries) > MAX_QUERIES_PER_REQUEST:
                raise ValueError(f"at most {MAX_QUERIES_PER_REQUEST} queries per request")
            topk = int(body.get("topk", 3))
            if not 1 <= topk <= MAX_TOPK:
                raise ValueError(f"topk must be in 1..{MAX_TOPK}")
            with_scores = bool(body.get("return_scores", False))
        except (ValueError, KeyError, TypeError) as exc:
            return self._reply(400, {"error": f"bad request: {exc}"})
        try:
            hits = self.server.search(queries, topk)
        except RetrieverError as exc:
            return self._reply(500, {"error": str(exc)})
        result = []
        for row in hits:
            docs = [{"id": h.docid, "contents": h.contents} for h in row]
            result.append([{"document": d, "score": h.score} for d, h in zip(docs, row)] if with_scores else docs)
        self._reply(200, {"result": result})


class RetrievalServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default backlog of 5 resets connections under many clients

    def __init__(self, index_dir: str, host: str = "127.0.0.1", port: int = 8000, threads: int = 2,
                 k1: float = 0.9, b: float = 0.4):
        self.retriever = LuceneRetriever(index_dir, k1=k1, b=b)
        self.threads = threads
        self._lock = threading.Lock()
        super().__init__((host, port), _Handler)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import jnius

        try:
            with self._lock:  # one Java batch at a time; Anserini parallelises inside it
                return self.retriever.batch_search(queries, topk, self.threads)
        finally:
            jnius.detach()  # request threads come and go; release their JVM attachment
