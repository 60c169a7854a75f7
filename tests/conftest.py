"""Shared fixtures: tiny random models built locally (no hub), a real OpenAI-compatible server serving one
(``transformers serve``), real Lucene indexes built from test passages, and a fake policy for unit tests."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from turngym.agents.policy import PolicyBase

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _in_verl_env() -> bool:
    """verl's pins hold here (transformers<5.11, tensordict<=0.10 and verl itself): the environment
    scripts/setup_verl.sh builds, where tests/verl/ runs. Read from the installed versions, importing nothing."""
    from importlib.metadata import PackageNotFoundError, version

    def release(name: str) -> tuple[int, ...]:
        return tuple(int(p) for p in version(name).split("+")[0].split(".")[:2])

    try:
        return version("verl") == "0.9.1" and release("transformers") < (5, 11) and release("tensordict") <= (0, 10)
    except (PackageNotFoundError, ValueError):
        return False


# tests/verl/ needs verl's own environment (scripts/test.sh runs it with .venv-verl/bin/python)
collect_ignore = [] if _in_verl_env() else ["verl"]


@pytest.fixture(scope="session")
def tiny_chat_policy():
    from turngym.agents.loading import load_hf_policy
    from turngym.agents.tiny import tiny_model_dir

    return load_hf_policy(str(tiny_model_dir(chat=True)), dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def tiny_plain_policy():
    from turngym.agents.loading import load_hf_policy
    from turngym.agents.tiny import tiny_model_dir

    return load_hf_policy(str(tiny_model_dir(chat=False)), dtype="float32", device="cpu")


SERVE_STARTUP_S = 600  # a cold start on two busy cores can take minutes


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """(base_url, model name) of a running ``transformers serve`` on 127.0.0.1 pinned to the tiny local
    chat model (offline: no hub). A real OpenAI-compatible server speaking the common API only: it
    answers HTTP 422 to fields it does not know and returns no token ids. One server for the session.

Its log (a line per request) goes to a file, not a pipe: a pipe nobody reads fills after ~64 KiB and the
server, and with it the suite, would block on its next log line. A failure shows the log's tail."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    from turngym.agents.tiny import tiny_model_dir

    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    model_dir = str(tiny_model_dir(chat=True))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log_path = tmp_path_factory.mktemp("serve") / "stderr.log"
    log = log_path.open("w", encoding="utf-8")

    def log_tail() -> str:
        log.flush()
        return log_path.read_text(encoding="utf-8", errors="replace")[-2000:]

    proc = subprocess.Popen([sys.executable, "-c", "from transformers.cli.transformers import main; main()",
                             "serve", model_dir, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                             "--dtype", "float32"],
                            env=env, stdout=subprocess.DEVNULL, stderr=log)
    root = f"http://127.0.0.1:{port}"
    deadline = time.time() + SERVE_STARTUP_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited with {proc.returncode}: {log_tail()}")
            try:
                if httpx.get(f"{root}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                pytest.fail(f"transformers serve did not come up within {SERVE_STARTUP_S} s: {log_tail()}")
            time.sleep(1)
        yield f"{root}/v1", model_dir
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def gemma_tokenizer():
    """The real Gemma 3 tokenizer from the default model package (converted once, cached)."""
    from transformers import AutoTokenizer

    from turngym.agents.loading import resolve_model_dir

    return AutoTokenizer.from_pretrained(resolve_model_dir("default"))


@pytest.fixture(scope="session")
def lucene_index(tmp_path_factory):
    """Builds a real Lucene index (Anserini) from a list of ``{"id", "title", "text"}`` passages and
    returns its directory; the same passages give the same index within a session."""
    import json

    from turngym.corpora.corpus import read_user_passages, write_collection
    from turngym.corpora.lucene import build_index

    built: dict[str, str] = {}

    def build(passages: Sequence[dict]) -> str:
        text = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in passages)
        if text not in built:
            root = tmp_path_factory.mktemp("lucene")
            (root / "passages.jsonl").write_text(text, encoding="utf-8")
            n = write_collection(read_user_passages(root / "passages.jsonl"), root / "collection")
            assert n == len(passages)
            build_index(root / "collection", root / "index", threads=1)
            built[text] = str(root / "index")
        return built[text]

    return build


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (benchmarks/ is no package), once per process: registered in sys.modules,
    where its dataclasses resolve their annotations and a benchmark finds another it loaded the same way."""
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@dataclass
class FakeScriptedPolicy(PolicyBase):
    """A fake policy for unit tests: replies with scripted texts, tokenised canonically."""

    tokenizer: object
    script: Sequence[str]
    name: str = "fake-scripted"
    max_context: int | None = None
    calls: list = field(default_factory=list)

    def generate(self, requests, sampling):
        from turngym.agents.policy import Generation

        out = []
        for req in requests:
            self.calls.append(list(req.prompt_ids))
            text = self.script[min(len(self.calls) - 1, len(self.script) - 1)]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(text=text, token_ids=ids, logprobs=[0.0] * len(ids)))
        return out


@pytest.fixture(scope="session")
def tiny_nli_dir(tmp_path_factory):
    """A tiny random BERT NLI classifier (labels contradiction/neutral/entailment) with a local tokenizer."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    from turngym.agents.tiny import tiny_model_dir

    out = tmp_path_factory.mktemp("tiny-nli")
    tok = PreTrainedTokenizerFast.from_pretrained(str(tiny_model_dir(chat=False)))
    tok.save_pretrained(out)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, num_labels=3, pad_token_id=tok.pad_token_id,
                     id2label={0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"},
                     label2id={"CONTRADICTION": 0, "NEUTRAL": 1, "ENTAILMENT": 2})
    BertForSequenceClassification(cfg).save_pretrained(out)
    return out


class FakeJSONServer:
    """A real HTTP server on loopback whose JSON replies come from a fake ``reply(path, body, n)``
    returning ``(status, payload)`` (GETs: ``get_reply(path)``); records requests and peak concurrency."""

    def __init__(self, reply, delay: float = 0.0, get_reply=None):
        import json
        import threading
        import time
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests, self.active, self.max_active, self.gets = [], 0, 0, []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    outer.requests.append((self.path, body))
                    n = len(outer.requests)
                    outer.active += 1
                    outer.max_active = max(outer.max_active, outer.active)
                time.sleep(delay)
                with lock:
                    outer.active -= 1
                status, payload = reply(self.path, body, n)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # e.g. /v1/models: ``get_reply(path)``, or 404 when the fake has none
                with lock:
                    outer.gets.append(self.path)
                status, payload = get_reply(self.path) if get_reply else (404, {"error": "not found"})
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture(scope="session")
def batch_hits():
    """turngym's BatchHits Java class (the JVM starts with turngym's class path)."""
    from turngym.corpora.lucene import jvm

    return jvm().autoclass("turngym.lucene.BatchHits")
