"""Retrieval over HTTP with Search-R1's ``/retrieve`` shape, and the client the env uses.

Request: ``{"queries": [...], "topk": 3, "return_scores": true}``. Response:
``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}`` (without scores,
each inner item is just the document). One index serves many trainer processes.

The server is an ASGI app (Starlette) on uvicorn, as Search-R1 serves its retriever with
FastAPI. Searches run in a small thread pool, a large batch in chunks, so one heavy request
never holds the others back; every malformed request gets a 4xx JSON answer; a client that
sends nothing, or half a request, is timed out instead of holding a connection.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from turngym.corpora.lucene import SURROGATE, Hit, LuceneRetriever, RetrieverError, parse_raw
from turngym.registry import Registry

MAX_QUERIES_PER_REQUEST = 4096
MAX_TOPK = 1000
MAX_HITS_PER_REQUEST = 50_000  # queries × topk; 500 × 1000 would build ~2 GB of hits in one request
CHUNK_HITS = 2_000  # a large batch is searched in pieces of about this many hits, so others interleave
MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass
class RemoteRetriever:
    url: str
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if not self.url.endswith("/retrieve"):
            self.url += "/retrieve"
        self._client = httpx.Client(timeout=self.timeout_s)

    def __deepcopy__(self, memo: dict) -> RemoteRetriever:
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

    def check(self) -> None:
        """Raise :class:`RetrieverError` unless the server answers ``/health``."""
        health = self.url[: -len("/retrieve")] + "/health"
        try:
            resp = self._client.get(health)
        except httpx.TransportError as exc:
            raise RetrieverError(f"retrieval server {self.url} is unreachable ({type(exc).__name__})") from None
        if resp.status_code != 200:
            raise RetrieverError(f"retrieval server {health} answered HTTP {resp.status_code}")


def open_bm25(path: str) -> LuceneRetriever:
    if path == "default":
        from turngym.corpora.corpus import default_index_dir

        return LuceneRetriever(default_index_dir())
    return LuceneRetriever(path)


def open_dense(path: str) -> Any:
    from turngym.corpora.dense import DenseRetriever, default_dense_index_dir

    return DenseRetriever(default_dense_index_dir() if path == "default" else path)


def open_hybrid(bm25_path: str, dense_path: str) -> Any:
    from turngym.corpora.dense import HybridRetriever

    return HybridRetriever(open_bm25(bm25_path), open_dense(dense_path))


# ``retriever=`` kinds: "bm25:PATH", "dense:PATH", "hybrid:BM25_PATH,DENSE_PATH" (PATH "default": the embedded corpus)
RETRIEVER_KINDS = Registry("retriever kind", {"bm25": open_bm25, "dense": open_dense, "hybrid": open_hybrid})
KIND_NEEDS = {"bm25": ("BM25 search over a local Lucene index (SearchQA-v0's default retriever)",),
              "dense": ("dense retrieval (a FAISS index and a text encoder)",),
              "hybrid": ("BM25 search over a local Lucene index (SearchQA-v0's default retriever)",
                         "dense retrieval (a FAISS index and a text encoder)")}


def parse_retriever(spec: str) -> tuple[str, list[str]]:
    """(kind, paths) of a local ``retriever=`` string. A bare path is a dense index when it holds a dense
    manifest, else a Lucene index; "default" is BM25 over the embedded corpus."""
    kind, sep, rest = spec.partition(":")
    if sep and kind in RETRIEVER_KINDS:
        paths = [p.strip() for p in rest.split(",")] if kind == "hybrid" else [rest.strip()]
        if len(paths) != (2 if kind == "hybrid" else 1) or not all(paths):
            raise ValueError(f"retriever {spec!r}: write 'bm25:PATH', 'dense:PATH' or 'hybrid:BM25_PATH,DENSE_PATH'")
        return kind, paths
    if sep and kind.isidentifier() and kind not in RETRIEVER_KINDS and not Path(spec).exists():
        raise ValueError(f"unknown retriever kind {kind!r} in {spec!r}; choose one of {sorted(RETRIEVER_KINDS)}")
    from turngym.corpora.dense import is_dense_index

    return ("dense" if spec != "default" and is_dense_index(spec) else "bm25"), [spec]


def require_retriever(spec: Any) -> None:
    """Say now, by name, which optional install a local ``retriever=`` needs (not at the first search)."""
    if spec is not None and not isinstance(spec, str):
        return
    if isinstance(spec, str) and spec.startswith(("http://", "https://")):
        return
    from turngym.extras import require

    for part in KIND_NEEDS[parse_retriever(spec or "default")[0]]:
        require(part)


def check_retriever(spec: Any, health_timeout_s: float = 5.0) -> None:
    """Refuse now (RetrieverError, one line naming the retriever and what is wrong) a ``retriever=`` that cannot
    serve, so no env is built whose every search would be an error observation. A local index is checked on disk
    (nothing is opened: the searcher is made in the process that searches); a server must answer ``/health``; the
    embedded default index is built on first use; a retriever object is the caller's."""
    if spec is None or not isinstance(spec, str):
        return
    if spec.startswith(("http://", "https://")):
        RemoteRetriever(spec, timeout_s=health_timeout_s).check()
        return
    kind, paths = parse_retriever(spec)
    wanted = {"bm25": ("bm25",), "dense": ("dense",), "hybrid": ("bm25", "dense")}[kind]
    from turngym.corpora.dense import is_dense_index

    for what, path in zip(wanted, paths, strict=True):
        if path == "default":
            continue
        if not Path(path).exists():
            raise RetrieverError(f"retriever={spec!r}: no index at {path} (the path does not exist); build one with "
                                 "`turngym index build`, or pass the folder an index was built in")
        if what == "bm25" and not (Path(path).is_dir() and any(Path(path).glob("segments_*"))):
            raise RetrieverError(f"retriever={spec!r}: {path} is not a Lucene index (no segments file); build one "
                                 "with `turngym index build`")
        if what == "dense" and not is_dense_index(path):
            raise RetrieverError(f"retriever={spec!r}: {path} is not a dense index (no manifest); build one with "
                                 "`turngym index build --dense`")


def make_retriever(spec: Any) -> Any:
    """None → the default index; ``http(s)://`` → a server; ``bm25:``/``dense:``/``hybrid:`` or a path → a
    local index (see ``parse_retriever``); else the object itself."""
    if spec is None:
        spec = "default"
    if isinstance(spec, str) and spec.startswith(("http://", "https://")):
        return RemoteRetriever(spec)
    if isinstance(spec, str):
        kind, paths = parse_retriever(spec)
        return RETRIEVER_KINDS.load(kind)(*paths)
    return spec


# --------------------------------------------------------------------------- request checks


class BadRequest(ValueError):
    def __init__(self, status: int, message: str, **extra: Any):
        super().__init__(message)
        self.status, self.extra = status, extra


def parse_request(body: bytes, max_hits: int) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) from a ``/retrieve`` body, or :class:`BadRequest` saying what is wrong."""
    try:
        obj = json.loads(body or b"{}")
    except (ValueError, RecursionError) as exc:  # also invalid UTF-8 (UnicodeDecodeError is a ValueError)
        raise BadRequest(400, f"body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(obj, dict) or "queries" not in obj:
        raise BadRequest(400, "body must be a JSON object with 'queries' (a list of strings)")
    queries = obj["queries"]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest(400, "'queries' must be a list of strings")
    if len(queries) > MAX_QUERIES_PER_REQUEST:
        raise BadRequest(413, f"at most {MAX_QUERIES_PER_REQUEST} queries per request, got {len(queries)}")
    for i, q in enumerate(queries):
        if m := SURROGATE.search(q):
            raise BadRequest(400, f"query {i} contains a lone surrogate (U+{ord(m.group()):04X}), which is not text")
    topk = obj.get("topk", 3)
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise BadRequest(400, f"'topk' must be an integer in 1..{MAX_TOPK}, got {topk!r}")
    if len(queries) * topk > max_hits:
        raise BadRequest(413, f"{len(queries)} queries × topk {topk} = {len(queries) * topk} hits exceeds this "
                              f"server's cap of {max_hits} per request; split the batch or lower topk",
                         max_hits_per_request=max_hits)
    scores = obj.get("return_scores", False)
    if not isinstance(scores, bool):  # "false" is a true string: refuse rather than guess
        raise BadRequest(400, f"'return_scores' must be true or false (JSON booleans), got {scores!r}")
    return queries, topk, scores


def _row_json(hits: list[Hit], with_scores: bool) -> bytes:
    docs = [{"id": h.docid, "contents": h.contents} for h in hits]
    row = [{"document": d, "score": h.score} for d, h in zip(docs, hits, strict=True)] if with_scores else docs
    try:
        return json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a stored document with a lone surrogate: escape everything
        return json.dumps(row).encode("ascii")


# --------------------------------------------------------------------------- the ASGI app


class RetrievalApp:
    """The Starlette app: ``GET /health`` and ``POST /retrieve``; searches in a thread pool."""

    def __init__(self, retriever: Any, threads: int = 2, max_hits: int = MAX_HITS_PER_REQUEST,
                 body_timeout_s: float = 10.0, request_timeout_s: float = 120.0):
        from starlette.applications import Starlette
        from starlette.routing import Route

        if threads < 1 or max_hits < 1:
            raise ValueError("threads and max_hits must be >= 1")
        self.retriever, self.max_hits = retriever, int(max_hits)
        self.body_timeout_s, self.request_timeout_s = float(body_timeout_s), float(request_timeout_s)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="retrieve")
        self.app = Starlette(routes=[Route("/health", self.health, methods=["GET"]),
                                     Route("/health/", self.health, methods=["GET"]),
                                     Route("/retrieve", self.retrieve, methods=["POST"]),
                                     Route("/retrieve/", self.retrieve, methods=["POST"])],
                             exception_handlers={404: self._not_found, 405: self._not_found})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)

    @staticmethod
    def _json(status: int, obj: Any, close: bool = False):
        from starlette.responses import Response

        headers = {"Connection": "close"} if close else None
        return Response(json.dumps(obj).encode("utf-8"), status_code=status, media_type="application/json",
                        headers=headers)

    async def _not_found(self, request: Any, exc: Exception):
        return self._json(404, {"error": "use POST /retrieve (or GET /health)"})

    async def health(self, request: Any):
        return self._json(200, {"status": "ok", "index": getattr(self.retriever, "index_dir", None)})

    async def _read_body(self, request: Any) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and int(declared) > MAX_BODY_BYTES:  # h11 already refused a non-integer
            raise BadRequest(413, f"body of {declared} bytes exceeds {MAX_BODY_BYTES}")
        body = bytearray()

        async def read() -> None:
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > MAX_BODY_BYTES:
                    raise BadRequest(413, f"body exceeds {MAX_BODY_BYTES} bytes")

        try:
            await asyncio.wait_for(read(), self.body_timeout_s)
        except TimeoutError:
            raise BadRequest(408, f"the request body did not arrive within {self.body_timeout_s:g} s "
                                  f"(got {len(body)} of {declared or '?'} bytes)") from None
        return bytes(body)

    async def retrieve(self, request: Any):
        from starlette.responses import Response

        try:
            queries, topk, with_scores = parse_request(await self._read_body(request), self.max_hits)
        except BadRequest as exc:
            return self._json(exc.status, {"error": str(exc), **exc.extra}, close=exc.status in (408, 413))
        except Exception as exc:  # noqa: BLE001 - e.g. the client went away mid-body; never a dropped reply
            return self._json(400, {"error": f"cannot read the request: {type(exc).__name__}"}, close=True)
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.request_timeout_s
        per_chunk = max(1, CHUNK_HITS // topk)  # a dense retriever's cost is encoding: it caps queries per chunk too
        per_chunk = min(per_chunk, getattr(self.retriever, "chunk_queries", per_chunk))
        rows: list[bytes] = []
        try:
            for start in range(0, len(queries), per_chunk):  # one chunk at a time: others queue in between
                if time.monotonic() > deadline:
                    return self._json(503, {"error": f"search took longer than {self.request_timeout_s:g} s; "
                                                     "send a smaller batch"})
                chunk = queries[start:start + per_chunk]
                rows += await loop.run_in_executor(self.pool, self._search_chunk, chunk, topk, with_scores)
        except RetrieverError as exc:
            return self._json(500, {"error": str(exc)})
        except Exception as exc:  # noqa: BLE001 - a failed search is a 500 with the reason, never a dropped reply
            return self._json(500, {"error": f"search failed: {type(exc).__name__}: {str(exc)[:300]}"})
        return Response(b'{"result": [' + b", ".join(rows) + b"]}", media_type="application/json")

    def _search_chunk(self, queries: list[str], topk: int, with_scores: bool) -> list[bytes]:
        hits = self.retriever.batch_search(queries, topk, 1)
        return [_row_json(row, with_scores) for row in hits]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _guarded_h11(header_timeout_s: float) -> type:
    """uvicorn's h11 protocol plus a deadline for each request's headers.

    uvicorn times out a connection only between requests, after a response; a client that
    connects and sends nothing, or half a header, would hold its connection forever.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:  # a request's headers arrived
                self._disarm()

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._arm()  # before super(): it may start a pipelined request, which disarms
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedH11Protocol


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket. Its protocol must be IPPROTO_TCP (not 0, as ``socket.create_server``
    leaves it): asyncio turns off Nagle's algorithm only on such sockets, and without that every
    response waits ~40 ms for the client's delayed ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


class RetrievalServer:
    """``/retrieve`` for one index on uvicorn; ``port=0`` picks a free port. ``index_dir``: a Lucene index
    directory (searched with ``k1``, ``b``), or any local ``retriever=`` string (``dense:PATH``,
    ``hybrid:BM25_PATH,DENSE_PATH``), or a retriever object.

    ``serve_forever()`` blocks (Ctrl-C stops it); ``start()`` serves from a background thread
    and returns once it accepts connections; ``shutdown()`` stops either.
    """

    def __init__(self, index_dir: Any, host: str = "127.0.0.1", port: int = 8000, threads: int = 2,
                 k1: float = 0.9, b: float = 0.4, max_hits: int = MAX_HITS_PER_REQUEST,
                 idle_timeout_s: float = 5.0, header_timeout_s: float = 10.0, body_timeout_s: float = 10.0,
                 request_timeout_s: float = 120.0, backlog: int = 2048):
        from turngym.extras import require

        require("the retrieval service")
        import uvicorn

        spec = str(index_dir) if isinstance(index_dir, os.PathLike) else index_dir
        if isinstance(spec, str) and spec != "default" and parse_retriever(spec) == ("bm25", [spec]):
            self.retriever = LuceneRetriever(spec, k1=k1, b=b)  # a bare Lucene directory: with these k1, b
        else:
            self.retriever = make_retriever(spec)
        self.app = RetrievalApp(self.retriever, threads=threads, max_hits=max_hits, body_timeout_s=body_timeout_s,
                                request_timeout_s=request_timeout_s)
        self._sock = _listen(host, port, backlog)
        self.server_address = self._sock.getsockname()[:2]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=idle_timeout_s, http=_guarded_h11(header_timeout_s),
                                backlog=backlog, timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._serving = False
        self._stopped = threading.Event()

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.server_address[1]}"

    def serve_forever(self) -> None:
        self._serving = True
        try:
            self._server.run(sockets=[self._sock])
        finally:
            self._stopped.set()

    def start(self, timeout_s: float = 30.0) -> RetrievalServer:
        threading.Thread(target=self.serve_forever, name="retrieval-server", daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if self._stopped.is_set() or time.monotonic() > deadline:
                raise RetrieverError("the retrieval server did not start")
            time.sleep(0.01)
        return self

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        if self._serving:
            self._stopped.wait(timeout_s)
        self.app.close()

    def server_close(self) -> None:
        self._sock.close()

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
