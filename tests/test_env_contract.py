"""Every registered env keeps the turngym env contract (turngym.envs.checker), in each mode it offers."""

import json

import gymnasium
import pytest

import turngym  # noqa: F401
from turngym.envs import ENTRY_POINTS
from turngym.envs.base import ActionResult, TextEnv
from turngym.envs.checker import ContractError, check_text_env
from turngym.episode import RewardNeeds

SEARCH_PASSAGES = [{"id": "p1", "title": "Paris", "text": "Paris is the capital of France."}]

# each registered env with the arguments that pick each of its modes (tests on real data and backends)
CONFIGS = {
    "turngym/Calculator-v0": [{}, {"prompt_style": "base"}],
    "turngym/Digits-v0": [{}],
    "turngym/MathCode-v0": [{"dataset": "gsm8k"}, {"dataset": "aime24", "prompt_style": "base"}],
    "turngym/SearchQA-v0": [{"dataset": "hotpotqa"}, {"dataset": "nq", "prompt_style": "base"}],
    "turngym/BFCL-v0": [{"category": "simple_python"}, {"category": "multi_turn_base"},
                        {"category": "multi_turn_base", "tool_format": "native"}, {"category": "irrelevance"}],
    "turngym/DelayedEffect-v0": [{}],
    "turngym/Recovery-v0": [{}],
    "turngym/VariableHorizon-v0": [{}, {"continue_rewards": [0.4, -0.3, 0.6, -0.2]}],
}


@pytest.fixture(scope="module")
def search_index(tmp_path_factory):
    from turngym.corpora.corpus import read_user_passages, write_collection
    from turngym.corpora.lucene import LuceneRetriever, build_index

    root = tmp_path_factory.mktemp("contract-index")
    (root / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in SEARCH_PASSAGES))
    write_collection(read_user_passages(root / "p.jsonl"), root / "collection")
    build_index(root / "collection", root / "index", threads=1)
    return LuceneRetriever(str(root / "index"))


def test_every_registered_env_has_a_contract_configuration():
    assert set(CONFIGS) == set(ENTRY_POINTS)


@pytest.mark.parametrize("env_id,kwargs", [(e, k) for e, ks in CONFIGS.items() for k in ks],
                         ids=lambda v: v if isinstance(v, str) else ",".join(f"{a}={b}" for a, b in v.items()) or "defaults")
def test_registered_env_keeps_the_contract(env_id, kwargs, search_index):
    if env_id.endswith("SearchQA-v0"):
        kwargs = {**kwargs, "retriever": search_index}
    env = gymnasium.make(env_id, **kwargs)
    check_text_env(env, actions=("", "no tool call here", "<search>capital of France</search>", "[f(x=1)]",
                                 "```python\nprint(1)\n```", "lone \ud800 surrogate", "\\boxed{1} <answer>1</answer>"))


# what each env declares that rewards need: the answer kind and the pseudo-answer cue, per configuration
DECLARED = {
    ("turngym/Calculator-v0", ""): ("qa_text", "answer_tag"),
    ("turngym/Digits-v0", ""): ("none", "answer_tag"),
    ("turngym/MathCode-v0", "gsm8k"): ("math", "boxed"),
    ("turngym/SearchQA-v0", "hotpotqa"): ("qa_text", "answer_tag"),
    ("turngym/BFCL-v0", "simple_python"): ("calls", "answer_tag"),
    ("turngym/BFCL-v0", "multi_turn_base"): ("calls", "answer_tag"),
    ("turngym/BFCL-v0", "memory_kv_prereq"): ("qa_text", "answer_tag"),  # memory: answered in the last reply
}


@pytest.mark.parametrize("env_id,dataset", list(DECLARED))
def test_each_env_declares_its_reward_needs_in_the_episode(env_id, dataset, search_index):
    kwargs = {"category": dataset} if "BFCL" in env_id else {"dataset": dataset} if dataset else {}
    if env_id.endswith("SearchQA-v0"):
        kwargs["retriever"] = search_index
    env = gymnasium.make(env_id, **kwargs).unwrapped
    env.reset(seed=0, options={"index": 0})
    needs = env.episode.reward_needs
    assert isinstance(needs, RewardNeeds) and (needs.answer_kind, needs.answer_cue) == DECLARED[(env_id, dataset)]
    assert json.loads(env.episode.to_json())["reward_needs"]["answer_kind"] == needs.answer_kind
    env.close()


class _SilentEnvForTest(TextEnv):
    """A deliberately broken env (a fake, inside this test): it goes on without telling the agent anything."""

    env_name = "test/Silent-v0"
    reward_needs = RewardNeeds(answer_kind="qa_text", answer_cue="answer_tag")

    def num_items(self):
        return 1

    def get_item(self, index):
        return {"index": index, "question": "q", "answers": ["a"], "dataset": "t"}

    def make_prompt(self, task):
        return [{"role": "user", "content": task["question"]}]

    def act(self, action):
        if not action:
            raise ValueError("empty action")  # the base class turns this into an error observation
        return ActionResult(observation=None)


def test_the_checker_catches_a_broken_env_and_accepts_action_errors_as_observations():
    check_text_env(_SilentEnvForTest(), actions=("",))  # a raising act() is the base class's to report
    with pytest.raises(ContractError, match="needs an observation"):
        check_text_env(_SilentEnvForTest(), actions=("", "x"))
    broken = _SilentEnvForTest()
    broken.stop = ["</answer>"]
    with pytest.raises(ContractError, match="stop must be a tuple"):
        check_text_env(broken)
    undeclared = _SilentEnvForTest()
    undeclared.reward_needs = None
    with pytest.raises(ContractError, match="reward_needs must declare"):
        check_text_env(undeclared, actions=("",))


class _UndeclaredToolEnvForTest(_SilentEnvForTest):
    """A fake env (inside this test) that runs a tool but declares no metric saying whether it ran."""

    def act(self, action):
        return ActionResult(observation="result", tool_calls=[{"name": "t", "arguments": {}}], metrics={"ran": True})


def test_the_checker_requires_a_declared_tool_metric_from_an_env_that_runs_tools():
    with pytest.raises(ContractError, match="must declare tool_ok_metrics"):
        check_text_env(_UndeclaredToolEnvForTest(), actions=("x",))
    declared = _UndeclaredToolEnvForTest()
    declared.reward_needs = RewardNeeds(answer_kind="qa_text", answer_cue="answer_tag", tool_ok_metrics=("ran",))
    check_text_env(declared, actions=("x",))
