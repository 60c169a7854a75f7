"""turngym envs through verifiers' own evaluation (``Environment.evaluate_sync``) against a fake
OpenAI-compatible server defined here that replays scripted replies: the episodes must equal what
``gymnasium.make`` gives on the same actions, and the rubric must be the turngym reward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium
import pytest

vf = pytest.importorskip("verifiers", reason="verifiers is not installed (pip install -e '.[verifiers]')")
if not hasattr(vf, "MultiTurnEnv"):
    pytest.skip(f"verifiers {vf.__version__} has no classic API (MultiTurnEnv); the [verifiers] extra pins 0.3",
                allow_module_level=True)

import turngym  # noqa: E402,F401 - registers the envs
from turngym.episode import Episode  # noqa: E402
from turngym.integrations.verifiers_env import TurngymVerifiersEnv, load_environment  # noqa: E402
from turngym.rewards import GroupReward, get_reward  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# item index -> the replies the model "gives", as written (stop strings included)
SCRIPTS = {
    3: ["<calc>80*10+19</calc>", "<answer>819</answer>"],  # correct
    5: ["<calc>2+2</calc>", "<calc>oops(</calc>", "<answer>-1</answer>"],  # a bad expression, then wrong
}
STOP = ("</calc>", "</answer>")


def gym_episode(index: int, actions: list[str]):
    env = gymnasium.make("turngym/Calculator-v0")
    env.reset(options={"index": index})
    for a in actions:
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    ep = env.unwrapped.episode
    env.close()
    return ep


class FakeOpenAIServer:
    """A fake chat-completions server (test only): finds the script by the conversation's first user
    message and answers with the next scripted reply, dropping the stop string as the OpenAI spec does."""

    def __init__(self, scripts_by_prompt: dict[str, list[str]]):
        self.scripts = scripts_by_prompt
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the client expects

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw)
                server.requests.append(body)
                msgs = body["messages"]
                first_user = next(m["content"] for m in msgs if m["role"] == "user")
                turn = sum(m["role"] == "assistant" for m in msgs)
                text = server.scripts[first_user][turn]
                for s in body.get("stop") or []:
                    text = text.split(s)[0] if s in text else text
                payload = {"id": "fake", "object": "chat.completion", "created": 0, "model": body["model"],
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": text}}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

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


def first_user_content(prompt: list[dict]) -> str:
    return next(m["content"] for m in prompt if m["role"] == "user")


def test_evaluate_drives_turngym_episodes_like_gymnasium(monkeypatch):
    expected = {i: gym_episode(i, acts) for i, acts in SCRIPTS.items()}
    assert [expected[3].outcome["correct"], expected[5].outcome["correct"]] == [True, False]
    scripts = {first_user_content(ep.prompt): SCRIPTS[i] for i, ep in expected.items()}

    env = load_environment("Calculator-v0", reward="outcome", indices=sorted(SCRIPTS))
    monkeypatch.setenv("FAKE_OPENAI_KEY", "fake")
    with FakeOpenAIServer(scripts) as server:
        config = vf.ClientConfig(api_base_url=server.base_url, api_key_var="FAKE_OPENAI_KEY", max_retries=0)
        out = env.evaluate_sync(config, "fake-model", rollouts_per_example=2, state_columns=["turngym_record", "trajectory"])
    assert all(req["stop"] == list(STOP) for req in server.requests)

    outputs = out["outputs"]
    assert len(outputs) == 4
    for o in outputs:
        ep = Episode.from_dict(o["turngym_record"])
        want = expected[ep.task["index"]]
        assert [t.action for t in ep.turns] == SCRIPTS[ep.task["index"]]
        assert [t.action for t in ep.turns] == [t.action for t in want.turns]
        assert [t.observation for t in ep.turns] == [t.observation for t in want.turns]
        assert [t.reward for t in ep.turns] == [t.reward for t in want.turns]
        assert [t.parse_error for t in ep.turns] == [t.parse_error for t in want.turns]
        assert (ep.terminated, ep.truncated, ep.outcome) == (want.terminated, want.truncated, want.outcome)
        assert ep.group is not None
        # the rubric is turngym's outcome reward on the finished episode
        assert o["reward"] == (1.0 if want.outcome["correct"] else 0.0)
        assert o["metrics"]["turngym_outcome"] == o["reward"]
        assert o["error"] is None
        # per-turn rewards land on verifiers' trajectory steps, one step per turn
        assert [step["reward"] for step in o["trajectory"]] == get_reward("outcome").score_group([want]).rewards[0]
        # the observations went back as user messages, and the transcript is the episode's
        users = [m["content"] for m in o["completion"] if m["role"] == "user"]
        assert users == [t.observation for t in ep.turns[:-1]]


def test_bad_arguments_fail_at_load():
    with pytest.raises(ValueError, match="out of range"):
        load_environment("Calculator-v0", indices=[10**9])
    with pytest.raises(ValueError, match="unknown env"):
        load_environment("NoSuchEnv-v0")
    with pytest.raises(ValueError, match="not both"):
        load_environment("Calculator-v0", indices=[0], num_examples=1)


def test_verifiers_loader_finds_it_by_module_name():
    env = vf.load_environment("turngym.integrations.verifiers_env", turngym_env="Digits-v0", num_examples=2)
    assert isinstance(env, vf.MultiTurnEnv) and env.turngym_env_id == "turngym/Digits-v0"
    assert [row["info"]["index"] for row in env.get_eval_dataset()] == [0, 1]


class FakeBrokenReward(GroupReward):
    """A fake reward (test only) that raises, as a broken reward would."""

    name = "fake_broken"
    estimator = "grpo"

    def score_group(self, episodes):
        raise RuntimeError("fake reward failure")


def test_a_raising_reward_stops_the_evaluation(monkeypatch):
    want = gym_episode(3, SCRIPTS[3])
    env = TurngymVerifiersEnv("Calculator-v0", FakeBrokenReward(), {}, [3])
    monkeypatch.setenv("FAKE_OPENAI_KEY", "fake")
    with FakeOpenAIServer({first_user_content(want.prompt): SCRIPTS[3]}) as server:
        config = vf.ClientConfig(api_base_url=server.base_url, api_key_var="FAKE_OPENAI_KEY", max_retries=0)
        with pytest.raises(RuntimeError, match="fake reward failure"):
            env.evaluate_sync(config, "fake-model", rollouts_per_example=1)


def test_vf_eval_cli_plays_the_same_episodes(tmp_path):
    vf_eval = Path(sys.executable).parent / "vf-eval"
    if not vf_eval.exists():
        pytest.skip(f"verifiers' vf-eval script is not next to {sys.executable}")
    expected = {i: gym_episode(i, acts) for i, acts in SCRIPTS.items()}
    scripts = {first_user_content(ep.prompt): SCRIPTS[i] for i, ep in expected.items()}
    env_vars = {**os.environ, "FAKE_OPENAI_KEY": "fake",
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with FakeOpenAIServer(scripts) as server:
        proc = subprocess.run(
            [str(vf_eval), "turngym.integrations.verifiers_env", "-a", json.dumps({"indices": sorted(SCRIPTS)}),
             "-m", "fake-model", "-b", server.base_url, "-k", "FAKE_OPENAI_KEY", "-n", "2", "-r", "1",
             "--disable-tui", "--disable-env-server", "--save-results", "--output-dir", str(tmp_path),
             "--state-columns", "turngym_record"],
            capture_output=True, text=True, env=env_vars, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = tmp_path.rglob("results.jsonl")
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        ep = Episode.from_dict(row["turngym_record"])
        want = expected[row["info"]["index"]]
        assert [t.action for t in ep.turns] == SCRIPTS[row["info"]["index"]]
        assert [t.observation for t in ep.turns] == [t.observation for t in want.turns]
        assert (ep.terminated, ep.truncated, ep.outcome) == (want.terminated, want.truncated, want.outcome)
        assert row["reward"] == (1.0 if want.outcome["correct"] else 0.0)
