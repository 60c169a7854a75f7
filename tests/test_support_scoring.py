"""The real support scorers: the cached transformers scorer equals one full forward per
(point, reference); SIOP runs end to end on rollouts from a real (tiny) model."""

import math

import pytest

from turngym.agents.policy import SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.envs.calculator import CalculatorEnv
from turngym.rewards import get_reward
from turngym.rewards.support import HFSupportScorer, OpenAISupportScorer, episode_prefix_ids
from turngym.rewards.wrappers import TurnRewardWrapper

from conftest import FakeJSONServer


@pytest.fixture(scope="module")
def episodes(tiny_chat_policy):
    runner = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=4), SamplingParams(max_new_tokens=10, seed=0), k=4)
    return runner.run([0])


def test_cached_scoring_equals_naive_forwards(tiny_chat_policy, episodes):
    tok = tiny_chat_policy.tokenizer
    ep = max(episodes, key=lambda e: len(e.turns))
    points = episode_prefix_ids(ep, tok)
    assert len(points) == len(ep.turns) and all(b[: len(a)] == a for a, b in zip(points, points[1:]))
    cue = tok("<answer>", add_special_tokens=False)["input_ids"]
    refs = [tok(r, add_special_tokens=False)["input_ids"] for r in ["413", "12", "forty"]]
    cached = HFSupportScorer(tiny_chat_policy.model, tok, cached=True)
    naive = HFSupportScorer(tiny_chat_policy.model, tok, cached=False)
    a, b = cached.mean_logprobs(points, cue, refs), naive.mean_logprobs(points, cue, refs)
    for ra, rb in zip(a, b):
        assert ra == pytest.approx(rb, abs=1e-4)
    assert all(x < 0 for row in a for x in row)
    assert cached.stats["tokens"] < naive.stats["tokens"]


def test_prefix_mode_moves_the_observation(tiny_chat_policy, episodes):
    ep = max(episodes, key=lambda e: len(e.turns))
    after = episode_prefix_ids(ep, tiny_chat_policy.tokenizer, "after_observation")
    before = episode_prefix_ids(ep, tiny_chat_policy.tokenizer, "before_observation")
    assert after[0] == before[0]
    t0 = ep.turns[0]
    assert before[1] == ep.prompt_ids + t0.action_ids
    assert after[1] == ep.prompt_ids + t0.action_ids + t0.observation_ids
    with pytest.raises(ValueError, match="prefix"):
        episode_prefix_ids(ep, tiny_chat_policy.tokenizer, "sideways")


def test_siop_and_igpo_end_to_end_with_the_real_scorer(tiny_chat_policy, episodes):
    for e, ans in zip(episodes, ["413", "413", "12", None]):  # give the group answers to cluster
        e.final_answer = ans
    scorer = HFSupportScorer(tiny_chat_policy.model, tiny_chat_policy.tokenizer)
    siop = get_reward("siop", scorer=scorer).score_group(episodes)
    igpo = get_reward("igpo", scorer=scorer).score_group(episodes)
    for res in (siop, igpo):
        assert [len(r) for r in res.rewards] == [len(e.turns) for e in episodes]
        assert all(math.isfinite(x) for r in res.rewards for x in r)
    assert siop.rewards[3] == [0.0] * len(episodes[3].turns)
    for rewards, phi in zip(siop.rewards, siop.diagnostics["potentials"]):
        if phi:
            assert sum(rewards[:-1]) == pytest.approx(phi[-1] - phi[0], abs=1e-9)


def test_outcome_reward_as_a_gymnasium_wrapper():
    env = TurnRewardWrapper(CalculatorEnv(), get_reward("outcome"))
    _, info = env.reset(options={"index": 0})
    _, r1, *_ = env.step("<calc>1+1</calc>")
    _, r2, term, _, _ = env.step(f"<answer>{info['task']['answers'][0]}</answer>")
    assert (r1, r2, term) == (0.0, 1.0, True)
    with pytest.raises(TypeError, match="groups only"):
        TurnRewardWrapper(CalculatorEnv(), get_reward("ttrl"))


def FakeVLLMServer():
    """A fake vLLM answering prompt_logprobs with log p(token) = -token_id / 100 (real loopback HTTP)."""

    def reply(path, body, n):
        return 200, {"choices": [{"index": i, "text": "",
                                  "prompt_logprobs": [None] + [{str(t): {"logprob": -t / 100}} for t in p[1:]]}
                                 for i, p in enumerate(body["prompt"])]}

    return FakeJSONServer(reply)


def test_openai_prompt_logprobs_scorer_reads_the_reference_span():
    server = FakeVLLMServer()
    try:
        scorer = OpenAISupportScorer(model="m", base_url=server.url, tokenizer=None)
        table = scorer.mean_logprobs([[1, 2], [1, 2, 3]], [7], [[10, 20], [30]])
        assert table == [[pytest.approx(-0.15), pytest.approx(-0.30)], [pytest.approx(-0.15), pytest.approx(-0.30)]]
        [(_, body)] = server.requests
        assert body["prompt"] == [[1, 2, 7, 10, 20], [1, 2, 7, 30], [1, 2, 3, 7, 10, 20], [1, 2, 3, 7, 30]]
        assert body["prompt_logprobs"] == 0
    finally:
        server.close()


def test_cached_scoring_with_sliding_window_layers_equals_naive(tiny_chat_policy):
    """Gemma-3-style caches (sliding-window layers, which cannot be cropped) take the grow-per-point path."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tok = tiny_chat_policy.tokenizer
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"], max_position_embeddings=512,
                           pad_token_id=tok.pad_token_id)
    model = Gemma3ForCausalLM(cfg).eval()
    ids = tok("What is 12 * 34 + 5? <calc>12 * 34</calc> <result>408</result> then add five", add_special_tokens=False)["input_ids"]
    points = [ids[:6], ids[:15], ids]  # later points run past the sliding window
    cue = tok("<answer>", add_special_tokens=False)["input_ids"]
    refs = [tok(r, add_special_tokens=False)["input_ids"] for r in ["413", "forty"]]
    cached = HFSupportScorer(model, tok).mean_logprobs(points, cue, refs)
    naive = HFSupportScorer(model, tok, cached=False).mean_logprobs(points, cue, refs)
    for a, b in zip(cached, naive):
        assert a == pytest.approx(b, abs=1e-4)
