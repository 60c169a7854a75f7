"""Advantage estimators on groups computed by hand from their formulas (not from turngym's own output):
different episode lengths, all-equal rewards, a single episode, an empty episode, and a NaN reward."""

import math
import statistics

import pytest

from turngym.training.advantages import ESTIMATORS, MC_ESTIMATORS, get_estimator, gigpo, rloo, turn_loo

# three episodes of lengths 2, 1, 3
GROUP = [[0.0, 1.0], [1.0], [0.5, 0.0, 2.0]]


def close(a, b, tol=1e-9):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x == pytest.approx(y, abs=tol)


# ------------------------------------------------------------------ turn_loo


def test_turn_loo_by_hand_with_different_lengths():
    # returns-to-go (gamma 1): ep0 [1, 1], ep1 [1], ep2 [2.5, 2, 2]
    g = [[1.0, 1.0], [1.0], [2.5, 2.0, 2.0]]
    # turn 0: all three run; turn 1: ep0 and ep2; turn 2: ep2 alone (baseline 0)
    centred = [[1 - (1 + 2.5) / 2, 1 - 2.0], [1 - (1 + 2.5) / 2], [2.5 - (1 + 1) / 2, 2.0 - 1.0, 2.0 - 0.0]]
    sigma = statistics.stdev([x for row in g for x in row]) + 1e-6
    out = turn_loo(GROUP, scale="std")
    for got, want in zip(out, centred, strict=True):
        close(got, [w / sigma for w in want])
    for got, want in zip(turn_loo(GROUP), centred, strict=True):
        close(got, want)


def test_turn_loo_discount_and_baseline_at_the_same_turn():
    r = [[1.0, 2.0], [0.0, 4.0]]
    gamma = 0.5
    g0, g1 = [1 + 0.5 * 2, 2.0], [0 + 0.5 * 4, 4.0]  # [2, 2], [2, 4]
    want = [[g0[0] - g1[0], g0[1] - g1[1]], [g1[0] - g0[0], g1[1] - g0[1]]]
    for got, w in zip(turn_loo(r, gamma=gamma), want, strict=True):
        close(got, w)


def test_turn_loo_equal_rewards_single_and_empty_episodes():
    assert turn_loo([[1.0, 1.0], [1.0, 1.0]]) == [[0.0, 0.0], [0.0, 0.0]]
    # a single episode: no other episode runs, baseline 0 -> its returns-to-go over their std
    sigma = statistics.stdev([3.0, 2.0]) + 1e-6
    close(turn_loo([[1.0, 2.0]], scale="std")[0], [3.0 / sigma, 2.0 / sigma])
    # an empty episode runs at no turn: it is no one's baseline and gets no advantage
    out = turn_loo([[1.0], [], [3.0]])
    assert out == [[-2.0], [], [2.0]]
    assert turn_loo([]) == []
    with pytest.raises(ValueError, match="scale"):
        turn_loo(GROUP, scale="max")


# ------------------------------------------------------------------ rloo


def test_rloo_by_hand():
    # totals 1, 1, 2.5: A_i = R_i - mean of the others
    want = [1 - (1 + 2.5) / 2, 1 - (1 + 2.5) / 2, 2.5 - 1.0]
    out = rloo(GROUP)
    assert [len(a) for a in out] == [2, 1, 3]
    for a, w in zip(out, want, strict=True):
        close(a, [w] * len(a))
    assert rloo([[0.3, 0.2], [0.5]]) == [[0.0, 0.0], [0.0]]  # equal totals
    assert rloo([[0.25, 0.5]]) == [[0.0, 0.0]]  # a group of one: no baseline, 0 (TRL; verl keeps the total)
    assert rloo([[1.0], []]) == [[1.0], []]  # an empty episode has total 0
    assert rloo([]) == []


def test_rloo_equals_the_verl_and_trl_formulas():
    totals = [0.0, 1.0, 1.0, 0.0, 1.0]
    n, mean, total = len(totals), sum(totals) / len(totals), sum(totals)
    out = [a[0] for a in rloo([[x] for x in totals])]
    close(out, [r * n / (n - 1) - mean * n / (n - 1) for r in totals])  # verl: rescaled centring
    close(out, [r - (total - r) / (n - 1) for r in totals])  # TRL: reward minus the others' mean, no std


# ------------------------------------------------------------------ gigpo


def test_gigpo_episode_term_counts_every_turn():
    # totals 1, 1, 2.5 on 2, 1, 3 turns: mean over the six turns = (1+1+1+2.5*3)/6 = 1.75
    out = gigpo(GROUP)
    close(out[0], [-0.75, -0.75])
    close(out[1], [-0.75])
    close(out[2], [0.75, 0.75, 0.75])
    rows = [1.0, 1.0, 1.0, 2.5, 2.5, 2.5]
    sd = statistics.stdev(rows)
    close(gigpo(GROUP, mode="mean_std_norm")[2], [(2.5 - 1.75) / (sd + 1e-6)] * 3)


def test_gigpo_step_groups_by_hand():
    states = [["a", "b"], ["a"], ["a", "b", "c"]]
    gamma = 0.95
    g = [[0 + gamma * 1, 1.0], [1.0], [0.5 + gamma * (0 + gamma * 2), 0 + gamma * 2, 2.0]]
    mean_a = (g[0][0] + g[1][0] + g[2][0]) / 3
    mean_b = (g[0][1] + g[2][1]) / 2
    want = [[-0.75 + (g[0][0] - mean_a), -0.75 + (g[0][1] - mean_b)],
            [-0.75 + (g[1][0] - mean_a)],
            [0.75 + (g[2][0] - mean_a), 0.75 + (g[2][1] - mean_b), 0.75 + 0.0]]  # "c" seen once: 0
    out = gigpo(GROUP, states=states)
    for got, w in zip(out, want, strict=True):
        close(got, w)
    half = gigpo(GROUP, states=states, omega=0.5, gamma=1.0)
    g1 = [[1.0, 1.0], [1.0], [2.5, 2.0, 2.0]]
    m_a, m_b = (1 + 1 + 2.5) / 3, (1 + 2) / 2
    close(half[2], [0.75 + 0.5 * (2.5 - m_a), 0.75 + 0.5 * (g1[2][1] - m_b), 0.75])
    with pytest.raises(ValueError, match="shape"):
        gigpo(GROUP, states=[["a"], ["a"], ["a"]])
    with pytest.raises(ValueError, match="mode"):
        gigpo(GROUP, mode="std")


def test_gigpo_single_episode_equal_rewards_and_empty():
    assert gigpo([[1.0]]) == [[1.0]]  # one turn in the group: mean 0, as verl-agent
    assert gigpo([[1.0, 0.0]]) == [[0.0, 0.0]]  # one episode, two turns: the mean is its own total
    assert gigpo([[1.0], [1.0]], states=[["s"], ["s"]]) == [[0.0], [0.0]]
    assert gigpo([[2.0], []]) == [[2.0], []]  # the empty episode has no turn row: one row left, mean 0
    assert gigpo([]) == []


# ------------------------------------------------------------------ every estimator


def test_turn_is_biased_by_length_and_turn_loo_is_not():
    """Two episodes with the same return (1) from turn 0: ``turn`` subtracts the group mean once per remaining
    turn, so the longer one's first turn gets less credit; ``turn_loo`` compares returns at the same turn."""
    r = [[1.0, 0.0, 0.0], [1.0]]
    s = statistics.stdev([1.0, 0.0, 0.0, 1.0]) + 1e-6
    a = get_estimator("turn")(r)
    close([a[0][0], a[1][0]], [(0.5 - 0.5 - 0.5) / s, 0.5 / s])
    assert turn_loo(r) == turn_loo(r, scale="std") == [[0.0, 0.0, 0.0], [0.0]]


@pytest.mark.parametrize("name", [n for n in sorted(ESTIMATORS) if n not in MC_ESTIMATORS])  # vine: tested below
def test_every_estimator_keeps_the_shape_and_refuses_nan(name):
    est = get_estimator(name)
    out = est(GROUP)
    assert [len(a) for a in out] == [2, 1, 3]
    assert all(math.isfinite(x) for a in out for x in a)
    assert [len(a) for a in est([[1.0], [], [0.0, 1.0]])] == [1, 0, 2]
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="episode 1, turn 0 is not finite"):
            est([[1.0], [bad], [0.0]])


@pytest.mark.parametrize("name", ["grpo", "turn", "igpo_separate", "egpo", "turn_loo", "rloo", "gigpo"])
def test_every_estimator_gives_equal_rewards_zero(name):
    out = get_estimator(name)([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    assert all(x == pytest.approx(0.0, abs=1e-9) for a in out for x in a), (name, out)


def test_vine_returns_the_monte_carlo_advantages_it_is_given():
    from turngym.training.advantages import get_estimator

    vine = get_estimator("vine")
    assert vine([[0.0, 1.0], [0.0]], mc=[[0.25, -0.5], [None]]) == [[0.25, -0.5], [0.0]]  # untrusted turn: 0
    with pytest.raises(ValueError, match="Monte-Carlo"):
        vine([[1.0]])
    with pytest.raises(ValueError, match="shape"):
        vine([[1.0, 2.0]], mc=[[0.1]])
