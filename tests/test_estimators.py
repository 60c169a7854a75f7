"""Advantage estimators on groups computed by hand from their formulas (not from turngym's own output):
different episode lengths, all-equal rewards, a single episode, an empty episode, and a NaN reward."""

import math
import statistics

import pytest

from turngym.training.advantages import ESTIMATORS, get_estimator, gigpo, rloo, turn_loo

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


@pytest.mark.parametrize("name", [n for n in sorted(ESTIMATORS) if "branches" not in get_estimator(n).needs])  # vine: below
def test_every_estimator_keeps_the_shape_and_refuses_nan(name):
    est = get_estimator(name)
    out = est(GROUP)
    assert [len(a) for a in out] == [2, 1, 3]
    assert all(math.isfinite(x) for a in out for x in a)
    assert [len(a) for a in est([[1.0], [], [0.0, 1.0]])] == [1, 0, 2]
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="episode 1, turn 0 is not finite"):
            est([[1.0], [bad], [0.0]])


@pytest.mark.parametrize("name", ["grpo", "turn", "igpo_separate", "igpo", "igpo_siop", "egpo", "turn_loo", "rloo", "gigpo"])
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


# ------------------------------------------------------------------ igpo (the IGPO repository) and igpo_siop


def official_igpo_token_advantages(token_rewards, masks):
    """The IGPO repository's ``compute_grpo_outcome_advantage`` (GuoqingWang1/IGPO
    ``verl/trainer/ppo/core_algos.py`` lines 193-253) written out for this test: γ = 1 returns backwards,
    the return reset past a masked position (line 212: ``next_return = current_return * current_mask``), the
    group mean per position over all rollouts (line 236, ``mean(dim=0)``), no std, times the mask."""
    n, width = len(token_rewards), len(token_rewards[0])
    returns = [[0.0] * width for _ in range(n)]
    for i in range(n):
        nxt = 0.0
        for t in range(width - 1, -1, -1):
            cur = token_rewards[i][t] + nxt
            returns[i][t] = cur
            nxt = cur * masks[i][t]
    mean = [sum(returns[i][t] for i in range(n)) / n for t in range(width)]
    return [[(returns[i][t] - mean[t]) * masks[i][t] for t in range(width)] for i in range(n)]


def test_igpo_is_the_repositorys_per_position_mean_without_std():
    """By hand: returns-to-go ep0 [1, 1], ep1 [1], ep2 [2.5, 2, 2]; turn means over all K = 3 episodes, an
    ended episode counting 0 (padding): [4.5/3, 3/3, 2/3]; no std (core_algos.py lines 236-245)."""
    out = get_estimator("igpo")(GROUP)
    close(out[0], [1 - 1.5, 1 - 1.0])
    close(out[1], [1 - 1.5])
    close(out[2], [2.5 - 1.5, 2.0 - 1.0, 2.0 - 2 / 3])
    assert get_estimator("igpo")([[0.3, 0.7]]) == [[0.0, 0.0]]  # a group of one: its own mean


@pytest.mark.parametrize("length", [1, 3])
def test_igpo_equals_the_token_level_formula_when_turns_have_equal_token_lengths(length):
    """Each turn ``length`` tokens, its reward on its last token (``info_gain.py`` lines 187-205), right
    padding masked: every token of turn t gets turngym's per-turn value (the position mapping is exact here)."""
    width = 3 * length
    rewards, masks = [], []
    for ep in GROUP:
        row = [0.0] * width
        for t, r in enumerate(ep):
            row[(t + 1) * length - 1] = r
        rewards.append(row)
        masks.append([1] * (len(ep) * length) + [0] * (width - len(ep) * length))
    tokens = official_igpo_token_advantages(rewards, masks)
    for ep, per_turn, row in zip(GROUP, get_estimator("igpo")(GROUP), tokens, strict=True):
        for t in range(len(ep)):
            close(row[t * length:(t + 1) * length], [per_turn[t]] * length)


def test_igpo_siop_normalises_f1_and_nonzero_gains_apart_with_the_population_std():
    """dl-m9/SIOP ``verl/trainer/ppo/core_algos.py`` ``compute_igpo_turn_level_advantage`` (lines 2540-2632):
    f1 = the last position, ig = other non-zero rewards (line 2563); each set: mean, sqrt(population var + 1e-8),
    std 1 for one value (lines 2579-2597); (r − mean)/(std + 1e-6) (lines 2601-2612); a zero gain is no turn
    boundary, its tokens take the next boundary's advantage; A_b = r̂_b + γ·A_{next b} (lines 2490-2536)."""
    r = [[0.2, 0.0, 1.0], [-0.4, 0.5], [0.0]]
    f1s, igs = [1.0, 0.5, 0.0], [0.2, -0.4]
    fm, gm = sum(f1s) / 3, sum(igs) / 2
    fs = math.sqrt(sum((x - fm) ** 2 for x in f1s) / 3 + 1e-8) + 1e-6
    gs = math.sqrt(sum((x - gm) ** 2 for x in igs) / 2 + 1e-8) + 1e-6
    for gamma in (1.0, 0.5):
        a2 = (1.0 - fm) / fs
        out = get_estimator("igpo_siop")(r, gamma=gamma)
        close(out[0], [(0.2 - gm) / gs + gamma * a2, a2, a2])  # turn 1 (gain 0) takes turn 2's advantage
        close(out[1], [(-0.4 - gm) / gs + gamma * (0.5 - fm) / fs, (0.5 - fm) / fs])
        close(out[2], [(0.0 - fm) / fs])
    assert get_estimator("igpo_siop")([[0.0, 0.4]]) == [[0.0, 0.0]]  # one F1: mean = itself, std 1


def test_igpo_separate_is_turngyms_own_and_differs_from_both_repositories():
    """turngym's ``igpo_separate``: unbiased std and zero gains included; neither repository does both."""
    r = [[0.2, 0.0, 1.0], [-0.4, 0.5], [0.0]]
    sep, siop = get_estimator("igpo_separate")(r), get_estimator("igpo_siop")(r)
    assert sep[0][1] != pytest.approx(siop[0][1], abs=1e-3)
