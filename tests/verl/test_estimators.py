"""turngym's estimators through verl's own ``ray_trainer.compute_advantage`` (``algorithm.adv_estimator=turngym_<name>``):
on the same episodes and per-turn rewards, verl's advantages equal turngym's in-process ones token for token (fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

# per episode: (reply tokens, observation tokens) per turn; two groups, lengths 1-4 turns, an observation cut short
SHAPES = [[(3, 2), (2, 4), (4, 0)], [(5, 0)], [(1, 1), (2, 0)], [(2, 3), (1, 2), (2, 2), (3, 0)],
          [(4, 2), (3, 0)], [(2, 0)], [(1, 3), (1, 3), (1, 0)]]
UIDS = ["a", "a", "a", "a", "b", "b", "b"]
# dyadic rewards (exact in fp32), with ties and zeros, one list per episode
REWARDS = [[0.25, -0.5, 1.0], [1.0], [0.0, 0.5], [0.125, 0.0, -0.25, 1.0], [0.5, 0.0], [1.0], [0.5, 0.75, -1.0]]
WIDTH = 24
PREFILL = {6: 2}  # episode 6 opens with 2 untrained tokens (a forced reply start): mask 0 before its first turn


def batch(rewards=REWARDS, spread=False):
    from verl.protocol import DataProto

    n = len(SHAPES)
    mask = torch.zeros((n, WIDTH), dtype=torch.int64)
    scores = torch.zeros((n, WIDTH), dtype=torch.float32)
    for i, (shape, rs) in enumerate(zip(SHAPES, rewards, strict=True)):
        pos = PREFILL.get(i, 0)
        for t, ((reply, obs), r) in enumerate(zip(shape, rs, strict=True)):
            mask[i, pos:pos + reply] = 1
            if spread:  # as verl's KL-in-reward leaves it: the turn's reward spread over its tokens (and the prefill)
                start = 0 if t == 0 else pos
                scores[i, start:pos + reply + obs] = r / (pos + reply + obs - start)
            else:  # the reward on the turn's last reply token
                scores[i, pos + reply - 1] = r
            pos += reply + obs
    return DataProto.from_dict(tensors={"token_level_rewards": scores, "response_mask": mask},
                               non_tensors={"uid": np.array(UIDS, dtype=object)})


def expected(name: str, rewards=REWARDS, **kw) -> torch.Tensor:
    from turngym.training.advantages import advantages_per_group

    groups = [[i for i, u in enumerate(UIDS) if u == g] for g in dict.fromkeys(UIDS)]
    per_turn = advantages_per_group(rewards, groups, name, **kw)
    out = torch.zeros((len(SHAPES), WIDTH), dtype=torch.float32)
    for i, (shape, adv) in enumerate(zip(SHAPES, per_turn, strict=True)):
        pos = PREFILL.get(i, 0)
        for (reply, obs), a in zip(shape, adv, strict=True):
            out[i, pos:pos + reply] = a
            pos += reply + obs
    return out


def suppliable():
    from turngym.integrations.verl.estimators import unsuppliable
    from turngym.training.advantages import ESTIMATORS

    return [n for n in sorted(ESTIMATORS) if not unsuppliable(n)]


@pytest.mark.parametrize("name", ["turn_loo", "igpo", "rloo", "grpo", "turn", "igpo_siop", "igpo_separate"])
def test_verl_compute_advantage_equals_turngym_token_for_token(name):
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    import turngym.integrations.verl  # noqa: F401 - registers turngym_<name>

    assert name in suppliable()
    out = compute_advantage(batch(), adv_estimator=f"turngym_{name}", gamma=1.0, config=AlgoConfig(gamma=1.0))
    want = expected(name, gamma=1.0)
    assert out.batch["advantages"].dtype == torch.float32
    assert torch.equal(out.batch["advantages"], want)
    assert torch.equal(out.batch["returns"], want)
    assert want.abs().sum() > 0


def test_rewards_spread_over_a_turn_count_for_that_turn_and_gamma_and_options_reach_the_estimator():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.ray_trainer import compute_advantage

    import turngym.integrations.verl  # noqa: F401

    config = OmegaConf.create({"gamma": 0.5, "turngym_options": {"scale": "std"}})  # as +algorithm.turngym_options
    out = compute_advantage(batch(spread=True), adv_estimator="turngym_turn_loo", config=config)
    want = expected("turn_loo", gamma=0.5, scale="std")
    assert torch.allclose(out.batch["advantages"], want, atol=1e-6)  # the spread sums round in fp32


def test_estimators_that_need_more_than_rewards_are_refused_in_one_line():
    from turngym.integrations.verl import check_estimator
    from turngym.integrations.verl.estimators import make_estimator

    for name, what in (("gigpo", "anchor state"), ("egpo", "entropies"), ("vine", "Monte-Carlo")):
        with pytest.raises(ValueError, match=what) as err:
            check_estimator(f"turngym_{name}")
        assert "\n" not in str(err.value) and "turngym_turn_loo" in str(err.value)
        with pytest.raises(ValueError, match=what):  # and the registered function refuses it if verl calls it
            make_estimator(name)(batch().batch["token_level_rewards"], batch().batch["response_mask"], UIDS)
    with pytest.raises(ValueError, match="no estimator 'nope'"):
        check_estimator("turngym_nope")
    check_estimator("grpo")  # verl's own names pass


def test_the_agent_loop_manager_refuses_them_at_start_up(tiny_dir):
    from verl_harness import verl_config

    from turngym.integrations.verl.rewards import TurngymAgentLoopManager

    cfg = verl_config(tiny_dir, "algorithm.adv_estimator=turngym_gigpo")
    with pytest.raises(ValueError, match="turngym_gigpo needs an anchor state"):
        TurngymAgentLoopManager(cfg, llm_client=None)
