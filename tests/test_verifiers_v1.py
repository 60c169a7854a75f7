"""turngym envs as verifiers v1 tasksets (verifiers 0.4, the ``[verifiers-v1]`` extra), through verifiers'
own ``vf-eval``: its null chat harness runs as a uv script in a local subprocess runtime and talks to a fake
OpenAI-compatible server defined here (it replays scripted replies, streamed as the harness asks); every
rollout's episode must equal ``gymnasium.make`` on the same actions, and the trace's reward must be the
turngym reward's. Skipped where verifiers is older than 0.4 (0.3.1's v1 chat program fails against the
current openai client, so the classic API of tests/test_verifiers_env.py serves that line) or uv is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium
import pytest

vf = pytest.importorskip("verifiers", reason="verifiers is not installed (pip install -e '.[verifiers-v1]')")
if int(vf.__version__.split(".")[1]) < 4 and vf.__version__.startswith("0."):
    pytest.skip(f"verifiers {vf.__version__}: the v1 integration needs 0.4 (the [verifiers-v1] extra)",
                allow_module_level=True)

import turngym  # noqa: E402,F401 - registers the envs
from turngym.episode import Episode  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
UV = shutil.which("uv") or (str(BIN / "uv") if (BIN / "uv").exists() else None)
needs_uv = pytest.mark.skipif(UV is None, reason="uv is not installed: verifiers v1 runs its chat harness with it")

SCRIPTS = {
    3: ["<calc>80*10+19</calc>", "<answer>819</answer>"],  # correct
    5: ["<calc>2+2</calc>", "<calc>oops(</calc>", "<answer>-1</answer>"],  # a bad expression, then wrong
}


def gym_episode(index: int, actions: list[str]) -> Episode:
    env = gymnasium.make("turngym/Calculator-v0")
    env.reset(options={"index": index})
    for a in actions:
        if any(env.step(a)[2:4]):
            break
    return env.unwrapped.episode


class FakeStreamingServer:
    """A fake chat-completions server (test only): the script is found by the first user message, the
    turn by the number of assistant messages; replies stream as server-sent events when asked."""

    def __init__(self, scripts: dict[str, list[str]]):
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, data: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self._send(json.dumps({"object": "list", "data": [{"id": "fake-model"}]}).encode(), "application/json")

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                server.requests.append(body)
                msgs = body["messages"]
                first = next(m["content"] for m in msgs if m["role"] == "user")
                first = first if isinstance(first, str) else "".join(p.get("text", "") for p in first)
                text = scripts[first][sum(m["role"] == "assistant" for m in msgs)]
                head = {"id": "fake", "created": 0, "model": body["model"]}
                if not body.get("stream"):
                    self._send(json.dumps({**head, "object": "chat.completion", "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode(),
                        "application/json")
                    return
                chunks = [{**head, "object": "chat.completion.chunk", "choices": [
                              {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}]},
                          {**head, "object": "chat.completion.chunk", "choices": [
                              {"index": 0, "delta": {}, "finish_reason": "stop"}]},
                          {**head, "object": "chat.completion.chunk", "choices": [],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}]
                events = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                self._send(events.encode(), "text/event-stream")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@needs_uv
def test_vf_eval_plays_turngym_episodes_like_gymnasium(tmp_path):
    expected = {i: gym_episode(i, acts) for i, acts in SCRIPTS.items()}
    scripts = {ep.prompt[-1]["content"]: SCRIPTS[i] for i, ep in expected.items()}
    env_vars = {**os.environ, "FAKE_OPENAI_KEY": "fake", "PATH": os.pathsep.join([str(BIN), os.environ["PATH"]]),
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with FakeStreamingServer(scripts) as server:
        proc = subprocess.run(
            [str(BIN / "vf-eval"), "turngym-taskset", "--env.taskset.env", "Calculator-v0",
             "--env.taskset.indices", json.dumps(sorted(SCRIPTS)), "-m", "fake-model",
             "--client.base-url", server.base_url, "--client.api-key-var", "FAKE_OPENAI_KEY",
             "--no-push", "-o", str(tmp_path)],
            capture_output=True, text=True, env=env_vars, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        # the system prompt is the env's, the first user message its question
        assert all(r["messages"][0]["role"] == "system" and "<calc>" in r["messages"][0]["content"]
                   for r in server.requests)
    (traces,) = tmp_path.rglob("traces.jsonl")
    rows = [json.loads(line) for line in traces.read_text().splitlines()]
    assert sorted(r["task"]["data"]["index"] for r in rows) == sorted(SCRIPTS)
    for row in rows:
        assert row["ok"], row.get("errors")
        (trace,) = row["traces"]
        ep = Episode.from_dict(trace["info"]["turngym_record"])
        want = expected[row["task"]["data"]["index"]]
        assert [t.action for t in ep.turns] == [t.action for t in want.turns]
        assert [t.observation for t in ep.turns] == [t.observation for t in want.turns]
        assert [t.reward for t in ep.turns] == [t.reward for t in want.turns]
        assert (ep.terminated, ep.truncated, ep.outcome) == (want.terminated, want.truncated, want.outcome)
        assert trace["rewards"]["turngym_outcome"]["score"] == (1.0 if want.outcome["correct"] else 0.0)
        assert [trace["metrics"][f"turngym_turn_{t}"] for t in range(len(ep.turns))][-1] == \
            trace["rewards"]["turngym_outcome"]["score"]


def test_the_taskset_refuses_a_bad_index_and_an_unknown_env():
    from turngym.integrations.verifiers_v1 import TurngymTaskset, TurngymTasksetConfig

    with pytest.raises(ValueError, match="index 10000 is out of range: turngym/Calculator-v0 has 10000 items"):
        list(TurngymTaskset(TurngymTasksetConfig(id="turngym-taskset", env="Calculator-v0", indices=[10_000])).load())
    with pytest.raises(ValueError, match="unknown env 'turngym/Nope-v0'"):
        list(TurngymTaskset(TurngymTasksetConfig(id="turngym-taskset", env="Nope-v0")).load())
    tasks = list(TurngymTaskset(TurngymTasksetConfig(id="turngym-taskset", env="Calculator-v0", num_examples=2)).load())
    assert [t.data.index for t in tasks] == [0, 1] and tasks[0].data.prompt is None
