"""The retrieval service on a real server (127.0.0.1) over the real Lucene index of the embedded
corpus: hostile and malformed requests get a 4xx JSON answer, a heavy request does not hold
light ones back, idle and half-open connections are timed out, and the next request works."""

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from turngym.corpora.corpus import default_index_dir
from turngym.corpora.service import MAX_BODY_BYTES, RemoteRetriever, RetrievalServer


@pytest.fixture(scope="module")
def server():
    srv = RetrievalServer(str(default_index_dir()), port=0, threads=2, header_timeout_s=1.0, body_timeout_s=1.0,
                          idle_timeout_s=1.0).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def light(url: str, client: httpx.Client | None = None) -> list:
    c = client or httpx
    r = c.post(url + "/retrieve", json={"queries": ["capital of France"], "topk": 3, "return_scores": True}, timeout=30)
    assert r.status_code == 200
    return r.json()["result"]


def raw_exchange(server, data: bytes, wait_s: float = 5.0) -> tuple[int | None, dict, bool]:
    """Send raw bytes; return (status, JSON body or {}, whether the server closed the connection)."""
    with socket.create_connection(tuple(server.server_address), timeout=wait_s) as s:
        s.sendall(data)
        buf, closed = b"", False
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                closed = True
                break
            buf += chunk
            head, sep, body = buf.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), None)
            if sep and length is not None and len(body) >= length:
                break
    if not buf:
        return None, {}, closed
    status = int(buf.split(b" ", 2)[1])
    body = buf.partition(b"\r\n\r\n")[2]
    try:
        obj = json.loads(body)
    except ValueError:
        obj = {}
    return status, obj, closed


def post_raw(body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_results_match_the_local_index(server):
    remote = RemoteRetriever(server.url)
    want = server.retriever.search("capital of France", 3)
    got = remote.search("capital of France", 3)
    assert [(h.docid, round(h.score, 4)) for h in got] == [(h.docid, round(h.score, 4)) for h in want] and want
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_500_queries_by_topk_1000_is_refused_with_a_clear_4xx_while_others_are_served(server):
    queries = [f"history of city number {i}" for i in range(500)]
    r = httpx.post(server.url + "/retrieve", json={"queries": queries, "topk": 1000}, timeout=30)
    assert r.status_code == 413
    body = r.json()
    assert "500000" in body["error"] and body["max_hits_per_request"] == server.app.max_hits
    assert light(server.url)


def test_a_heavy_request_under_the_cap_does_not_hold_light_ones_back(server):
    """Light requests sent while a heavy one runs finish before it does."""
    heavy_q = [f"war battle king empire river {i}" for i in range(24)]
    heavy_done = threading.Event()
    heavy_result = {}

    def heavy():
        r = httpx.post(server.url + "/retrieve", json={"queries": heavy_q, "topk": 1000}, timeout=120)
        heavy_result["status"], heavy_result["n"] = r.status_code, len(r.json()["result"])
        heavy_done.set()

    t = threading.Thread(target=heavy)
    t.start()
    time.sleep(0.3)  # the heavy request is being searched
    finished_before_heavy = 0
    with httpx.Client() as c:
        for _ in range(5):
            light(server.url, c)
            finished_before_heavy += not heavy_done.is_set()
    t.join(120)
    assert heavy_result == {"status": 200, "n": 24}
    assert finished_before_heavy >= 4, "light requests waited for the heavy one"


@pytest.mark.parametrize("body,status,words", [
    (b'{"queries": ["caf\\ud800e"], "topk": 3}', 400, "surrogate"),  # a lone surrogate as a JSON escape
    (b'{"queries": ["caf\xed\xa0\x80e"], "topk": 3}', 400, "surrogate"),  # ... and as raw (invalid UTF-8) bytes
    (b'{"queries": ["caf\xff\xfee"], "topk": 3}', 400, "JSON"),  # bytes that are no UTF-8 at all
    (b'{"queries": ["ok"', 400, "JSON"),
    (b'[' * 100_000 + b']' * 100_000, 400, "JSON"),  # nesting deeper than the parser's recursion
    (b'{"queries": "x"}', 400, "list of strings"),
    (b'{"queries": [1, 2]}', 400, "list of strings"),
    (b'{"queries": ["x"], "topk": 0}', 400, "topk"),
    (b'{"queries": ["x"], "topk": true}', 400, "topk"),
    (b'{"queries": ["x"], "topk": "3"}', 400, "topk"),
    (b'{"topk": 3}', 400, "queries"),
    (b'null', 400, "queries"),
    (json.dumps({"queries": ["a"] * 5000}).encode(), 413, "at most"),
])
def test_malformed_bodies_get_a_4xx_json_answer_and_the_next_request_works(server, body, status, words):
    got, obj, _ = raw_exchange(server, post_raw(body))
    assert got == status and words in obj["error"]
    assert light(server.url)


def test_bad_content_length_never_holds_a_connection(server):
    status, _, _ = raw_exchange(server, b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}")
    assert status == 400
    status, _, _ = raw_exchange(server, b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                        b"Content-Length: 7\r\n\r\n{}")
    assert status == 400
    too_long = post_raw(b"{}").replace(b"Content-Length: 2", f"Content-Length: {MAX_BODY_BYTES + 1}".encode())
    status, obj, _ = raw_exchange(server, too_long)
    assert status == 413 and "exceeds" in obj["error"]
    # more bytes promised than sent, connection held open: answered 408 after the body timeout, then closed
    start = time.monotonic()
    status, obj, closed = raw_exchange(server, b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"qu")
    assert status == 408 and "did not arrive" in obj["error"] and time.monotonic() - start < 5
    assert light(server.url)


def test_half_a_request_or_nothing_is_timed_out(server):
    for data in (b"", b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Le"):
        start = time.monotonic()
        status, _, closed = raw_exchange(server, data, wait_s=6)
        assert closed and time.monotonic() - start < 5  # header deadline is 1 s in this fixture
    assert light(server.url)


def test_many_idle_connections_opened_and_closed_together(server):
    socks = [socket.create_connection(tuple(server.server_address), timeout=10) for _ in range(400)]
    for s in socks[:200]:  # half of them finish a keep-alive request first
        s.sendall(post_raw(b'{"queries": ["river"], "topk": 1}'))
    for s in socks[:200]:
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
    assert light(server.url)  # served while 400 connections sit idle
    for s in socks:
        s.close()
    start = time.monotonic()
    assert light(server.url) and time.monotonic() - start < 5


def test_many_concurrent_clients(server):
    def client(i):
        with httpx.Client(timeout=60) as c:
            r = c.post(server.url + "/retrieve", json={"queries": [f"capital {i}", "director"], "topk": 2})
            return r.status_code, len(r.json()["result"])

    with ThreadPoolExecutor(max_workers=16) as pool:
        assert list(pool.map(client, range(48))) == [(200, 2)] * 48


def test_wrong_paths_and_methods_get_json(server):
    assert httpx.get(server.url + "/retrieve").status_code in (404, 405)
    r = httpx.post(server.url + "/nope", json={})
    assert r.status_code == 404 and "retrieve" in r.json()["error"]


def test_serve_retriever_command_serves_and_stops_on_ctrl_c():
    import os
    import signal
    import subprocess
    import sys

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from turngym.cli import main; sys.exit(main())",
                             "serve-retriever", "--port", "0", "--max-hits", "10"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving ") and "/retrieve" in line
        url = line.split(" on ", 1)[1].strip()
        r = httpx.post(url, json={"queries": ["capital of France"], "topk": 3}, timeout=30)
        assert r.status_code == 200 and len(r.json()["result"][0]) == 3
        r = httpx.post(url, json={"queries": ["a", "b"], "topk": 6}, timeout=30)
        assert r.status_code == 413 and "cap of 10" in r.json()["error"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_request_past_its_time_budget_gets_a_503_and_the_server_goes_on():
    with RetrievalServer(str(default_index_dir()), port=0, request_timeout_s=0.05) as srv:
        queries = [f"war battle king empire river {i}" for i in range(24)]
        r = httpx.post(srv.url + "/retrieve", json={"queries": queries, "topk": 1000}, timeout=60)
        assert r.status_code == 503 and "smaller batch" in r.json()["error"]
        assert light(srv.url)
