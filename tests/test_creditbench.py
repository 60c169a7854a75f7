"""creditbench: planted labels are true on the real envs, builds are deterministic, credit metrics are right."""

from __future__ import annotations

import pytest

from turngym.credit.accuracy import (
    auc,
    credit_score,
    group_advantages,
    labelled_pairs,
)
from turngym.credit.creditbench import (
    SUBSETS,
    BenchConfig,
    build_bfcl,
    build_mathcode,
    build_searchqa,
    gsm8k_steps,
    planted_labels,
    run_creditbench,
    score_groups,
)

SMALL = BenchConfig(groups=2, k=3, seed=0)


def _signature(groups):
    return [[(e.final_answer, planted_labels(e), [t.action for t in e.turns], e.outcome) for e in g] for g in groups]


@pytest.fixture(scope="module")
def searchqa_groups():
    return build_searchqa(SMALL)


def test_auc_and_spearman_on_known_orders():
    assert auc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert auc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5
    assert auc([1.0, 2.0], [1, 1]) is None
    groups = [[[(1.0, 1), (0.0, 0)]], [[(2.0, 1), (0.5, 0)]], [[(0.3, 0), (0.9, 1)]]]  # group > episode > pairs
    s = credit_score(groups, n_boot=200)
    assert s.auc == 1.0 and s.auc_ci95 == (1.0, 1.0) and s.n_turns == 6 and s.n_positive == 3 and s.n_groups == 3
    assert s.within_auc == 1.0 and s.n_within_pairs == 3


def test_paired_estimators_and_lagged_pairs():
    from turngym.rewards.base import declared_estimator

    assert declared_estimator("outcome") == "grpo" and declared_estimator("siop") == "turn_loo"
    assert declared_estimator("igpo") == "igpo" and declared_estimator("igpo_siop") == "turn_loo"
    adv = group_advantages("grpo", [[0.0, 1.0], [0.0, 0.0]])  # GRPO: the episode's z-score on every turn
    assert adv[0][0] == adv[0][1] > 0 > adv[1][0] == adv[1][1]
    assert labelled_pairs([[1.0, 2.0, 3.0]], [[1, 0, None]]) == [(1.0, 1), (2.0, 0)]
    assert labelled_pairs([[1.0, 2.0, 3.0]], [[1, 0, None]], lag=1) == [(2.0, 1), (3.0, 0)]


def test_searchqa_labels_true_on_the_default_index(searchqa_groups):
    labelled = 0
    for g in searchqa_groups:
        for ep in g:
            for t, lab in zip(ep.turns, planted_labels(ep), strict=True):
                if lab is not None:
                    labelled += 1
                    assert t.metrics["action"] == "search"
                    assert t.truth["retrieval_hit"].value is (lab == 1)  # label 1 retrieves a gold passage, 0 does not
                    assert t.truth["planted"].source == "planted" and "retrieval_hit" not in t.metrics
    assert labelled == SMALL.groups * SMALL.k * SUBSETS["search_turns"]
    answers = {e.final_answer for g in searchqa_groups for e in g}
    assert len(answers) > len(searchqa_groups)  # several answer clusters, not one per group


def test_builds_are_deterministic_under_a_seed(searchqa_groups):
    assert _signature(build_searchqa(SMALL)) == _signature(searchqa_groups)
    other = BenchConfig(groups=2, k=3, seed=1)
    assert _signature(build_searchqa(other)) != _signature(searchqa_groups)


def test_mathcode_labels_compute_needed_intermediates():
    from turngym.credit.creditbench import gsm8k_solutions

    def value(text):
        try:
            return float(text.strip())
        except ValueError:
            return None

    groups = build_mathcode(BenchConfig(groups=2, k=3, seed=0))
    solutions = gsm8k_solutions()
    assert len(groups) == 2
    for g in groups:
        for ep in g:
            needed = {v for _, v in gsm8k_steps(solutions[ep.task["id"]])}
            for t, lab in zip(ep.turns, planted_labels(ep), strict=True):
                if lab == 1:  # runs and prints an intermediate of the reference solution
                    assert t.metrics["exec_ok"] and value(t.metrics["output"]) in needed
                elif lab == 0:  # fails, or prints something the solution does not need
                    assert not t.metrics["exec_ok"] or value(t.metrics["output"]) not in needed


def test_gsm8k_steps_are_checked_arithmetic():
    assert gsm8k_steps("a <<16-3-4=9>>9 b <<9*2=18>>18") == [("16-3-4", 9.0), ("9*2", 18.0)]
    assert gsm8k_steps("<<2+2=5>>5") == []  # a wrong annotation is refused
    assert gsm8k_steps("<<__import__('os')=1>>1") == []


def test_bfcl_label0_turns_are_rejected_by_the_checker_after_a_correct_history():
    groups = build_bfcl(BenchConfig(groups=2, k=3, seed=0))
    seen = {0: 0, 1: 0}
    for g in groups:
        for ep in g:
            history_ok = True
            pending = None
            for t in ep.turns:
                if "planted" in t.truth:
                    pending = t.truth["planted"].value
                if "bfcl_turn_valid" in t.metrics:
                    if pending is not None and history_ok:
                        assert t.metrics["bfcl_turn_valid"] is bool(pending)
                        seen[pending] += 1
                    history_ok = history_ok and pending != 0
                    pending = None
    assert seen[0] > 0 and seen[1] > 0


def test_every_reward_scores_and_outcome_credit_follows_the_evidence(searchqa_groups, tiny_chat_policy, tmp_path):
    from turngym.rewards import get_reward
    from turngym.rewards.support import HFSupportScorer

    scorer = HFSupportScorer(tiny_chat_policy.model, tiny_chat_policy.tokenizer)
    by_name = {n: get_reward(n) for n in ("outcome", "ttrl", "empo", "funrl")}
    by_name.update(siop=get_reward("siop", scorer=scorer, tokens="text"), igpo=get_reward("igpo", scorer=scorer, tokens="text"))
    res = score_groups(searchqa_groups, by_name, n_boot=100)
    for name, row in res.items():
        assert "error" not in row, (name, row)
        a = row["advantage"]["auc"]
        assert a is None or 0.0 <= a <= 1.0
    # the gold answer follows the useful search (up to noise), so outcome credit separates the labels
    assert res["outcome"]["advantage"]["auc"] > 0.5
    summary = run_creditbench(SMALL, {"outcome": by_name["outcome"]}, tmp_path, n_boot=50,
                              built={"searchqa": searchqa_groups})
    assert (tmp_path / "creditbench.md").read_text().count("| outcome |") == 1
    assert summary["envs"]["searchqa"]["labelled_turns"] == SMALL.groups * SMALL.k * SUBSETS["search_turns"]
    # the viewer holds the planted episodes with outcome's per-turn rewards, and the report links it
    from turngym.views.viewer import build_payload  # noqa: F401 - the page's data is the payload it embeds
    page = (tmp_path / "view.html").read_text()
    assert "](view.html)" in (tmp_path / "creditbench.md").read_text()
    first = searchqa_groups[0][0]
    assert first.id in page and '"outcome"' in page


def test_ablate_reports_credit_accuracy_on_advantages(searchqa_groups, tmp_path):
    from turngym.credit.ablate import ablate
    from turngym.rewards import get_reward

    episodes = [e for g in searchqa_groups for e in g]
    rewards = {"outcome": get_reward("outcome"), "funrl": get_reward("funrl")}
    with pytest.raises(ValueError, match="several truth keys"):  # planted and retrieval_hit: name one
        ablate(episodes, rewards)
    summary = ablate(episodes, rewards, tmp_path, truth="retrieval_hit")
    adv = summary["rewards"]["outcome"]["credit_accuracy_advantage"]
    assert adv["estimator"] == "grpo" and adv["n_turns"] == summary["turns_with_ground_truth"] > 0
    assert adv["auc"] > 0.5  # gold answers follow the retrieval hits the env records
    assert "Credit accuracy on advantages" in (tmp_path / "ablation.md").read_text()
