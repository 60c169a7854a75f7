"""turngym envs served as OpenEnv environments, driven by OpenEnv's own client from the real package
over a real server (OpenEnv's FastAPI app on uvicorn, loopback WebSocket sessions), and an OpenEnv
env played by turngym's rollout runner. The reference is always ``gymnasium.make`` in-process."""

import contextlib
import dataclasses
import json
import socket
import threading
import time

import gymnasium
import pytest

pytest.importorskip("openenv", reason="the [openenv] extra is not installed")

import uvicorn  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

import turngym  # noqa: E402,F401 - registers the envs
from turngym.agents.policy import Generation, PolicyBase, SamplingParams  # noqa: E402
from turngym.agents.runner import RolloutRunner  # noqa: E402
from turngym.integrations.openenv import (  # noqa: E402
    TurnAction,
    TurngymEnvClient,
    TurnObservation,
    make_app,
)
from turngym.run.backends.openenv import OpenEnvTextEnv  # noqa: E402

SCRIPTS = {
    # item 3 is "What is 80 * 10 + 19?": a calculation, a malformed reply, the right answer
    "turngym/Calculator-v0": (3, ["<calc>80*10+19</calc>", "I think <calc>80*", "<answer>819</answer>"]),
    "turngym/Digits-v0": (5, ["12 34", "one 2"]),
}


class Served:
    """OpenEnv's app for one env on a free loopback port, run by uvicorn in a thread."""

    def __init__(self, env_id, **env_kwargs):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.server = uvicorn.Server(uvicorn.Config(make_app(env_id, **env_kwargs), host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the OpenEnv server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(params=sorted(SCRIPTS))
def served(request):
    server = Served(request.param)
    yield request.param, server
    server.close()


def reference(env_id, index, actions, seed=7, **env_kwargs):
    """The episode in-process: what reset and each step return, and the record."""
    env = gymnasium.make(env_id, **env_kwargs)
    obs, info = env.reset(seed=seed, options={"index": index, "episode_id": "ep-1"})
    steps = [(obs, 0.0, False, False, info)]
    for a in actions:
        steps.append(env.step(a))
        if steps[-1][2] or steps[-1][3]:
            break
    return steps, env.unwrapped.episode


def record(ep_dict):
    """An episode record without its timings (wall-clock differs between any two runs)."""
    d = json.loads(json.dumps(ep_dict))  # tuples as JSON lists, as the server sends them
    d["turns"] = [{k: v for k, v in t.items() if k != "latency_ms"} for t in d["turns"]]
    d["meta"] = {k: v for k, v in d["meta"].items() if k not in ("wall_ms", "openenv")}
    return d


def test_openenv_generic_client_plays_the_same_episode_as_gymnasium(served):
    env_id, server = served
    index, actions = SCRIPTS[env_id]
    expected, ep = reference(env_id, index, actions)
    with GenericEnvClient(base_url=server.url).sync() as client:
        first = client.reset(seed=7, index=index, episode_id="ep-1")
        assert first.observation["text"] == expected[0][0] and first.observation["info"] == expected[0][4]
        assert first.observation["messages"] == ep.prompt
        mid = client.state()["episode"]
        assert not set(mid["task"]) & {"answers", "answer"}  # no labels while the episode runs
        got = []
        for a in actions[:len(expected) - 1]:
            r = client.step({"text": a})
            o = r.observation
            got.append((o["text"], r.reward, o["terminated"], o["truncated"], o["info"]))
            assert r.done == (o["terminated"] or o["truncated"])
        assert got == [tuple(s) for s in expected[1:]]
        assert got[0][4]["turn"]["metrics"] == ep.turns[0].metrics  # per-turn metrics reach the client
        state = client.state()
    assert state["env_id"] == env_id and state["step_count"] == len(got)
    assert record(state["episode"]) == record(ep.to_dict())  # the graded record, labels and outcome included


def test_mathcode_through_openenv_runs_its_cells_in_the_session_sandbox():
    """MathCode-v0 (a sandboxed interpreter per episode): state kept across cells, the same episode."""
    actions = ["```python\nx = 6 * 7\nprint(x)\n```", "```python\nprint(x + 1)\n```", "So \\boxed{43}"]
    expected, ep = reference("turngym/MathCode-v0", 0, actions, dataset="gsm8k", max_turns=4)
    server = Served("MathCode-v0", dataset="gsm8k", max_turns=4)
    try:
        with GenericEnvClient(base_url=server.url).sync() as client:
            client.reset(seed=7, index=0, episode_id="ep-1")
            got = [client.step({"text": a}) for a in actions]
            state = client.state()
    finally:
        server.close()
    assert [r.observation["text"] for r in got] == [s[0] for s in expected[1:]]
    assert "43" in got[1].observation["text"]  # x survived from the first cell
    theirs, mine = record(state["episode"]), record(ep.to_dict())
    # the sandbox record describes each process's own pool (its size, its cgroup); the isolation is the same
    assert theirs["meta"].pop("sandbox")["isolation"] == mine["meta"].pop("sandbox")["isolation"]
    assert theirs == mine and theirs["outcome"]["correct"] is False and theirs["final_answer"] == "43"


def test_typed_client_round_trips_typed_models():
    server = Served("Calculator-v0")
    try:
        with TurngymEnvClient(base_url=server.url).sync() as client:
            r = client.reset(index=3)
            assert isinstance(r.observation, TurnObservation) and r.observation.stop == ["</calc>", "</answer>"]
            r = client.step(TurnAction(text="<answer>819</answer>"))
            assert r.done and r.reward == 1.0 and r.observation.terminated
            state = client.state()
            assert state.episode["outcome"]["correct"] is True and state.episode["final_answer"] == "819"
    finally:
        server.close()


def test_bad_reset_options_get_one_clear_message():
    server = Served("Calculator-v0")
    try:
        with GenericEnvClient(base_url=server.url).sync() as client:
            with pytest.raises(RuntimeError, match=r"out of range: the dataset has 10000 items"):
                client.reset(index=10**9)
            with pytest.raises(RuntimeError, match=r"reset takes seed, episode_id, index, task, group; got \['colour'\]"):
                client.reset(colour="red")
            assert client.reset(index=1).observation["info"]["task"]["index"] == 1  # the session survives
    finally:
        server.close()


def test_unknown_env_is_refused_before_serving():
    with pytest.raises(ValueError, match=r"unknown env 'turngym/Nope-v0'; turngym envs: .*Calculator-v0"):
        make_app("Nope-v0")


@dataclasses.dataclass
class FakeScriptedTextPolicy(PolicyBase):
    """A fake chat policy for this test: reply ``n`` is ``script[n]``, n = the script's replies already in
    the transcript (in order; observations may be appended to them)."""

    script: list
    name: str = "fake-scripted-text"
    tokenizer: object = None

    def generate(self, requests, sampling):
        out = []
        for req in requests:
            said = "".join(m["content"] for m in req.messages if m["role"] == "assistant")
            n = pos = 0
            while n < len(self.script) and self.script[n] in said[pos:]:
                pos = said.index(self.script[n], pos) + len(self.script[n])
                n += 1
            out.append(Generation(text=self.script[min(n, len(self.script) - 1)]))
        return out


def test_runner_plays_an_openenv_env_as_it_plays_the_env_in_process():
    _, actions = SCRIPTS["turngym/Calculator-v0"]
    policy = FakeScriptedTextPolicy(actions)
    sampling = SamplingParams(max_new_tokens=16)
    local = RolloutRunner(policy=policy, env_factory=lambda: gymnasium.make("turngym/Calculator-v0"), sampling=sampling)
    [want] = local.run([3])
    server = Served("Calculator-v0")
    envs = []

    def remote():
        envs.append(OpenEnvTextEnv(server.url))
        return envs[-1]

    try:
        [got] = RolloutRunner(policy=policy, env_factory=remote, sampling=sampling).run([3])
    finally:
        for env in envs:
            env.close()
        server.close()
    assert [t.action for t in got.turns] == actions
    assert record(got.to_dict()) == record(want.to_dict())


def test_an_episode_the_runner_ends_for_its_token_budget_is_graded_by_the_server_as_in_process():
    """Running out of budget is the policy's doing: the served env grades the episode as it stands (wrong, never
    ungraded, which would give it advantage 0), the same record as the env in-process."""
    actions = ["<calc>84 * 63</calc>"]
    local = gymnasium.make("turngym/Calculator-v0")
    local.reset(seed=7, options={"index": 0, "episode_id": "ep-1"})
    local.step(actions[0])
    local.unwrapped.end_episode("episode_token_budget")
    want = local.unwrapped.episode
    server = Served("Calculator-v0")
    env = OpenEnvTextEnv(server.url)
    try:
        env.reset(seed=7, options={"index": 0, "episode_id": "ep-1"})
        env.step(actions[0])
        env.end_episode("episode_token_budget")
        got = env.episode
    finally:
        env.close()
        server.close()
    assert want.outcome["correct"] is False and want.outcome.get("graded") is not False
    assert got.outcome == want.outcome and got.truncated and got.meta["truncation"] == "episode_token_budget"
    assert not got.ungraded and [t.truth for t in got.turns] == [t.truth for t in want.turns]


def test_the_openenv_client_is_an_env_handle_of_its_own_not_a_text_env():
    """The client implements the runner's declared env face itself (no TextEnv with an ``act`` never called);
    a server that cannot grade an episode ended from outside leaves it ungraded with the error, not a raise."""
    from turngym.agents.checker import check_env_handle
    from turngym.envs.base import TextEnv

    server = Served("Calculator-v0")
    env = OpenEnvTextEnv(server.url)
    try:
        assert not isinstance(env, TextEnv) and not hasattr(env, "act")
        check_env_handle(env)
        env.reset(seed=0, options={"index": 0})
        env.step("<calc>2 * 3</calc>")
        server.close()  # the server is gone before the runner ends the episode
        env.end_episode("episode_token_budget")
        ep = env.episode
        assert ep.truncated and ep.outcome["graded"] is False and ep.outcome["grading_error"]["type"]
    finally:
        with contextlib.suppress(Exception):
            env.close()
        server.close()


def test_an_outside_env_is_recorded_from_the_fields_it_is_told_to_read():
    """A non-turngym OpenEnv server (here turngym's, read only through the generic fields) still
    gives an episode: the reset text is the prompt, each step's text the observation."""
    server = Served("Digits-v0")
    try:
        env = OpenEnvTextEnv(server.url, served_by_turngym=False, action_field="text", observation_field="text")
        obs, _ = env.reset(seed=0, options={"index": 5})
        assert env.episode.prompt == [{"role": "user", "content": obs}]
        env.step("12")
        _, reward, terminated, truncated, _ = env.step("1a")
        assert terminated and not truncated and reward == 0.5
        assert [t.reward for t in env.episode.turns] == [1.0, 0.5] and env.episode.outcome == {"return": 1.5}
        env.close()
        with pytest.raises(ValueError, match=r"without 'output'"):
            other = OpenEnvTextEnv(server.url, served_by_turngym=False, observation_field="output")
            try:
                other.reset(options={"index": 5})
            finally:
                other.close()
    finally:
        server.close()


@pytest.mark.slow
def test_one_trl_training_step_on_an_openenv_env(tmp_path):
    """TRL's OpenEnv path: GRPOTrainer's ``rollout_func`` (turngym's TurnGRPOTrainer) plays its rollouts on
    an OpenEnv server, one real optimiser step on a tiny random model."""
    import math
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from turngym.agents.tiny import tiny_model_dir
    from turngym.rewards import get_reward
    from turngym.training.trainer import TurnGRPOTrainer, task_dataset

    server = Served("Digits-v0")
    envs = []

    def remote():
        envs.append(OpenEnvTextEnv(server.url))
        return envs[-1]

    try:
        d = str(tiny_model_dir(chat=True))
        torch.manual_seed(0)
        model, tok = AutoModelForCausalLM.from_pretrained(d), AutoTokenizer.from_pretrained(d)
        args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                          max_completion_length=16, max_steps=1, logging_steps=1, report_to="none", use_cpu=True,
                          learning_rate=1e-2, save_strategy="no", seed=0, temperature=1.0)
        tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=remote, reward=get_reward("outcome"),
                             args=args, train_dataset=task_dataset(range(4)), estimator="turn")
        tr.train()
    finally:
        for env in envs:
            env.close()
        server.close()
    assert tr.state.global_step == 1 and all(math.isfinite(h.get("loss", 0.0)) for h in tr.state.log_history)
    played = [e.episode for e in envs if e.episode is not None]  # (one env only told the runner its stop strings)
    assert played and all(ep.env_id == "turngym/Digits-v0" and ep.done and ep.prompt_ids for ep in played)
    assert all(t.action_ids for ep in played for t in ep.turns)  # the ids the step trained on came with the episodes


def test_serve_env_command_refuses_bad_input_with_one_line():
    from turngym.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["serve-env", "--env", "Nope-v0"])
    assert (args.host, args.port, args.max_sessions) == ("127.0.0.1", 8000, 64)
    with pytest.raises(SystemExit, match=r"error: cannot serve Nope-v0: unknown env 'turngym/Nope-v0'"):
        args.run(args)
    args = parser.parse_args(["serve-env", "--env", "Digits-v0", "--env-arg", "colour=red"])
    with pytest.raises(SystemExit, match=r"error: cannot serve Digits-v0: .*unexpected keyword argument 'colour'"):
        args.run(args)
    args = parser.parse_args(["serve-env", "--env", "Digits-v0", "--max-sessions", "0"])
    with pytest.raises(SystemExit, match=r"--max-sessions must be >= 1"):
        args.run(args)
