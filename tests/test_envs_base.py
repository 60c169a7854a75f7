import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import turngym  # noqa: F401
from turngym.envs.base import UnicodeText
from turngym.envs.calculator import CalculatorEnv, safe_arith


def test_calculator_env_passes_gymnasium_checker():
    env = gymnasium.make("turngym/Calculator-v0")
    check_env(env.unwrapped, skip_render_check=False)


def test_unicode_text_space_samples_and_admits_any_text():
    space = UnicodeText(max_length=50)
    space.seed(0)
    samples = [space.sample() for _ in range(20)]
    assert all(space.contains(s) for s in samples)
    assert any(ord(c) > 127 for s in samples for c in s)
    assert space.contains("任何 текст 🚀") and not space.contains("x" * 51) and not space.contains(3)


def test_index_task_and_turn_recording():
    env = CalculatorEnv(max_turns=3)
    obs, info = env.reset(seed=1, options={"index": 7})
    assert info["task"]["index"] == 7 and info["task"]["question"] in obs
    assert "answers" not in info["task"]  # labels stay in the episode record, out of the agent's info
    gold = env.episode.task["answers"][0]
    obs, r, term, trunc, info = env.step("<calc>2 * 3</calc>")
    assert obs == "\n<result>6</result>\n" and not term and not trunc
    assert info["turn"]["tool_calls"] == [{"name": "calc", "arguments": {"text": "2 * 3"}}]
    assert "latency_ms" not in info["turn"]
    obs, r, term, trunc, info = env.step(f"<answer>{gold}</answer>")
    assert term and not trunc and info["outcome"] == {"correct": True}
    ep = env.unwrapped.episode
    assert [t.index for t in ep.turns] == [0, 1] and ep.turns[-1].observation is None
    assert ep.final_answer == gold
    with pytest.raises(RuntimeError, match="has ended"):
        env.step("<answer>1</answer>")


def test_adhoc_task_and_turn_limit_truncates():
    env = CalculatorEnv(max_turns=2)
    env.reset(options={"task": {"question": "What is 1+1?", "answers": "2"}})
    assert env.episode.task["answers"] == ["2"]
    _, _, term, trunc, info = env.step("hmm")
    assert not term and not trunc and "no tool call" in info["turn"]["parse_error"]
    _, _, term, trunc, info = env.step("<calc>1/0</calc>")
    assert trunc and not term and info["outcome"] == {"correct": False}


@pytest.mark.parametrize("options,err", [
    ({"index": 10**9}, IndexError), ({"index": "3"}, TypeError), ({"task": {"answers": []}}, ValueError),
    ({"task": "q"}, TypeError), ({"index": 1, "task": {"question": "q"}}, ValueError),
])
def test_bad_reset_options_are_clear_errors(options, err):
    with pytest.raises(err):
        CalculatorEnv().reset(options=options)


def test_info_is_deterministic_and_randomness_comes_from_seed():
    def run(seed):
        env = CalculatorEnv()
        _, info0 = env.reset(seed=seed)
        _, _, _, _, info1 = env.step("<calc>(1+2)*3</calc>")
        return info0, info1

    assert run(5) == run(5)
    assert len({run(seed)[0]["task"]["index"] for seed in range(6)}) > 1


def test_hostile_actions_never_raise():
    env = CalculatorEnv(max_turns=50)
    env.reset(seed=0)
    for action in ["<calc>" + "9" * 500 + "</calc>", "<calc>__import__('os')</calc>", "<calc>2**99999</calc>",
                   "\x00<calc>", "<answer>" * 1000, "", "<calc>" + "(" * 300 + "</calc>"]:
        obs, *_ = env.step(action)
        assert isinstance(obs, str)


def test_safe_arith_rejects_code():
    assert safe_arith("(2+3)*4 - 1/2") == 19.5
    for bad in ["__import__('os')", "2**10", "a+1", "[1]"]:
        with pytest.raises(ValueError):
            safe_arith(bad)


# what an env author implements or overrides, and what a user calls: TextEnv's whole public surface
AUTHOR_HOOKS = {"num_items", "get_item", "make_prompt", "act", "grade", "make_tools", "reply_prefill", "on_reset",
                "on_close_episode", "check_ready", "action_error", "failed_outcome", "normalise_task", "anchor_state",
                "declared_needs", "set_truth", "declared_tools"}
USER_API = {"reset", "step", "render", "close", "end_episode", "submit_reset", "submit_step"}  # + the env handle's batched forms
DECLARATIONS = {"metadata", "env_name", "dataset_name", "observation_role", "stop", "prefills", "manifest",
                "prompt_styles", "reward_needs", "truth_keys", "outcome_metric", "gold_keys",
                "static_tools_absent"}


def test_text_env_exposes_only_what_authors_write_and_users_call():
    from turngym.envs.base import TextEnv

    own = {name: value for name, value in vars(TextEnv).items() if not name.startswith("_")}
    methods = {n for n, v in own.items() if callable(v) or isinstance(v, classmethod)}
    assert methods == AUTHOR_HOOKS | USER_API
    assert set(own) - methods == DECLARATIONS
    assert {n for n in vars(TextEnv()) if not n.startswith("_")} == {"max_turns", "render_mode", "observation_space",
                                                                     "action_space", "episode"}


def test_outcome_reward_and_public_task_are_functions_of_the_declarations():
    from turngym.envs.base import outcome_reward, public_task

    env = CalculatorEnv(max_turns=2)
    env.reset(options={"index": 3})
    gold = env.episode.task["answers"][0]
    _, reward, terminated, _, _ = env.step(f"<answer>{gold}</answer>")
    assert terminated and reward == outcome_reward(env.episode.outcome, env.outcome_metric) == 1.0
    assert outcome_reward({"correct": True}, None) == 0.0  # an env whose step rewards already are the task
    assert public_task({"question": "q", "answers": ["1"], "index": 0}, env.gold_keys) == {"question": "q", "index": 0}
