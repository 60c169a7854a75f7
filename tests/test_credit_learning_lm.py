"""benchmarks/credit_learning_lm.py: the exact J of an LM's policy on the oracle envs, checked by brute force."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import load_benchmark
from turngym.agents.policy import Generation, PolicyBase
from turngym.oracles.mdp import solve

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def lm():
    return load_benchmark("credit_learning_lm")


def setting(lm, name):
    return next(s for s in lm.SETTINGS if s.name == name)


@dataclass
class ScriptedPolicy(PolicyBase):
    """Plays a fixed action sequence and records the prompt ids the rollout runner asks it to continue."""

    tokenizer: object
    script: list[str]
    name: str = "scripted"
    max_context: int | None = None

    def __post_init__(self):
        self.prompts: list[list[int]] = []

    def generate(self, requests, sampling):
        out = []
        for r in requests:
            self.prompts.append(list(r.prompt_ids))
            action = self.script[len(self.prompts) - 1]
            ids = self.tokenizer.encode(action, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(text=action, token_ids=ids, finish_reason="stop"))
        return out


def reply_logp(model, prompt: list[int], reply: list[int]) -> float:
    """log p(reply | prompt) by one plain forward pass (independent of the benchmark's batched scorer)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + reply])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return float(sum(logp[len(prompt) - 1 + k, tok] for k, tok in enumerate(reply)))


def test_exact_j_of_the_lm_equals_brute_force_over_played_episodes(lm):
    """VariableHorizon with process rewards (deterministic): every action sequence is played through the real
    rollout runner; its probability is the product of the LM's legal-normalised reply probabilities at the
    prompts the runner built, its return the env's rewards. Their sum is J, which the history-tree DP must give."""
    from turngym.agents.policy import SamplingParams
    from turngym.agents.runner import RolloutRunner

    st = setting(lm, "variable_horizon_dense")
    env, model, tok, tree = lm.load_lm(st, lm.TrainConfig())
    mdp = env.mdp
    brute, total_p = 0.0, 0.0
    for stop_at in range(mdp.horizon):  # the episodes: CONTINUE stop_at times, then STOP
        script = ["CONTINUE"] * stop_at + ["STOP"]
        policy = ScriptedPolicy(tok, script)
        ep = RolloutRunner(policy, lambda: lm.make_env(st), SamplingParams(max_new_tokens=8), concurrency=1,
                           max_episode_tokens=1024).run([0])[0]
        assert [t.action for t in ep.turns] == script
        p = 1.0
        for prompt, action in zip(policy.prompts, script, strict=True):
            node = mdp.nodes[tree.state[tree.index[tuple(prompt)]]]  # the runner's prompt is in the tree
            lps = {a: reply_logp(model, prompt, list(tok.encode(a, add_special_tokens=False)) + [tok.eos_token_id])
                   for a in node.actions}
            z = sum(math.exp(v) for v in lps.values())
            p *= math.exp(lps[action]) / z
        brute += p * sum(t.reward for t in ep.turns)
        total_p += p
    assert total_p == pytest.approx(1.0)
    got = lm.exact_j(model, tree)
    assert got.j == pytest.approx(brute, rel=1e-5)
    lo, hi = lm.return_range(mdp)
    assert (lo, hi) == (0.0, pytest.approx(3.7))
    assert math.isfinite(got.j) and lo <= got.j <= hi
    assert 0.0 < got.legal_mass < 1.0


def test_history_tree_keeps_the_mdp_value_for_a_hand_set_markov_policy(lm):
    """A policy that depends only on the MDP node has the same J on the history tree as on the MDP itself,
    enumerated path by path (DelayedEffect: distractor turns reach one node by several histories)."""
    st = setting(lm, "delayed_effect")
    env, _, tok, tree = lm.load_lm(st, lm.TrainConfig())
    mdp = env.mdp
    assert len(tree.mdp.nodes) > len(mdp.nodes)  # several histories per node
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 1.5, mdp.num_params)
    per_node = [logits[o:o + len(n.actions)] for o, n in zip(mdp.offsets, mdp.nodes, strict=True)]
    tree_logits = np.concatenate([per_node[s] for s in tree.state])
    brute = 0.0
    probs = [np.exp(z) / np.exp(z).sum() for z in per_node]
    choices = [range(len(n.actions)) for n in mdp.nodes[:1]] + [range(2)] * (mdp.horizon - 1)
    for path in itertools.product(*choices):  # every action sequence; DelayedEffect's moves are deterministic
        i, p, ret = mdp.start, 1.0, 0.0
        for k in path:
            outs = mdp.nodes[i].outcomes[k]
            p *= probs[i][k]
            if outs[0].next is None:
                ret += sum(o.prob * o.reward for o in outs)
                break
            i = outs[0].next
        brute += p * ret
    assert solve(tree.mdp, tree_logits).v[0] == pytest.approx(brute, rel=1e-9)
    assert solve(mdp, logits).v[mdp.start] == pytest.approx(brute, rel=1e-9)


def test_legal_probabilities_sum_to_one(lm):
    st = setting(lm, "recovery")
    _, model, _, tree = lm.load_lm(st, lm.TrainConfig())
    for p in lm.legal_probs(model, tree, range(len(tree.mdp.nodes))):
        assert p.sum() == pytest.approx(1.0) and (p > 0).all()


def test_a_tiny_training_run_gives_finite_exact_j_within_the_return_range(lm):
    """Two optimizer steps of TurnGRPOTrainer: the sampler finds every prompt in the tree (else it raises)."""
    st = setting(lm, "variable_horizon")
    curve = lm.train_curve(st, "turn_loo", 0, lm.TrainConfig(steps=2))
    lo, hi = lm.return_range(lm.oracle_env(st).mdp)
    assert len(curve.j) == 3
    assert all(math.isfinite(j) and lo <= j <= hi for j in curve.j)
    assert curve.j[1] != curve.j[0]  # the optimizer step moved the policy


def test_an_env_without_an_oracle_is_refused_in_one_line(lm, tmp_path):
    with pytest.raises(SystemExit) as err:
        lm.main(["--env", "turngym/Digits-v0", "--out", str(tmp_path)])
    msg = str(err.value.code)
    assert "turngym/Digits-v0" in msg and "no exact oracle" in msg and "\n" not in msg
    assert not list(tmp_path.iterdir())  # refused before any output


def test_settings_match_the_tabular_benchmark(lm):
    """The LM curves are compared with credit_learning.py's: the same four MDPs."""
    from turngym.credit.exact_oracle import settings

    tab = {s.name: s.mdp for s in settings()}
    for st in lm.SETTINGS:
        assert lm.oracle_env(st).mdp == tab[st.name]
