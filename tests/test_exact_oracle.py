"""The exact credit oracle: its values equal brute-force enumeration and closed forms, its gradient equals
REINFORCE over all trajectories, and the gradient-validity benchmark tells biased estimators from unbiased ones."""

import json

import gymnasium
import numpy as np
import pytest

import turngym  # noqa: F401 - registers the envs
from turngym.credit.exact_oracle import evaluate, markdown, run_exact, settings
from turngym.envs import credit_mdps as envs
from turngym.oracles.mdp import enumerate_trajectories, sample, solve

SETTINGS = {s.name: s for s in settings()}


def brute_force(mdp, logits):
    """Q(s, a) as the mean return-to-go after (s, a) over every trajectory, and the REINFORCE gradient
    Σ_τ p(τ) Σ_t ∇log π(a_t|s_t)·G_t, both from the full list of trajectories."""
    ex = solve(mdp, logits)
    num, den = {}, {}
    grad = np.zeros(mdp.num_params)
    for p, steps in enumerate_trajectories(mdp, logits):
        rewards = [r for _, _, r in steps]
        for t, (s, a, _) in enumerate(steps):
            g = sum(rewards[t:])
            num[s, a] = num.get((s, a), 0.0) + p * g
            den[s, a] = den.get((s, a), 0.0) + p
            off, k = mdp.offsets[s], len(mdp.nodes[s].actions)
            score = -ex.probs[s, :k].copy()
            score[a] += 1.0
            grad[off:off + k] += p * g * score
    return {key: num[key] / den[key] for key in num}, grad


@pytest.mark.parametrize("name", list(SETTINGS))
def test_dynamic_programming_equals_enumeration(name):
    st = SETTINGS[name]
    ex = solve(st.mdp, st.logits)
    q, grad = brute_force(st.mdp, st.logits)
    for (s, a), value in q.items():
        assert ex.q[s, a] == pytest.approx(value, abs=1e-12)
    np.testing.assert_allclose(ex.gradient, grad, atol=1e-12)
    assert sum(p for p, _ in enumerate_trajectories(st.mdp, st.logits)) == pytest.approx(1.0)


def test_closed_forms_under_the_uniform_policy():
    q, cost = 0.5, 0.2
    m = envs.recovery(q, cost)
    ex = solve(m, np.zeros(m.num_params))
    v1 = 0.5 * (q - cost)  # RECOVER pays 1 - cost w.p. q, else -cost; GIVE_UP 0
    assert ex.v[1] == pytest.approx(v1)
    assert ex.a[0, 1] == pytest.approx(v1 - (0.5 + 0.5 * v1))  # BAD
    assert ex.a[1, 0] == pytest.approx((q - cost) - v1)  # RECOVER
    d = envs.delayed_effect(horizon=4, p_good=0.8, p_bad=0.2)
    ex = solve(d, np.zeros(d.num_params))
    assert ex.a[0, 0] == pytest.approx(0.8 - 0.5) and np.all(ex.a[1:] == 0)  # distractors: A = 0 exactly
    vh = envs.variable_horizon((0.0, 2.0, 1.0, 3.0, 0.0))
    ex = solve(vh, np.zeros(vh.num_params))
    assert ex.v[3] == pytest.approx(1.5) and ex.v[2] == pytest.approx(1.25) and ex.v[1] == pytest.approx(1.625)
    assert [np.sign(ex.a[t, 1]) for t in range(4)] == [1, -1, 1, -1]  # CONTINUE's sign alternates


def test_sampling_follows_the_policy():
    st = SETTINGS["variable_horizon_dense"]
    ex = solve(st.mdp, st.logits)
    traj = sample(st.mdp, st.logits, 40000, np.random.default_rng(1))
    assert traj.reward.sum(axis=1).mean() == pytest.approx(ex.v[st.mdp.start], abs=0.02)
    for t in range(st.mdp.horizon):
        assert np.mean(traj.length > t) == pytest.approx(ex.visit[t], abs=0.01)


def test_the_oracle_as_estimator_reaches_the_exact_gradient():
    for st in SETTINGS.values():
        assert evaluate(st, "oracle", 64, 100).cosine >= 0.999


def test_turn_is_biased_and_turn_loo_is_not_with_process_rewards():
    st = SETTINGS["variable_horizon_dense"]
    assert evaluate(st, "turn", 256, 100).cosine < 0.95
    assert evaluate(st, "igpo_separate", 256, 100).cosine < 0.97
    row = evaluate(st, "turn_loo", 256, 100)
    assert row.cosine >= 0.999 and row.rel_bias < 0.05
    assert evaluate(st, "turn_loo", 256, 100, options={"scale": "std"}).cosine >= 0.999


@pytest.mark.parametrize("name", ["variable_horizon", "delayed_effect", "recovery"])
def test_rloo_and_grpo_are_unbiased_without_process_rewards(name):
    for est in ("rloo", "grpo"):
        assert evaluate(SETTINGS[name], est, 256, 100).cosine >= 0.999, est


def test_groups_split_the_batch_and_must_divide_it():
    st = SETTINGS["variable_horizon"]
    row = evaluate(st, "rloo", 32, 50, group_size=8)
    assert row.group_size == 8 and row.cosine > 0.99
    with pytest.raises(ValueError, match="multiple"):
        evaluate(st, "rloo", 32, 5, group_size=5)


def test_run_exact_writes_json_and_markdown(tmp_path):
    s = run_exact(batch_sizes=(4,), batches=5, estimators=("turn_loo", "gigpo"), out_dir=tmp_path)
    assert len(s["rows"]) == 4 * 2
    assert (tmp_path / "exact.json").exists()
    assert "| turn_loo | 4 |" in (tmp_path / "exact.md").read_text() == markdown(s)


def test_oracle_envs_play_as_text_envs():
    env = gymnasium.make("turngym/VariableHorizon-v0", continue_rewards=[0.4, -0.3, 0.6, -0.2])
    obs, _ = env.reset(seed=0)
    assert "alive@0" in obs and "STOP, CONTINUE" in obs
    _, r, term, _, info = env.step(" continue ")
    assert (r, term, info["turn"]["metrics"]["oracle_state"]) == (0.4, False, "alive@0")
    _, r, term, _, _ = env.step("STOP")
    assert (r, term) == (2.0, True)
    env = gymnasium.make("turngym/Recovery-v0")
    env.reset(seed=0)
    _, r, term, _, info = env.step("jump")
    assert term and r == 0.0 and info["turn"]["parse_error"]
    env = gymnasium.make("turngym/DelayedEffect-v0", horizon=3)
    env.reset(seed=0)
    rewards = [env.step(a)[1] for a in ("GOOD", "NOTE_0", "NOTE_1")]
    assert rewards[:2] == [0.0, 0.0] and rewards[2] in (0.0, 1.0)


def test_creditbench_cli_dispatches_to_the_exact_oracle(tmp_path, capsys):
    from turngym.cli import main

    assert main(["creditbench", "--oracle", "exact", "--batch-sizes", "4,8", "--group-size", "4", "--seeds", "3",
                 "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "exact.json").read_text())["rows"]
    assert {r["batch_size"] for r in rows} == {4, 8} and {r["group_size"] for r in rows} == {4}
    assert "report:" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="multiple"):
        main(["creditbench", "--oracle", "exact", "--batch-sizes", "6", "--group-size", "4", "--out", str(tmp_path)])


# ------------------------------------------------------------------ another framework's advantage code (--external)

EXTERNAL = '''
from turngym.training.advantages import turn, turn_loo

def loo(rewards):
    return turn_loo(rewards)

def zscored_turns(rewards):  # SIOP's estimator, as another framework would ship it
    return turn(rewards)

def short(rewards):
    return [ep[:-1] for ep in rewards]

def nan(rewards):
    return [[float("nan")] * len(ep) for ep in rewards]
'''


@pytest.fixture
def external_module(tmp_path, monkeypatch):
    (tmp_path / "their_advantages.py").write_text(EXTERNAL)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_external_advantage_function_is_scored_beside_turngyms_on_the_same_episodes(external_module):
    from turngym.credit.exact_oracle import run_exact
    from turngym.credit.external_advantages import register_external

    loo, biased = register_external("their_advantages:loo"), register_external("their_advantages:zscored_turns")
    rows = run_exact(batch_sizes=(32,), batches=60, estimators=("turn_loo", "turn", loo, biased))["rows"]
    by = {(r["setting"], r["estimator"]): r for r in rows}
    for setting in {r["setting"] for r in rows}:  # the same function on the same episodes: the same figures
        assert by[(setting, loo)]["cosine"] == by[(setting, "turn_loo")]["cosine"]
        assert by[(setting, biased)]["cosine"] == by[(setting, "turn")]["cosine"]
    assert by[("variable_horizon", biased)]["cosine"] < 0.9 < by[("variable_horizon", loo)]["cosine"]


@pytest.mark.parametrize("spec, form, expected", [
    ("their_advantages:nope", "turns", "external advantage 'their_advantages:nope' does not import"),
    ("no_such_module:f", "turns", "does not import: No module named 'no_such_module'"),
    ("their_advantages:short", "turns", "returned lengths [1, 0, 2, 0] for episodes of [2, 1, 3, 1] turns"),
    ("their_advantages:nan", "turns", "returned a non-finite value"),
    ("their_advantages", "turns", "write module:function"),
])
def test_a_bad_external_advantage_is_one_line_naming_it(external_module, tmp_path, spec, form, expected):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(external_module), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "turngym.cli", "creditbench", "--oracle", "exact", "--external", spec,
                           "--external-form", form, "--out", str(tmp_path / "x")], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and expected in last, last
    assert not (tmp_path / "x").exists()  # refused before any oracle work


def test_verls_own_rloo_and_grpo_through_the_verl_form_equal_turngyms_estimators():
    """verl 0.9.1 ``verl/trainer/ppo/core_algos.py`` ``compute_rloo_outcome_advantage`` (A_i = R_i − mean_{j≠i} R_j on
    every token) and ``compute_grpo_outcome_advantage`` ((R_i − mean)/(std + 1e-6), torch's unbiased std), called as
    verl calls them, one token per turn."""
    pytest.importorskip("verl.trainer.ppo.core_algos")
    from turngym.credit.external_advantages import PROBE, register_external
    from turngym.training.advantages import get_estimator

    rloo = register_external("verl.trainer.ppo.core_algos:compute_rloo_outcome_advantage", "verl")
    grpo = register_external("verl.trainer.ppo.core_algos:compute_grpo_outcome_advantage", "verl")
    for name, ours in ((rloo, get_estimator("rloo")(PROBE)), (grpo, get_estimator("grpo")(PROBE, eps=1e-6))):
        theirs = get_estimator(name)(PROBE)
        assert [len(r) for r in theirs] == [len(r) for r in PROBE]
        for a, b in zip(theirs, ours, strict=True):
            assert a == pytest.approx(b, abs=1e-5)
