"""turngym envs as SkyRL environments, with the real skyrl-gym package: its registry, its BaseTextEnv
contract (init/step/close, per-step rewards, metadata), and turngym's per-turn rewards and advantages
in SkyRL's token-level form."""

import importlib
import importlib.util
import json
import sys

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym", reason="the [skyrl] extra (skyrl-gym) is not installed")

from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

from turngym.episode import Episode, Turn  # noqa: E402
from turngym.extras import MissingExtra  # noqa: E402
from turngym.integrations.skyrl import (  # noqa: E402
    EPISODE_METRIC,
    TurngymSkyRLEnv,
    generator_output,
    group_scores,
    make_env,
    token_level_advantages,
    token_level_rewards,
)


def test_every_turngym_env_is_in_skyrl_gyms_registry():
    for name in ("turngym/Calculator-v0", "turngym/SearchQA-v0", "turngym/MathCode-v0", "turngym/BFCL-v0"):
        assert name in skyrl_gym.registry


def test_an_episode_through_skyrl_gym_make_as_skyrls_generator_drives_it():
    # skyrl_train's agent_loop: skyrl_gym.make(env_class, env_config=..., extras=row); init(prompt); step until done
    env = skyrl_gym.make("turngym/Calculator-v0", env_config={"max_turns": 3},
                         extras={"reward_spec": {"ground_truth": "ignored"}, "extra_info": {"index": 0}})
    assert isinstance(env, BaseTextEnv) and isinstance(env, TurngymSkyRLEnv)
    prompt, meta = env.init([{"role": "user", "content": "the dataset's prompt (the env owns its own)"}])
    assert prompt[-1] == {"role": "user", "content": "What is 84 * 63 + 51?"} and meta["stop"] == ["</calc>", "</answer>"]
    assert "answers" not in meta["task"]  # the labels stay out of what the policy sees
    out = env.step("<calc>84 * 63 + 51</calc>")
    assert out["observations"] == [{"role": "user", "content": "\n<result>5343</result>\n"}]
    assert out["reward"] == 0.0 and out["done"] is False
    assert out["metadata"]["truth"] == {"tool_ok": True} and out["metadata"]["metrics"]["tool_ok"] is True
    out = env.step("<answer>5343</answer>")
    assert out["done"] is True and out["observations"] == [] and out["reward"] == 1.0
    assert out["metadata"]["outcome"] == {"correct": True}
    assert out["metadata"]["truth_by_turn"] == [{"tool_ok": True}, {}]
    metrics = env.get_metrics()
    episode = metrics.pop(EPISODE_METRIC)  # the whole record, JSON-safe, for group rewards (skyrl_generator)
    assert metrics == {"turns": 2, "correct": 1.0} and env.turns == 2
    assert json.loads(json.dumps(episode)) == episode and Episode.from_dict(episode).to_dict() == env.episode.to_dict()
    assert len(env.episode.turns) == 2 and env.max_turns == 3
    env.close()


def test_the_generators_max_turns_truncates_and_a_wrong_answer_earns_nothing():
    env = make_env("Calculator-v0", extras={"index": 1, "max_turns": 1})
    env.init()
    out = env.step("<calc>1 + 1</calc>")
    assert out["done"] is True and out["metadata"]["truncated"] is True and out["reward"] == 0.0
    env = make_env("Calculator-v0", extras={"index": 0})
    env.init()
    assert env.step("<answer>1</answer>")["reward"] == 0.0


def hand_built(rewarded_answer: bool = True) -> Episode:
    return Episode(
        id="g#0", env_id="turngym/Calculator-v0", group="g", task={"question": "q?", "answers": ["5"]},
        prompt=[{"role": "user", "content": "q?"}], prompt_ids=[100, 101, 102],
        turns=[Turn(0, "<calc>2+3</calc>", observation="<result>5</result>", action_ids=[1, 2],
                    action_logprobs=[-0.1, -0.2], observation_ids=[3, 4, 5]),
               Turn(1, "<answer>5</answer>", action_ids=[8, 9], action_logprobs=[-0.3, -0.4])],
        final_answer="5", terminated=True)


def test_per_turn_rewards_sit_on_each_replys_last_token_as_skyrl_places_step_rewards():
    # SkyRL (NovaSky-AI/SkyRL a9564572e) skyrl/train/generators/skyrl_gym_generator.py:629-642 puts each step's
    # reward at response_end_idx - prompt length, response_end_idx being the reply's last token (line 1117)
    ep = hand_built()
    # response = [1, 2 | 3, 4, 5 | 8, 9]: turn 0's reward on token 2 (index 1), turn 1's on token 9 (index 6)
    assert token_level_rewards(ep, [0.25, 1.0]) == [0.0, 0.25, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert token_level_advantages(ep, [0.5, -1.0]) == [0.5, 0.5, 0.0, 0.0, 0.0, -1.0, -1.0]
    with pytest.raises(ValueError, match="2 turns but 1 rewards"):
        token_level_rewards(ep, [1.0])
    out = generator_output([ep], [[0.25, 1.0]])
    assert out["prompt_token_ids"] == [[100, 101, 102]] and out["response_ids"] == [[1, 2, 3, 4, 5, 8, 9]]
    assert out["loss_masks"] == [[1, 1, 0, 0, 0, 1, 1]] and out["rewards"][0][-1] == 1.0
    assert out["rollout_logprobs"] == [[-0.1, -0.2, 0.0, 0.0, 0.0, -0.3, -0.4]]
    assert len(out["rewards"][0]) == len(out["response_ids"][0]) == len(out["loss_masks"][0])


def test_a_turngym_reward_and_estimator_exported_per_token():
    right, wrong = hand_built(), hand_built()
    wrong.final_answer, wrong.id = "4", "g#1"
    for ep in (right, wrong):
        ep.outcome = {"correct": ep.final_answer == "5"}
    rewards, advantages = group_scores([right, wrong], "outcome", estimator="grpo")
    assert [sum(r) for r in rewards] == [1.0, 0.0]
    assert advantages[0][0] > 0 > advantages[1][0]
    tokens = token_level_advantages(right, advantages[0])
    assert tokens[0] == advantages[0][0] and tokens[2] == 0.0
    for estimator, need in (("gigpo", "states"), ("vine", "branches"), ("egpo", "entropy")):  # declared needs
        with pytest.raises(ValueError, match=f"estimator '{estimator}' needs {need} beyond the rewards"):
            group_scores([right, wrong], "outcome", estimator=estimator)


def test_bad_input_is_one_line(monkeypatch):
    with pytest.raises(ValueError, match="unknown env 'turngym/Nope-v0'; turngym envs: "):
        make_env("Nope-v0")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "skyrl_gym" else real(name, *a))
    monkeypatch.delitem(sys.modules, "turngym.integrations.skyrl")
    with pytest.raises(MissingExtra, match=r"^the SkyRL integration needs skyrl-gym: pip install 'turngym\[skyrl\]'"):
        importlib.import_module("turngym.integrations.skyrl")
