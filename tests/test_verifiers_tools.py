"""turngym envs as verifiers tool environments (turngym.integrations.verifiers_tools), driven by verifiers' own
evaluation (``evaluate_sync``) against the fake OpenAI-compatible server of tests/test_verifiers_env.py replaying
scripted native tool calls: the tools verifiers offers are the env's declared ones, and each rollout's episode is
the one ``gymnasium.make`` gives when stepped with the declared tools' actions."""

from __future__ import annotations

import re

import gymnasium
import pytest

vf = pytest.importorskip("verifiers", reason="verifiers is not installed (pip install -e '.[verifiers]')")
if not hasattr(vf, "MultiTurnEnv"):
    pytest.skip(f"verifiers {vf.__version__} has no classic API (MultiTurnEnv); the [verifiers] extra pins 0.3",
                allow_module_level=True)

import turngym  # noqa: E402,F401 - registers the envs
from test_verifiers_env import FakeOpenAIServer, first_user_content  # noqa: E402
from turngym.envs.tools import find_tool  # noqa: E402
from turngym.episode import Episode  # noqa: E402
from turngym.integrations.edges import UntypedToolsError  # noqa: E402
from turngym.integrations.verifiers_tools import TurngymVerifiersToolEnv, load_environment  # noqa: E402
from turngym.rewards import get_reward  # noqa: E402


def tool_calls(*calls: tuple[str, dict]) -> dict:
    """A scripted reply that calls tools natively (the fake server's form)."""
    return {"tool_calls": list(calls)}


def declared_view(name: str, description: str, parameters: dict) -> dict:
    """A function schema as ``EnvTool.schema`` writes it: names, types, descriptions and required, without the
    extras verifiers' schema writer adds (titles, ``additionalProperties``)."""
    props = {k: {"type": v["type"], "description": v["description"]} for k, v in parameters["properties"].items()}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": parameters["type"], "properties": props, "required": parameters["required"]}}}


@pytest.mark.parametrize(("env_id", "env_kwargs"), [
    ("Calculator-v0", {}),
    ("SearchQA-v0", {"retriever": object()}),  # its tools need no retriever until a search runs
    ("MathCode-v0", {}),
    ("Digits-v0", {}),
])
def test_the_verifiers_tools_are_the_declared_ones(env_id, env_kwargs):
    env = load_environment(env_id, indices=[0], **env_kwargs)
    raw = gymnasium.make(f"turngym/{env_id}", **env_kwargs).unwrapped
    declared = [t.schema() for t in raw.declared_tools()]
    assert [declared_view(t.name, t.description, t.parameters) for t in env.tool_defs] == declared
    # the prompt is the item's task as one user message (the env's own prompt describes its text protocol)
    raw.reset(options={"index": 0})
    (row,) = env.get_eval_dataset()
    assert row["prompt"] == [{"role": "user", "content": raw.episode.task["question"]}]


# item index -> the model's replies
SCRIPTS = {
    3: [tool_calls(("calculator", {"expression": "80*10+19"})),
        tool_calls(("answer", {"answer": "819"}), ("calculator", {"expression": "1+1"}))],  # a call after the end
    5: [tool_calls(("calculator", {"expr": "2+2"}), ("calculator", {"expression": "2+2"})),  # an unknown argument
        tool_calls(("calculator", {"expression": "oops("})),
        tool_calls(("answer", {"answer": "-1"}))],
    7: [tool_calls(("calculator", {"expression": "7*7"})), "I give up."],  # a reply that calls no tool
    9: [tool_calls(("calculator", {"expression": 4})),  # a mistyped argument: no turn
        tool_calls(("calculator", {"expression": "42*86+95"}), ("answer", {"answer": "3707"}))],  # two turns, one reply
}
# the calls the env plays (those the declaration takes, until the episode ends), and each tool message's content
PLAYED = {
    3: [("calculator", {"expression": "80*10+19"}), ("answer", {"answer": "819"})],
    5: [("calculator", {"expression": "2+2"}), ("calculator", {"expression": "oops("}), ("answer", {"answer": "-1"})],
    7: [("calculator", {"expression": "7*7"})],
    9: [("calculator", {"expression": "42*86+95"}), ("answer", {"answer": "3707"})],
}
ANSWERED = "The answer was recorded; the episode has ended."
REFUSED = {3: {2: "the episode has ended; no further tool calls are taken"},
           5: {0: "tool 'calculator' takes expression; got unknown expr"},
           9: {0: "tool 'calculator': expression must be string, got 4"}}


def direct_episode(index: int, calls: list[tuple[str, dict]], env_id: str = "turngym/Calculator-v0") -> Episode:
    """The episode ``gymnasium.make`` gives when stepped with the declared tools' actions for ``calls``; one the
    calls leave running ends as the rollout's cleanup ends it (verifiers stopped: the model called no tool)."""
    env = gymnasium.make(env_id)
    env.reset(options={"index": index})
    raw = env.unwrapped
    for name, arguments in calls:
        env.step(find_tool(raw.declared_tools(), name).to_action(arguments))
    raw.end_episode("the verifiers rollout ended first (no_tools_called)")  # no-op where the episode has ended
    ep = raw.episode
    env.close()
    return ep


def test_tool_calls_play_the_episode_gymnasium_plays(monkeypatch):
    expected = {i: direct_episode(i, PLAYED[i]) for i in SCRIPTS}
    assert [expected[i].outcome["correct"] for i in sorted(expected)] == [True, False, False, True]
    env = load_environment("Calculator-v0", indices=sorted(SCRIPTS))
    declared = [t.schema() for t in env.env_tools]
    scripts = {first_user_content(row["prompt"]): SCRIPTS[row["info"]["index"]] for row in env.get_eval_dataset()}
    monkeypatch.setenv("FAKE_OPENAI_KEY", "fake")
    with FakeOpenAIServer(scripts) as server:
        config = vf.ClientConfig(api_base_url=server.base_url, api_key_var="FAKE_OPENAI_KEY", max_retries=0)
        out = env.evaluate_sync(config, "fake-model", rollouts_per_example=2,
                                state_columns=["turngym_record", "trajectory", "stop_condition"])
    for request in server.requests:  # the tools the model was offered: the declared ones, no stop strings
        assert [declared_view(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
                for t in request["tools"]] == declared
        assert "stop" not in request

    outputs = out["outputs"]
    assert sorted(o["info"]["index"] for o in outputs) == sorted(list(SCRIPTS) * 2)
    for o in outputs:
        index = o["info"]["index"]
        ep, want = Episode.from_dict(o["turngym_record"]), expected[index]
        assert o["error"] is None and ep.task["index"] == index
        assert [t.action for t in ep.turns] == [t.action for t in want.turns]
        assert [t.observation for t in ep.turns] == [t.observation for t in want.turns]
        assert [t.reward for t in ep.turns] == [t.reward for t in want.turns]
        assert (ep.terminated, ep.truncated, ep.outcome) == (want.terminated, want.truncated, want.outcome)
        assert ep.meta.get("truncation") == want.meta.get("truncation") and ep.group is not None
        # the rollout ended where the episode did: the answering tool, or a reply without a tool call
        assert o["stop_condition"] == ("no_tools_called" if index == 7 else "has_final_env_response")
        # each tool message: the observation, the end of the episode, or the declaration's refusal
        results = [m["content"] for m in o["completion"] if m["role"] == "tool"]
        answers = [ANSWERED if want.terminated and t == len(want.turns) - 1 else turn.observation.strip()
                   for t, turn in enumerate(want.turns)]
        refused = REFUSED.get(index, {})
        assert [c for k, c in enumerate(results) if k not in refused] == answers
        assert {k: results[k] for k in refused} == refused
        # the rubric: turngym's outcome reward, per turn on verifiers' steps where each step made one turn
        (per_turn,) = get_reward("outcome").score_group([want]).rewards
        assert o["reward"] == sum(per_turn) == (1.0 if want.outcome["correct"] else 0.0)
        assert o["metrics"]["turngym_outcome"] == o["reward"]
        steps = [s["reward"] for s in o["trajectory"]]
        assert steps == (per_turn if index in (3, 5) else [o["reward"]] * len(o["trajectory"]))


def test_verifiers_loader_rebuilds_it_from_its_arguments():
    env = load_environment("Calculator-v0", num_examples=2, max_turns=3)
    again = vf.load_environment(env.env_id, **env.env_args)  # what verifiers' env-server worker does
    assert isinstance(again, TurngymVerifiersToolEnv) and again.env_id == "turngym.integrations.verifiers_tools"
    assert again.tool_defs == env.tool_defs and again.env_kwargs == {"max_turns": 3}
    assert [row["info"]["index"] for row in again.get_eval_dataset()] == [0, 1]


def test_an_env_without_static_tools_is_refused_with_its_reason():
    from turngym.envs.bfcl.env import BFCLEnv

    with pytest.raises(UntypedToolsError, match=f"^turngym/BFCL-v0 cannot be a verifiers tool env: "
                                                f"{re.escape(BFCLEnv.static_tools_absent)}$"):
        load_environment("BFCL-v0", indices=[0])
    with pytest.raises(UntypedToolsError, match="^turngym/DelayedEffect-v0 declares no tools for a verifiers tool env"):
        load_environment("DelayedEffect-v0", indices=[0])
