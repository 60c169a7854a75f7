"""Envs declare their tools (turngym.envs.tools): name, typed parameters, description, how a call becomes the
env's action, which call ends the episode. Every adapter with a tool surface builds it from the declaration,
so a tag renamed inside an env is followed by TRL's tool methods, SkyRL's tool group, the OpenEnv server's
tool calls and verifiers' tool env at once."""

from __future__ import annotations

import gymnasium
import pytest

import turngym  # noqa: F401 - registers the envs
from turngym.envs.calculator import CalculatorEnv
from turngym.envs.tools import EnvTool, ToolCallError, ToolParam

DECLARING = {"turngym/Calculator-v0": ("calculator", "answer"), "turngym/Digits-v0": ("reply",),
             "turngym/MathCode-v0": ("run_python", "answer"), "turngym/SearchQA-v0": ("search", "answer")}


def raw_env(env_id: str):
    kwargs = {"retriever": object()} if "SearchQA" in env_id else {}
    return gymnasium.make(env_id, **kwargs).unwrapped


@pytest.mark.parametrize("env_id", sorted(DECLARING))
def test_each_env_declares_its_tools_and_one_answering_tool_ends_it(env_id):
    env = raw_env(env_id)
    tools = env.declared_tools()
    assert tuple(t.name for t in tools) == DECLARING[env_id] and env.static_tools_absent is None
    for t in tools:
        schema = t.schema()["function"]
        assert schema["name"] == t.name and schema["description"]
        assert schema["parameters"]["required"] == [p.name for p in t.params]
    assert [t.ends_episode for t in tools].count(True) == (0 if env_id.endswith("Digits-v0") else 1)


def test_a_declared_call_is_the_envs_own_action():
    env = gymnasium.make("turngym/Calculator-v0")
    env.reset(options={"index": 0})
    calc, answer = env.unwrapped.declared_tools()
    obs, _, terminated, _, _ = env.step(calc.to_action({"expression": "6*7"}))
    assert obs.strip() == "<result>42</result>" and not terminated
    assert env.step(answer.to_action({"answer": "5343"}))[2]  # the answering tool ends the episode
    native = gymnasium.make("turngym/SearchQA-v0", retriever=object(), tool_format="native").unwrapped
    assert native.declared_tools()[0].to_action({"query": "q"}).startswith("<tool_call>\n{\"name\": \"search\"")


def test_bfcl_says_why_it_declares_no_static_tools():
    from turngym.envs.bfcl.env import BFCLEnv

    assert "differ from entry to entry" in BFCLEnv.static_tools_absent


def test_a_bad_call_is_one_message():
    tool = EnvTool("f", "d", (ToolParam("n", int, "a number"),), lambda a: str(a["n"]))
    with pytest.raises(ToolCallError, match="takes n; got unknown m"):
        tool.to_action({"n": 1, "m": 2})
    with pytest.raises(ToolCallError, match="needs 'n'"):
        tool.to_action({})
    with pytest.raises(ToolCallError, match="n must be integer, got True"):
        tool.to_action({"n": True})
    with pytest.raises(TypeError, match="type must be one of"):
        ToolParam("x", list, "a list")


class FakeComputeCalculator(CalculatorEnv):
    """The Calculator with its tag renamed (a fake for this test: the rename an env author would make)."""

    env_name = "turngym/FakeComputeCalculator-v0"
    calc_tag = "compute"


@pytest.fixture
def renamed():
    env_id = FakeComputeCalculator.env_name
    gymnasium.register(env_id, entry_point=FakeComputeCalculator)
    yield env_id
    del gymnasium.registry[env_id]


def test_a_renamed_tag_is_followed_by_every_adapter(renamed, monkeypatch):
    from turngym.integrations.trl import environment_factory

    trl_env = environment_factory(renamed)()
    trl_env.reset(index=0)
    assert trl_env.calculator(expression="6*7") == "<result>42</result>"
    assert trl_env.episode.turns[-1].action == "<compute>6*7</compute>"

    pytest.importorskip("skyrl_gym")
    from turngym.integrations.skyrl import make_env

    sky = make_env(renamed, extras={"index": 0})
    _, info = sky.init()
    assert [t["function"]["name"] for t in info["env_tools"]] == ["calculator", "answer"]
    assert sky.tool_action("calculator", {"expression": "6*7"}) == "<compute>6*7</compute>"
    assert "<result>42</result>" in sky.step(sky.tool_action("calculator", {"expression": "6*7"}))["observations"][0]["content"]

    pytest.importorskip("openenv")
    from turngym.integrations.openenv import TurnAction, TurngymEnvironment

    served = TurngymEnvironment(renamed)
    opened = served.reset(index=0)
    assert [t["function"]["name"] for t in opened.env_tools] == ["calculator", "answer"]
    assert "<compute>" in opened.messages[0]["content"] and opened.stop == ["</compute>", "</answer>"]
    obs = served.step(TurnAction(text="", tool="calculator", arguments={"expression": "6*7"}))
    assert obs.text.strip() == "<result>42</result>"
    assert served.env.unwrapped.episode.turns[-1].action == "<compute>6*7</compute>"
    with pytest.raises(ToolCallError, match="no tool 'calc'"):
        served.step(TurnAction(text="", tool="calc", arguments={"expression": "1"}))

    vf = pytest.importorskip("verifiers")
    from test_verifiers_env import FakeOpenAIServer  # the verifiers tests' scripted chat server (skips on v1-only)
    from turngym.episode import Episode
    from turngym.integrations.verifiers_tools import load_environment

    vf_env = load_environment(renamed, indices=[0])
    assert [t.name for t in vf_env.tool_defs] == ["calculator", "answer"]
    (row,) = vf_env.get_eval_dataset()
    replies = [{"tool_calls": [("calculator", {"expression": "6*7"})]}, {"tool_calls": [("answer", {"answer": "42"})]}]
    monkeypatch.setenv("FAKE_OPENAI_KEY", "fake")
    with FakeOpenAIServer({row["prompt"][0]["content"]: replies}) as fake:
        config = vf.ClientConfig(api_base_url=fake.base_url, api_key_var="FAKE_OPENAI_KEY", max_retries=0)
        (out,) = vf_env.evaluate_sync(config, "fake-model", state_columns=["turngym_record"])["outputs"]
    played = Episode.from_dict(out["turngym_record"])
    assert [t.action for t in played.turns] == ["<compute>6*7</compute>", "<answer>42</answer>"]
    assert played.turns[0].observation.strip() == "<result>42</result>" and played.terminated
