"""turngym envs through verifiers' own evaluation (``Environment.evaluate_sync`` and the ``vf-eval``
command) against a fake OpenAI-compatible server defined here that replays scripted replies, and
against a real one (``transformers serve`` with a tiny random model, the ``served`` fixture): the
episodes must equal what ``gymnasium.make`` gives on the same actions, and the rubric must be the
turngym reward."""

from __future__ import annotations

import itertools
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
from turngym.integrations.verifiers_env import (  # noqa: E402
    EPISODE_KEY,
    ModelNotServed,
    TurngymVerifiersEnv,
    load_environment,
    message_text,
)
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
    message and answers with the next scripted reply (a text, or a ``(text, finish_reason)`` pair;
    finish "stop" otherwise), dropping the stop string as the OpenAI spec does. A reply scripted as
    ``{"tool_calls": [(name, arguments), ...]}`` is a native tool-call message (finish "tool_calls");
    the script's position is the number of assistant messages so far."""

    def __init__(self, scripts_by_prompt: dict[str, list[str]]):
        self.scripts = scripts_by_prompt
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the client expects

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):  # the models list: one model, "fake-model"
                data = json.dumps({"object": "list", "data": [{"id": "fake-model", "object": "model"}]}).encode()
                self.send_response(200 if self.path.endswith("/models") else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw)
                server.requests.append(body)
                msgs = body["messages"]
                first_user = next(m["content"] for m in msgs if m["role"] == "user")
                turn = sum(m["role"] == "assistant" for m in msgs)
                text = server.scripts[first_user][turn]
                finish = "stop"
                if isinstance(text, dict):  # native tool calls
                    message = {"role": "assistant", "content": None, "tool_calls": [
                        {"id": f"call_{turn}_{k}", "type": "function",
                         "function": {"name": name, "arguments": json.dumps(arguments)}}
                        for k, (name, arguments) in enumerate(text["tool_calls"])]}
                    finish = "tool_calls"
                else:
                    if isinstance(text, tuple):  # (text, finish_reason): e.g. a reply the token limit cut
                        text, finish = text
                    for s in body.get("stop") or []:
                        text = text.split(s)[0] if s in text else text
                    message = {"role": "assistant", "content": text}
                payload = {"id": "fake", "object": "chat.completion", "created": 0, "model": body["model"],
                           "choices": [{"index": 0, "finish_reason": finish, "message": message}],
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


def test_a_reply_cut_at_the_token_limit_is_sent_with_its_tag_open(monkeypatch):
    """Only a reply the server says a stop string ended gets the dropped stop string back: one the
    token limit cut (finish "length") keeps its ``<calc>`` open, and the env says so."""
    script = [("<calc>80*10", "length"), "<answer>819</answer>"]
    want = gym_episode(3, ["<calc>80*10", "<answer>819</answer>"])
    assert "never closed" in want.turns[0].parse_error
    env = load_environment("Calculator-v0", indices=[3])
    monkeypatch.setenv("FAKE_OPENAI_KEY", "fake")
    with FakeOpenAIServer({first_user_content(want.prompt): script}) as server:
        config = vf.ClientConfig(api_base_url=server.base_url, api_key_var="FAKE_OPENAI_KEY", max_retries=0)
        out = env.evaluate_sync(config, "fake-model", state_columns=["turngym_record"])
    ep = Episode.from_dict(out["outputs"][0]["turngym_record"])
    assert [t.action for t in ep.turns] == ["<calc>80*10", "<answer>819</answer>"]
    assert [t.observation for t in ep.turns] == [t.observation for t in want.turns]
    assert [t.parse_error for t in ep.turns] == [t.parse_error for t in want.turns]
    assert ep.outcome == want.outcome


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
             "--disable-tui", "--save-results", "--output-dir", str(tmp_path),
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


def test_a_model_the_server_does_not_serve_is_one_error_naming_the_served_ones(tmp_path):
    env = load_environment("Calculator-v0", indices=[3])
    with FakeOpenAIServer({}) as server:
        config = vf.ClientConfig(api_base_url=server.base_url, api_key_var="FAKE_OPENAI_KEY", max_retries=0)
        with pytest.raises(ModelNotServed, match=r"^the server at http://127\.0\.0\.1:\d+/v1 does not serve "
                                                  r"'other-model'; it serves: fake-model$"):
            env.evaluate_sync(config, "other-model", rollouts_per_example=1)
        assert server.requests == []  # no rollout was sent
        vf_eval = Path(sys.executable).parent / "vf-eval"
        if not vf_eval.exists():
            pytest.skip(f"verifiers' vf-eval script is not next to {sys.executable}")
        env_vars = {**os.environ, "FAKE_OPENAI_KEY": "fake",
                    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run(
            [str(vf_eval), "turngym.integrations.verifiers_env", "-a", json.dumps({"indices": [3]}),
             "-m", "other-model", "-b", server.base_url, "-k", "FAKE_OPENAI_KEY", "-n", "1", "-r", "1",
             "--disable-tui", "--output-dir", str(tmp_path)],
            capture_output=True, text=True, env=env_vars, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: the server at {server.base_url} does not serve 'other-model'; it serves: fake-model"]


# --- against a real server: ``transformers serve`` with the tiny random chat model (the ``served`` fixture) ---

MAX_TOKENS = 12


def served_sampling(model_dir: str, replies: str = "any") -> dict:
    """verifiers sampling args for the tiny random model behind ``transformers serve``. Its greedy reply
    is newlines only, so the requests sample (``do_sample`` in the server's ``generation_config``
    request field) and every rollout plays different garbage. ``replies`` narrows the garbage with
    the same field: ``"digits"`` suppresses every token that is not a digit string (Digits-v0's
    per-turn rewards, digit shares, are then 1.0); ``"open_calc"`` makes each reply ``<calc>`` and
    digits, never closed, so the token limit cuts it with the tag open."""
    from transformers import AutoTokenizer, GenerationConfig

    defaults = GenerationConfig.from_pretrained(model_dir)
    config: dict = {"do_sample": True, "top_k": 0, "eos_token_id": defaults.eos_token_id,
                    "pad_token_id": defaults.pad_token_id}
    tok = AutoTokenizer.from_pretrained(model_dir)
    digits = [i for i in range(len(tok)) if tok.decode([i]).isdigit()]
    if replies == "digits":
        config["suppress_tokens"] = [i for i in range(len(tok)) if i not in digits]
    elif replies == "open_calc":
        opener = tok("<calc>", add_special_tokens=False)["input_ids"]  # several tokens: "<", "calc", ">"
        config["suppress_tokens"] = [i for i in range(len(tok)) if i not in digits and i not in opener]
        config["begin_suppress_tokens"] = [i for i in range(len(tok)) if i != opener[0]]
        config["sequence_bias"] = ([[[a, b], 1e4] for a, b in itertools.pairwise(opener)]  # spell "<calc>" out
                                   + [[[a, o], -1e4] for a in digits + opener[-1:] for o in opener])  # once
    else:
        assert replies == "any"
    return {"max_tokens": MAX_TOKENS, "extra_body": {"generation_config": json.dumps(config)}}


def field(obj, name: str):
    """A field of an in-memory verifiers record (a model) or of its saved JSON (a dict)."""
    return obj[name] if isinstance(obj, dict) else getattr(obj, name)


def expected_action(raw: str, finish_reason: str | None, stop) -> str:
    """The action a reply should reach the env as, worked out here rather than by the code under test:
    the raw text up to and including a stop string it holds; else, where the server says a stop string
    ended it (finish "stop"), the one it dropped: the closer of the last tag the text opened and never
    closed, if that closer is a stop string; else the raw text as it is."""
    import re

    hits = [(raw.find(s), s) for s in stop if s in raw]
    if hits:
        at, first = min(hits)
        return raw[: at + len(first)]
    opened = re.findall(r"<([A-Za-z_]\w*)>", raw)
    if finish_reason in ("stop", None) and opened and f"</{opened[-1]}>" in stop:
        return raw + f"</{opened[-1]}>"  # no stop string is in the text, so this tag is open
    return raw


def test_expected_action_puts_back_only_a_dropped_stop_string():
    assert expected_action("<calc>2+2", "stop", STOP) == "<calc>2+2</calc>"
    assert expected_action("<calc>2+2", "length", STOP) == "<calc>2+2"
    assert expected_action("<calc>2+2</calc> more", "length", STOP) == "<calc>2+2</calc>"
    assert expected_action("no tag", "stop", STOP) == "no tag"
    assert expected_action("<think>x", "stop", STOP) == "<think>x"  # its closer is no stop string


def test_the_action_is_the_reply_the_finish_reason_belongs_to():
    """env_response reads the text and the finish reason from the same reply (the trajectory's latest
    response), so a transcript message that differs cannot pair one reply's text with another's finish."""
    import asyncio

    env = load_environment("Calculator-v0", indices=[3], max_turns=2)
    state = {"info": {"index": 3}, "example_id": 0}
    asyncio.run(env.setup_state(state))
    reply = vf.ResponseMessage(role="assistant", content="<calc>2+2", finish_reason="stop", is_truncated=False)
    state["trajectory"] = [{"response": vf.Response(id="r", created=0, model="m", message=reply)}]
    out = asyncio.run(env.env_response([{"role": "assistant", "content": "<calc>7*7"}], state))
    (turn,) = state[EPISODE_KEY].turns
    assert turn.action == "<calc>2+2</calc>" and "<result>4</result>" in turn.observation
    assert message_text(out[0]) == turn.observation


def check_rows_replay_in_gymnasium(rows, env, reward_name: str, env_kwargs: dict) -> list[Episode]:
    """Each result row (an ``evaluate_sync`` output or a vf-eval results.jsonl line, saved with the
    ``turngym_record`` and ``trajectory`` columns) is a turngym episode equal to ``gymnasium.make``
    replaying the model's replies from verifiers' trajectory; its reward is the turngym reward's on
    that replay, per turn on the trajectory steps. Returns the replays."""
    reward = get_reward(reward_name)
    replays = []
    for row in rows:
        assert row["error"] is None
        ep = Episode.from_dict(row["turngym_record"])
        index = row["info"]["index"]
        steps = row["trajectory"]
        replies = [field(step["response"], "message") for step in steps]
        actions = [expected_action(message_text(r), field(r, "finish_reason"), env.stop) for r in replies]
        gym_env = gymnasium.make(env.turngym_env_id, **env_kwargs)
        gym_env.reset(options={"index": index})
        for i, a in enumerate(actions):
            _, _, term, trunc, _ = gym_env.step(a)
            assert (term or trunc) == (i == len(actions) - 1)  # the rollout ended where the env did
        want = gym_env.unwrapped.episode
        gym_env.close()
        assert ep.task["index"] == index and ep.prompt == want.prompt
        assert [t.action for t in ep.turns] == actions == [t.action for t in want.turns]
        assert [t.observation for t in ep.turns] == [t.observation for t in want.turns]
        assert [t.reward for t in ep.turns] == [t.reward for t in want.turns]
        assert [t.parse_error for t in ep.turns] == [t.parse_error for t in want.turns]
        assert (ep.terminated, ep.truncated, ep.outcome) == (want.terminated, want.truncated, want.outcome)
        # the transcript: the model's replies, each followed by the observation as a user message
        assert [field(m, "role") for m in row["completion"]] == ["assistant", "user"] * (len(actions) - 1) + ["assistant"]
        assert [message_text(m) for m in row["completion"][::2]] == [message_text(s["completion"][-1]) for s in steps]
        assert [message_text(m) for m in row["completion"][1::2]] == [t.observation for t in want.turns[:-1]]
        (per_turn,) = reward.score_group([want]).rewards  # outcome and env score each episode on its own
        assert row["reward"] == pytest.approx(sum(per_turn))
        assert row["metrics"][f"turngym_{reward_name}"] == row["reward"]
        assert [step["reward"] for step in steps] == pytest.approx(per_turn)  # one verifiers step per turn
        replays.append(want)
    return replays


@pytest.mark.parametrize(("env_name", "reward_name", "indices", "env_kwargs", "replies"), [
    ("Calculator-v0", "outcome", [3, 5], {"max_turns": 2}, "any"),
    ("Digits-v0", "env", [0, 1], {}, "digits"),
])
def test_evaluate_against_a_real_server_plays_gymnasium_episodes(served, monkeypatch, env_name, reward_name, indices,
                                                                 env_kwargs, replies):
    url, model = served
    env = load_environment(env_name, reward=reward_name, indices=indices, **env_kwargs)
    monkeypatch.setenv("LOCAL_SERVER_KEY", "unused")  # verifiers wants a key variable; the server ignores it
    config = vf.ClientConfig(api_base_url=url, api_key_var="LOCAL_SERVER_KEY", max_retries=0)
    out = env.evaluate_sync(config, model, sampling_args=served_sampling(model, replies), rollouts_per_example=2,
                            state_columns=["turngym_record", "trajectory"])
    rows = out["outputs"]
    assert sorted(row["info"]["index"] for row in rows) == sorted(indices * 2)
    replays = check_rows_replay_in_gymnasium(rows, env, reward_name, env_kwargs)
    assert len({tuple(t.action for t in ep.turns) for ep in replays}) > 1  # sampled: the rollouts differ
    for row, ep in zip(rows, replays, strict=True):
        assert all(step["tokens"] is None for step in row["trajectory"])  # this server returns no token ids
        # its usage reached verifiers: at most MAX_TOKENS a reply (the sampling args went through)
        assert 0 < row["token_usage"]["output_tokens"] <= MAX_TOKENS * len(ep.turns)
    if replies == "digits":  # digit strings of MAX_TOKENS tokens (end of text suppressed): per-turn rewards 1.0
        assert all(t.action.isdigit() and t.reward == 1.0 for ep in replays for t in ep.turns)
        assert all(row["token_usage"]["output_tokens"] == MAX_TOKENS * 2 for row in rows)
        assert all([step["reward"] for step in row["trajectory"]] == [1.0, 1.0] for row in rows)


def test_a_reply_cut_at_the_token_limit_keeps_its_tag_open_on_a_real_server(served, monkeypatch):
    """The stop string is put back only where the server says one ended the reply: ``<calc>`` and
    digits cut at the token limit (finish "length") is sent as it is, and the env reports the open tag
    (closing it would run a calculation the model never asked for)."""
    url, model = served
    env = load_environment("Calculator-v0", indices=[3], max_turns=2)
    monkeypatch.setenv("LOCAL_SERVER_KEY", "unused")
    config = vf.ClientConfig(api_base_url=url, api_key_var="LOCAL_SERVER_KEY", max_retries=0)
    out = env.evaluate_sync(config, model, sampling_args=served_sampling(model, "open_calc"),
                            state_columns=["turngym_record", "trajectory"])
    (row,) = out["outputs"]
    (ep,) = check_rows_replay_in_gymnasium([row], env, "outcome", {"max_turns": 2})
    assert [step["response"].message.finish_reason for step in row["trajectory"]] == ["length", "length"]
    for turn, reply in zip(ep.turns, row["completion"][::2], strict=True):
        assert turn.action == message_text(reply)
        assert turn.action.startswith("<calc>") and turn.action.removeprefix("<calc>").isdigit()
        assert "never closed" in turn.parse_error


def test_vf_eval_cli_against_a_real_server(served, tmp_path):
    vf_eval = Path(sys.executable).parent / "vf-eval"
    if not vf_eval.exists():
        pytest.skip(f"verifiers' vf-eval script is not next to {sys.executable}")
    url, model = served
    indices, env_kwargs = [3, 5], {"max_turns": 2}
    env_vars = {**os.environ, "LOCAL_SERVER_KEY": "unused",
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [str(vf_eval), "turngym.integrations.verifiers_env",
         "-a", json.dumps({"turngym_env": "Calculator-v0", "indices": indices, **env_kwargs}),
         "-m", model, "-b", url, "-k", "LOCAL_SERVER_KEY", "-n", "2", "-r", "1", "-t", str(MAX_TOKENS),
         "-S", json.dumps({"extra_body": served_sampling(model)["extra_body"]}),
         "--disable-tui", "--save-results", "--output-dir", str(tmp_path),
         "--state-columns", "turngym_record,trajectory"],
        capture_output=True, text=True, env=env_vars, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = tmp_path.rglob("results.jsonl")
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(row["info"]["index"] for row in rows) == indices
    env = load_environment("Calculator-v0", indices=indices, **env_kwargs)
    check_rows_replay_in_gymnasium(rows, env, "outcome", env_kwargs)


def test_an_unserved_model_on_a_real_server_names_what_it_serves(served, monkeypatch):
    from turngym.integrations.verifiers_env import served_models

    url, model = served
    listed = served_models(url)
    if listed is None:
        pytest.skip("this transformers serve does not answer GET /models")
    assert model in listed
    monkeypatch.setenv("LOCAL_SERVER_KEY", "unused")
    config = vf.ClientConfig(api_base_url=url, api_key_var="LOCAL_SERVER_KEY", max_retries=0)
    env = load_environment("Calculator-v0", indices=[3])
    with pytest.raises(ModelNotServed, match=f"does not serve 'no-such-model'; it serves: .*{model}"):
        env.evaluate_sync(config, "no-such-model")


@pytest.mark.parametrize("tools", [False, True], ids=["text", "tools"])
def test_the_rollouts_advantage_is_the_turngym_rewards_after_verifiers_monitors_score(tools):
    """verifiers adds its turn (and tool-call) monitor rubrics to the env's; a rubric group keeps the last
    member's ``state["advantage"]``, so the turngym rubric scores last and a group of a right and a wrong episode
    keeps its advantages (a monitor scoring last set them to 0)."""
    import asyncio

    import gymnasium

    from turngym.integrations.edges import score_groups
    from turngym.integrations.verifiers_env import EPISODE_KEY
    from turngym.integrations.verifiers_tools import load_environment as load_tool_environment

    env = (load_tool_environment if tools else load_environment)("Calculator-v0", reward="outcome", indices=[0])
    episodes = []
    for answer in ("5343", "1"):  # item 0's answer is 5343 (the calculator's first item)
        calc = gymnasium.make("turngym/Calculator-v0", max_turns=2)
        calc.reset(options={"index": 0, "group": "g"})
        calc.step(f"<answer>{answer}</answer>")
        episodes.append(calc.unwrapped.episode)
    want = score_groups(get_reward("outcome"), episodes)
    assert want.advantages[0][0] > 0 > want.advantages[1][0]
    states = [{EPISODE_KEY: ep, "trajectory": [{"reward": None, "advantage": None}], "prompt": [], "completion": [],
               "responses": [], "turn": 1} for ep in episodes]
    asyncio.run(env.rubric.score_group(states))
    assert [s["advantage"] for s in states] == [a[0] for a in want.advantages]
    assert [s["reward"] for s in states] == [1.0, 0.0]
