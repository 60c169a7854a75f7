"""The OpenAI-compatible backend against a fake HTTP server on loopback (a real socket and
real HTTP; only the model behind it is fake)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from turngym.agents.openai_compat import OpenAICompatPolicy
from turngym.agents.policy import GenerationRequest, PolicyError, SamplingParams


class FakeOpenAIServer:
    def __init__(self, fail_first=0, delay=0.0):
        self.fail_first, self.delay = fail_first, delay
        self.requests, self.active, self.max_active = [], 0, 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append((self.path, body))
                    n = len(outer.requests)
                    outer.active += 1
                    outer.max_active = max(outer.max_active, outer.active)
                time.sleep(outer.delay)
                with outer.lock:
                    outer.active -= 1
                if n <= outer.fail_first:
                    self.send_response(503)
                    self.end_headers()
                    return
                if self.path.endswith("/chat/completions"):
                    payload = {"choices": [{"message": {"content": "<answer>4</answer>"}, "finish_reason": "stop"}]}
                else:
                    payload = {"choices": [{"text": "<calc>1+1</calc>", "finish_reason": "stop",
                                            "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.5, -1.0]}}]}
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def test_token_and_chat_requests_round_trip():
    server = FakeOpenAIServer()
    try:
        pol = OpenAICompatPolicy(model="m", base_url=server.url)
        gens = pol.generate([GenerationRequest(prompt_ids=[1, 2, 3]), GenerationRequest(messages=[{"role": "user", "content": "hi"}])],
                            SamplingParams(max_new_tokens=7, stop=("</calc>",)))
        assert gens[0].token_ids == [5, 6] and gens[0].logprobs == [-0.5, -1.0] and gens[0].text == "<calc>1+1</calc>"
        assert gens[1].token_ids is None and gens[1].text == "<answer>4</answer>"
        paths = sorted(p for p, _ in server.requests)
        assert paths == ["/v1/chat/completions", "/v1/completions"]
        body = dict(server.requests)["/v1/completions"]
        assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 7 and body["stop"] == ["</calc>"]
    finally:
        server.close()


def test_transient_errors_are_retried():
    server = FakeOpenAIServer(fail_first=2)
    try:
        pol = OpenAICompatPolicy(model="m", base_url=server.url, retries=3, backoff_s=0.01)
        [g] = pol.generate([GenerationRequest(prompt_ids=[1])], SamplingParams())
        assert g.text and len(server.requests) == 3
    finally:
        server.close()


def test_concurrency_limit_is_respected():
    server = FakeOpenAIServer(delay=0.1)
    try:
        pol = OpenAICompatPolicy(model="m", base_url=server.url, concurrency=2)
        pol.generate([GenerationRequest(prompt_ids=[i]) for i in range(6)], SamplingParams())
        assert server.max_active <= 2 and len(server.requests) == 6
    finally:
        server.close()


def test_server_down_is_a_clear_error():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    pol = OpenAICompatPolicy(model="m", base_url=f"http://127.0.0.1:{port}/v1", retries=1, backoff_s=0.01, timeout_s=2)
    with pytest.raises(PolicyError, match=r"failed after 2 attempts: cannot connect"):
        pol.generate([GenerationRequest(prompt_ids=[1])], SamplingParams())
