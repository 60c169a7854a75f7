"""turngym's group rewards through the verl path: episodes played by verl's ``AgentLoopWorker`` (the ``turngym``
loop, a real tiny model), grouped by verl's ``uid`` and scored with SIOP on a real support scorer; ``rm_scores``
carry each turn's reward on its last reply token, equal to SIOP scored in process on the same groups, and the
advantages verl computes from them (``turngym_turn``, SIOP's own estimator) equal turngym's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl_harness import generate, rows

OVERRIDES = ("actor_rollout_ref.rollout.prompt_length=256", "actor_rollout_ref.rollout.response_length=160",
             "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
             "+turngym.env_id=Calculator-v0", "+turngym.max_tokens_per_turn=10")
# the answers tests/test_support_scoring.py gives its group, so SIOP has answers to cluster and support to score
ANSWERS = ["413", "413", "12", None]


@pytest.fixture(scope="module")
def scored_batch(make_worker):
    from turngym.episode import Episode

    worker, _cfg = make_worker(*OVERRIDES)
    out = generate(worker, rows([0, 1], k=4))
    episodes = [Episode.from_json(s) for s in out.non_tensor_batch["turngym_episode"]]
    for ep, answer in zip(episodes, ANSWERS * 2, strict=True):
        ep.final_answer = answer
    out.non_tensor_batch["turngym_episode"] = np.array([ep.to_json() for ep in episodes], dtype=object)
    return out, episodes


def siop(tiny_policy):
    from turngym.rewards import get_reward
    from turngym.rewards.support import HFSupportScorer

    return get_reward("siop", scorer=HFSupportScorer(tiny_policy.model, tiny_policy.tokenizer, method="naive"), lam=0.5, eps=1e-8)


def test_siop_through_the_verl_reward_path_equals_siop_in_process(scored_batch, tiny_policy):
    from turngym.episode import reward_view
    from turngym.integrations.verl.rewards import apply_group_rewards

    out, episodes = scored_batch
    uids = out.non_tensor_batch["uid"]
    apply_group_rewards(out, uids, siop(tiny_policy))
    in_process = {}
    for uid in dict.fromkeys(uids):
        members = [i for i, u in enumerate(uids) if u == uid]
        for i, r in zip(members, siop(tiny_policy).score_group(reward_view([episodes[i] for i in members])).rewards,
                        strict=True):
            in_process[i] = r
    want = torch.zeros_like(out.batch["rm_scores"])
    for i, spans in enumerate(out.non_tensor_batch["turn_spans"]):
        for r, (_a, b) in zip(in_process[i], spans, strict=True):
            want[i, b - 1] = r
    assert torch.equal(out.batch["rm_scores"], want)
    assert (want != 0).sum() >= 4, "SIOP gave the groups too few non-zero turn rewards to compare"
    assert max(len(s) for s in out.non_tensor_batch["turn_spans"]) > 1
    assert out.non_tensor_batch["turngym_return"].tolist() == pytest.approx([sum(in_process[i]) for i in range(len(episodes))])
    assert "turngym_return" in out.meta_info["reward_extra_keys"]

    # verl's compute_advantage on those scores with SIOP's estimator equals turngym's on the same (fp32) rewards
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    import turngym.integrations.verl  # noqa: F401
    from turngym.training.advantages import advantages_per_group

    out.batch["token_level_rewards"] = out.batch["rm_scores"]
    adv = compute_advantage(out, adv_estimator="turngym_turn", config=AlgoConfig(gamma=1.0)).batch["advantages"]
    fp32 = [[float(torch.tensor(r, dtype=torch.float32)) for r in in_process[i]] for i in range(len(episodes))]
    groups = [[i for i, u in enumerate(uids) if u == g] for g in dict.fromkeys(uids)]
    per_turn = advantages_per_group(fp32, groups, "turn", gamma=1.0)
    want_adv = torch.zeros_like(adv)
    for i, spans in enumerate(out.non_tensor_batch["turn_spans"]):
        for a_t, (a, b) in zip(per_turn[i], spans, strict=True):
            want_adv[i, a:b] = a_t
    assert torch.equal(adv, want_adv)


def test_turn_spans_that_are_not_the_masks_runs_are_refused(scored_batch):
    from turngym.integrations.verl.rewards import place_turn_rewards

    out, _episodes = scored_batch
    spans = [list(s) for s in out.non_tensor_batch["turn_spans"]]
    rewards = [[1.0] * len(s) for s in spans]
    place_turn_rewards(rewards, spans, out.batch["response_mask"])
    spans[0] = [(a, b - 1) for a, b in spans[0]]
    with pytest.raises(ValueError, match="row 0: the agent loop's turn spans"):
        place_turn_rewards(rewards, spans, out.batch["response_mask"])
