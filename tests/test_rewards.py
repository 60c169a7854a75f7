"""Rewards on hand-computed groups, with a fake support scorer (named as such) beside
tests of the real transformers scorer."""

import math
from dataclasses import dataclass

import pytest

from turngym.episode import Episode, Turn
from turngym.rewards import get_reward
from turngym.rewards.equivalence import MathEquivalence, NLIEquivalence, NormalizedMatch, cluster_answers


class FakeCharTokenizer:
    """A fake tokenizer: one id per character, with character offsets."""

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        out = {"input_ids": [ord(c) for c in text]}
        if return_offsets_mapping:
            out["offset_mapping"] = [(i, i + 1) for i in range(len(text))]
        return out


@dataclass
class FakeSupportScorer:
    """A fake scorer: p(ref | point) looked up from a table keyed by (episode, reference) and point
    index; it records the points and continuations it is asked for."""

    probs: dict
    tokenizer = FakeCharTokenizer()

    def __post_init__(self):
        self.calls = []

    def mean_logprobs(self, points, continuations):
        self.calls.append((points, continuations))
        ep = points[0][0] - 1000
        log = lambda p: math.log(p) if p > 0 else (-math.inf if p == 0 else p)  # noqa: E731
        refs = ["".join(map(chr, c.ids[c.start:c.end])) for c in continuations]
        return [[log(self.probs[(ep, r)][i]) for r in refs] for i in range(len(points))]


def make_ep(i, answer, observations, question="Where is the Eiffel Tower?", gold="Paris", final_action=None):
    turns = [Turn(index=j, action="<search>q</search>", observation=o, action_ids=[1], observation_ids=[2, 3],
                  tool_calls=[{"name": "search", "arguments": {"query": "q"}}])
             for j, o in enumerate(observations)]
    turns.append(Turn(index=len(observations), action=final_action or f"<answer>{answer}</answer>", action_ids=[4]))
    return Episode(id=f"e{i}", env_id="turngym/SearchQA-v0", task={"question": question, "answers": [gold]},
                   prompt=[{"role": "user", "content": question}], prompt_ids=[1000 + i], turns=turns,
                   final_answer=answer, outcome={"em": float(answer is not None and answer.lower() == gold.lower())})


def group():
    return [make_ep(0, "Paris", ["Paris is in France"]),
            make_ep(1, "paris", ["no idea", "The tower is in Paris."]),
            make_ep(2, "London", ["London bridge"]),
            make_ep(3, None, ["nothing"])]


# p(reference | τ_t) for t = 0..T: an episode with T turns has T + 1 scoring points
PROBS = {(0, "Paris"): [0.1, 0.6, 0.8], (0, "paris"): [0.05, 0.3, 0.6],
         (1, "Paris"): [0.1, 0.2, 0.7, 0.9], (1, "paris"): [0.05, 0.1, 0.5, 0.7],
         (2, "London"): [0.2, 0.4, 0.5]}


def test_outcome_ttrl_empo_hand_computed():
    """TTRL votes on the extracted strings (PRIME-RL/TTRL ``verl/utils/reward_score/ttrl/ttt_metrics.py``
    lines 18-27: ``Counter(model_answers).most_common(1)``, then each rollout verified against the label);
    EMPO clusters the extracted strings (QingyangZhang/EMPO ``trl/src/open_r1/rewards.py`` line 194,
    ``get_semantic_ids_by_rule(predictions, rule=verify)``: math-verify compares two strings as strings)."""
    g = group()
    assert get_reward("outcome").score_group(g).rewards == [[0, 1.0], [0, 0, 1.0], [0, 0.0], [0, 0.0]]
    assert get_reward("outcome", metric="em").score_group(g).rewards[1] == [0, 0, 1.0]
    # strings "Paris", "paris", "London": a three-way tie, the first seen ("Paris") wins; "paris" verifies equal
    ttrl = get_reward("ttrl").score_group(g)
    assert ttrl.rewards == [[0, 1.0], [0, 0, 1.0], [0, 0.0], [0, 0.0]] and ttrl.diagnostics["label"] == "Paris"
    # EMPO on strings: four singleton clusters (the unanswered one too), H = log 4 = log K: the gate zeroes all
    empo = get_reward("empo").score_group(g)
    assert empo.rewards == [[0, 0.0], [0, 0, 0.0], [0, 0.0], [0, 0.0]] and empo.diagnostics["gated"]
    assert empo.diagnostics["semantic_entropy"] == pytest.approx(math.log(4))
    # cluster_on="equivalence" (turngym's option): Paris/paris merge, p(c) = |c| / K over all K rollouts
    merged = get_reward("empo", cluster_on="equivalence").score_group(g)
    assert merged.rewards == [[0, 2 / 4], [0, 0, 2 / 4], [0, 1 / 4], [0, 0.0]]
    assert get_reward("empo", cluster_on="equivalence", share_of="answered").score_group(g).rewards == [
        [0, 2 / 3], [0, 0, 2 / 3], [0, 1 / 3], [0, 0.0]]
    assert merged.diagnostics["clusters"]["labels"] == [0, 0, 1, None]


def test_ttrl_and_empo_strings_differ_from_merged_votes():
    """Where merging changes the vote: "paris", "Paris", "London", "London". TTRL's ``Counter`` over strings
    (ttt_metrics.py:19-21) makes "London" (2 votes) the label; merged, Paris (2) ties London (2) and the
    earliest wins. EMPO's string clusters (rewards.py:194-207): sizes 1, 1, 2, H < log 4, p = 1/4, 1/4, 2/4."""
    g = [make_ep(0, "paris", ["x"]), make_ep(1, "Paris", ["x"]), make_ep(2, "London", ["x"]), make_ep(3, "London", ["x"])]
    assert [r[-1] for r in get_reward("ttrl").score_group(g).rewards] == [0.0, 0.0, 1.0, 1.0]
    assert [r[-1] for r in get_reward("ttrl", vote_on="equivalence").score_group(g).rewards] == [1.0, 1.0, 0.0, 0.0]
    assert [r[-1] for r in get_reward("empo").score_group(g).rewards] == [1 / 4, 1 / 4, 2 / 4, 2 / 4]
    assert [r[-1] for r in get_reward("empo", cluster_on="equivalence").score_group(g).rewards] == [2 / 4] * 4
    with pytest.raises(ValueError, match="vote_on"):
        get_reward("ttrl", vote_on="clusters")
    with pytest.raises(ValueError, match="cluster_on"):
        get_reward("empo", cluster_on="nli")


def math_group(answers):
    from turngym.episode import RewardNeeds

    needs = RewardNeeds(answer_kind="math", answer_cue="boxed")
    return [Episode(id=f"m{i}", env_id="turngym/MathCode-v0", task={"question": "q", "answers": ["0"]},
                    turns=[Turn(index=0, action=f"\\boxed{{{a}}}" if a is not None else "no answer")],
                    final_answer=a, reward_needs=needs) for i, a in enumerate(answers)]


# Held-out math groups: the rewards PRIME-RL/TTRL's ``test_time_train_metrics`` (ttt_metrics.py lines 18-27 at
# 3e2cc93: extract_answer + strip_string keys, Counter vote, grade_answer against the label) and
# QingyangZhang/EMPO's ``semantic_entropy_math_reward`` (rewards.py lines 150-215 at c5eccd4) return for
# responses ending in ``\boxed{answer}`` ("no answer": a response with no box and no number), each run on
# these groups; "raw" is turngym's earlier default (raw strings, unanswered rollouts abstain, math-verify).
TTRL_HELD_OUT = [  # (answers, official label, official rewards, earlier default's rewards)
    ([r"\dfrac{1}{2}", r"\frac{1}{2}", r"\tfrac{1}{2}", "3", "3"], r"\frac{1}{2}", [1, 1, 1, 0, 0], [0, 0, 0, 1, 1]),
    ([None, None, None, "5", "5"], "", [1, 1, 1, 0, 0], [0, 0, 0, 1, 1]),
    (["0.5", "1/2", r"\frac{1}{2}", "2"], r"\frac{1}{2}", [1, 1, 1, 0], [1, 1, 1, 0]),
    ([r"3\text{ cm}", "3", "4", "4"], "3", [1, 1, 0, 0], [0, 0, 1, 1]),
    ([r"\frac{2}{4}", r"\frac{1}{2}", r"\frac{1}{2}"], r"\frac{1}{2}", [0, 1, 1], [1, 1, 1]),
    (["seven", "7", "8"], "7", [1, 1, 0], [1, 0, 0]),
    ([r"\$5.00", "5", "6", "6"], "5", [1, 1, 0, 0], [0, 0, 1, 1]),
]
EMPO_HELD_OUT = [  # (answers, official rewards, earlier default's rewards)
    ([r"\dfrac{1}{2}", r"\frac{1}{2}", r"\tfrac{1}{2}", "3", "3"], [0.6, 0.6, 0.6, 0.4, 0.4], [0.2, 0.2, 0.2, 0.4, 0.4]),
    ([r"\left(1,2\right)", "(1,2)", "(1,2)", "3"], [0.75, 0.75, 0.75, 0.25], [0.25, 0.5, 0.5, 0.25]),
    ([r"3\text{ cm}", "3", "4", None], [0.5, 0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]),
    ([r"\frac12", r"\frac{1}{2}", "1/2", "0.5"], [0.0] * 4, [0.0] * 4),
]


@pytest.mark.parametrize(("answers", "label", "official", "raw"), TTRL_HELD_OUT)
def test_ttrl_defaults_equal_the_official_vote_on_held_out_math_groups(answers, label, official, raw):
    res = get_reward("ttrl").score_group(math_group(answers))
    assert res.diagnostics["label"] == label and [r[-1] for r in res.rewards] == official
    earlier = get_reward("ttrl", normalise="none", unanswered="abstain", equivalence="auto")
    assert [r[-1] for r in earlier.score_group(math_group(answers)).rewards] == raw


def test_ttrl_unanswered_rollouts_vote_empty_unless_they_abstain():
    """ttt_metrics.py lines 18-21: every rollout's extracted string votes, "" included (extract_answer never
    returns None for math); line 27: grade_answer("", "") is True, so when "" wins the unanswered get 1."""
    g = math_group([None, None, None, "5", "5"])
    assert get_reward("ttrl").score_group(g).diagnostics["label"] == ""
    abstain = get_reward("ttrl", unanswered="abstain").score_group(g)
    assert abstain.diagnostics["label"] == "5" and [r[-1] for r in abstain.rewards] == [0, 0, 0, 1, 1]
    merged = get_reward("ttrl", vote_on="equivalence", equivalence="math").score_group(g)
    assert [r[-1] for r in merged.rewards] == [1, 1, 1, 0, 0] and merged.diagnostics["unanswered_won"]
    merged = get_reward("ttrl", vote_on="equivalence", equivalence="math", unanswered="abstain").score_group(g)
    assert [r[-1] for r in merged.rewards] == [0, 0, 0, 1, 1]
    # the sounder check of the label: math-verify calls \frac{2}{4} equal to \frac{1}{2}, TTRL's grader does not
    g = math_group([r"\frac{2}{4}", r"\frac{1}{2}", r"\frac{1}{2}"])
    assert [r[-1] for r in get_reward("ttrl", equivalence="math").score_group(g).rewards] == [1, 1, 1]
    with pytest.raises(ValueError, match="unanswered"):
        get_reward("ttrl", unanswered="skip")
    with pytest.raises(ValueError, match="normalise"):
        get_reward("empo", normalise="latex")


@pytest.mark.parametrize(("answers", "official", "raw"), EMPO_HELD_OUT)
def test_empo_defaults_equal_the_official_clusters_on_held_out_math_groups(answers, official, raw):
    assert [r[-1] for r in get_reward("empo").score_group(math_group(answers)).rewards] == pytest.approx(official)
    earlier = get_reward("empo", normalise="none").score_group(math_group(answers))
    assert [r[-1] for r in earlier.rewards] == pytest.approx(raw)


def test_siop_hand_computed_with_the_final_turn_gain():
    lam, eta, eps = 0.5, 1.0, 1e-8
    res = get_reward("siop", scorer=FakeSupportScorer(PROBS), lam=lam, eta=eta, eps=eps).score_group(group())
    d = res.diagnostics
    # m counts answered rollouts only; r: answer-in-evidence over tool results, mean over members of their mean
    assert d["m"] == pytest.approx([2 / 3, 1 / 3])
    assert d["r"] == pytest.approx([(1.0 + 0.5) / 2, 1.0])
    z = 2 / 3 * math.exp(0.75) + 1 / 3 * math.exp(1.0)
    q0, q1 = 2 / 3 * math.exp(0.75) / z, 1 / 3 * math.exp(1.0) / z
    assert d["q"] == pytest.approx([q0, q1])
    assert d["references"] == [["Paris", "paris"], ["London"]]
    sup0 = [0.5 * 0.1 + 0.5 * 0.05, 0.5 * 0.6 + 0.5 * 0.3, 0.5 * 0.8 + 0.5 * 0.6]
    sup1 = [0.5 * 0.1 + 0.5 * 0.05, 0.5 * 0.2 + 0.5 * 0.1, 0.5 * 0.7 + 0.5 * 0.5, 0.5 * 0.9 + 0.5 * 0.7]
    phi = lambda q, p: q * math.log(p + eps)  # noqa: E731
    # r_t = Φ_t − Φ_{t−1}; the final turn adds (1 − λ)·q to its own ΔΦ (official SIOP)
    assert res.rewards[0] == pytest.approx([phi(q0, sup0[1]) - phi(q0, sup0[0]),
                                            phi(q0, sup0[2]) - phi(q0, sup0[1]) + (1 - lam) * q0])
    assert res.rewards[1] == pytest.approx([phi(q0, sup1[1]) - phi(q0, sup1[0]),
                                            phi(q0, sup1[2]) - phi(q0, sup1[1]),
                                            phi(q0, sup1[3]) - phi(q0, sup1[2]) + (1 - lam) * q0])
    assert res.rewards[2] == pytest.approx([phi(q1, 0.4) - phi(q1, 0.2), phi(q1, 0.5) - phi(q1, 0.4) + (1 - lam) * q1])
    assert res.rewards[3] == [0.0, 0.0]  # unanswered: q = 0, zero rewards


def test_siop_points_are_before_the_observation_and_end_with_the_final_turn():
    from turngym.rewards.support import scoring_points

    ep = make_ep(1, "paris", ["no idea", "The tower is in Paris."])
    before = scoring_points(ep, None, "before_observation")
    after = scoring_points(ep, None, "after_observation")
    assert before == [[1001], [1001, 1], [1001, 1, 2, 3, 1], [1001, 1, 2, 3, 1, 2, 3, 4]]
    assert after == [[1001], [1001, 1, 2, 3], [1001, 1, 2, 3, 1, 2, 3], [1001, 1, 2, 3, 1, 2, 3, 4]]
    ep.turns[-1].observation_ids = [9]  # a truncated episode's last turn: τ_T still ends with the action
    assert scoring_points(ep, None, "after_observation")[-1] == [1001, 1, 2, 3, 1, 2, 3, 4]
    scorer = FakeSupportScorer(PROBS)
    get_reward("siop", scorer=scorer).score_group([ep, make_ep(0, "Paris", ["Paris is in France"])])
    assert [c[0] for c in scorer.calls][0] == before  # the default is official SIOP's
    with pytest.raises(ValueError, match="prefix"):
        get_reward("siop", prefix="sideways")


def test_official_pseudo_answer_scores_only_the_references_own_tokens():
    from turngym.rewards.support import OFFICIAL_PREFIX, PseudoAnswer, continuation

    c = continuation(FakeCharTokenizer(), PseudoAnswer(), "Paris", "<eot>")
    text = "".join(map(chr, c.ids))
    assert text == OFFICIAL_PREFIX + "Paris" + "\n</answer>" + "<eot>"
    assert text.startswith("\nNow there's enough information to answer\n</think>\n<answer>\n")
    assert text[c.start:c.end] == "Paris"
    boxed = continuation(FakeCharTokenizer(), PseudoAnswer.make("boxed"), "42")
    assert "".join(map(chr, boxed.ids)).endswith("\\boxed{42}")
    from turngym.envs.math_code import MathCodeEnv

    assert PseudoAnswer.make("auto", MathCodeEnv.reward_needs) == PseudoAnswer.make("boxed")  # the env's declared cue
    with pytest.raises(ValueError, match="pseudo_answer"):
        PseudoAnswer.make("nope")


def test_siop_process_rewards_telescope():
    lam = 0.5
    res = get_reward("siop", scorer=FakeSupportScorer(PROBS), lam=lam).score_group(group())
    for rewards, phi, lab in zip(res.rewards, res.diagnostics["potentials"], res.diagnostics["clusters"]["labels"], strict=True):
        if phi is None:
            continue
        q = res.diagnostics["q"][lab]
        assert sum(rewards) - (1 - lam) * q == pytest.approx(phi[-1] - phi[0])


def test_single_cluster_gets_q_one_and_single_turn_gets_only_the_final_term():
    eps = [make_ep(0, "Paris", ["Paris"]), make_ep(1, "PARIS!", ["x"])]
    one_turn = make_ep(2, "paris", [])  # the fake has no table for it: it must not be scored at all
    res = get_reward("siop", scorer=FakeSupportScorer(PROBS | {(1, "Paris"): [0.1, 0.2, 0.3]}), lam=0.3,
                     n_ref=1).score_group(eps + [one_turn])
    assert res.diagnostics["q"] == [1.0]
    assert res.rewards[2] == [pytest.approx(0.7)]
    assert res.rewards[0] == pytest.approx([math.log(0.6 + 1e-8) - math.log(0.1 + 1e-8),
                                            math.log(0.8 + 1e-8) - math.log(0.6 + 1e-8) + 0.7])


def test_siop_equals_igpo_variant_when_q_concentrates_on_gold_and_gold_is_the_reference():
    probs = {(i, "Paris"): [0.1 + 0.1 * i, 0.3 + 0.05 * i, 0.7, 0.9] for i in range(3)}
    probs[(3, "London")] = probs[(3, "Paris")] = [0.2, 0.2, 0.2, 0.2]
    g = [make_ep(i, "Paris", ["Paris here", "more Paris"]) for i in range(3)] + [make_ep(3, "London", ["x", "y"])]
    scorer = FakeSupportScorer(probs)
    siop = get_reward("siop", scorer=scorer, eta=60.0, n_ref=1).score_group(g)
    igpo = get_reward("igpo", scorer=scorer, gain="log_probability", prefix="before_observation",
                      final_reward="outcome", lam=0.5, format_penalty=None, final_turn_gain=True).score_group(g)
    assert siop.diagnostics["q"][0] == pytest.approx(1.0, abs=1e-9)
    for i in range(3):
        assert siop.rewards[i] == pytest.approx(igpo.rewards[i], abs=1e-6)
    assert igpo.rewards[3][-1] == pytest.approx(0.0)  # log 0.2 − log 0.2 + (1 − λ)·0 (wrong answer)


def test_non_finite_support_as_the_official_siop_code():
    """dl-m9/SIOP ``verl/utils/siop/siop_process_reward.py`` lines 494-526: p̂ = Σ α·exp(mlp) over the finite
    references only (α not renormalised); no finite reference: the point is unscorable, the two rewards
    using it are 0; r = q·(log(p_t + ε) − log(p_{t−1} + ε)), NaN/inf → 0; the final bonus (1 − λ)·q is kept."""
    eps, lam = 1e-8, 0.5
    # one cluster of two distinct answers (q = 1), n_ref = 2: references "Paris" and "paris", α = 1/2 each
    probs = {(0, "Paris"): [0.2, float("nan"), 0.5, 0.6], (0, "paris"): [0.1, 0.3, 0.4, 0.5],
             (1, "Paris"): [0.2, 0.0, 0.4], (1, "paris"): [0.1, 0.0, 0.3]}
    g = [make_ep(0, "Paris", ["a", "b"]), make_ep(1, "paris", ["c"])]
    res = get_reward("siop", scorer=FakeSupportScorer(probs), eps=eps, lam=lam, n_ref=2).score_group(g)
    assert res.diagnostics["q"] == [1.0]
    p0 = [0.5 * 0.2 + 0.5 * 0.1, 0.5 * 0.3, 0.5 * 0.5 + 0.5 * 0.4, 0.5 * 0.6 + 0.5 * 0.5]  # NaN left out
    lg = lambda p: math.log(p + eps)  # noqa: E731
    assert res.rewards[0] == pytest.approx([lg(p0[1]) - lg(p0[0]), lg(p0[2]) - lg(p0[1]),
                                            lg(p0[3]) - lg(p0[2]) + (1 - lam)])
    # τ_1 of episode 1: both log-probabilities are −inf, no finite reference: turns 1 and 2 get 0, bonus kept
    assert res.rewards[1] == pytest.approx([0.0, 0.0 + (1 - lam)])
    assert res.diagnostics["support"][1][1] is None
    # IGPO's repository has no rule (a NaN would reach its advantages): turngym applies the same one
    igpo = get_reward("igpo", scorer=FakeSupportScorer({(0, "Paris"): [0.2, float("nan"), 0.5]})).score_group(g[:1])
    assert igpo.rewards[0] == [0.0, 0.0, 1.0]  # both gains next to the unscorable τ_1 are 0; the F1 is kept


def test_evidence_counts_every_non_empty_tool_response_cut_to_2000_characters():
    """dl-m9/SIOP ``verl/utils/siop/siop_process_reward.py`` lines 257-283: every ``<tool_response>`` the rollout
    got counts, tool errors included ("No results found for: ...", ``tool_agent_loop.py`` line 522 "Error when
    executing tool: ..."), stripped, skipped when empty, cut to 2,000 characters; per rollout the mean, per
    cluster the mean over members with responses (line 299). ``evidence_source="tool_results"`` drops errors."""
    from turngym.rewards.evidence import AnswerInEvidence, cluster_evidence, evidence_texts

    ep = make_ep(0, "Paris", ["  Paris is in France ", "Paris again", "x" * 2500 + " Paris", "   "])
    ep.turns[1].parse_error = "no <search> or <answer> tag"  # an invalid-action message: no tool ran
    ep.turns[1].tool_calls = []
    assert evidence_texts(ep) == ["Paris is in France", "x" * 2000]  # the blank response is skipped
    assert evidence_texts(ep, "observations", None)[1] == "Paris again"
    err = make_ep(1, "Paris", ["Error when executing tool: Paris unreachable"])
    err.turns[0].metrics = {"retrieval_error": "down"}
    assert evidence_texts(err) == ["Error when executing tool: Paris unreachable"]  # official: it counts
    assert evidence_texts(err, "tool_results") == []  # the option: errors left out
    # official: ep scores (1 + 0)/2, err scores 1 -> r = (0.5 + 1)/2
    assert cluster_evidence(AnswerInEvidence(), "q", "Paris", [ep, err]) == pytest.approx(0.75)
    # the option: err has none; ep keeps its blank response as before: (1 + 0 + 0)/3
    assert cluster_evidence(AnswerInEvidence(), "q", "Paris", [ep, err], "tool_results") == pytest.approx(1 / 3)
    assert cluster_evidence(AnswerInEvidence(), "q", "Paris", [ep, err], "observations", None) == pytest.approx(
        (3 / 4 + 1.0) / 2)


def test_igpo_hand_computed_official_defaults():
    """GuoqingWang1/IGPO: gains p_t − p_{t−1} with p = exp(mean log-prob of the gold tokens), scored before each
    generation (``scrl/llm_agent/generation.py`` lines 414-423); ``verl/utils/reward_score/info_gain.py`` lines
    187-205 put gain i on chat piece i < T − 1 and the F1 alone on the last one (the answer turn gets no gain);
    one piece: the F1 alone (lines 159-160); F1 or −2 by ``compute_f1`` (lines 67-132)."""
    probs = {(0, "Paris"): [0.2, 0.5], (1, "Paris"): [0.1, 0.05, 0.4],
             (2, "Paris"): [0.3, 0.2], (3, "Paris"): [0.3, 0.4], (4, "Paris"): [0.5, 0.5]}
    g = [make_ep(0, "Paris", ["a"]), make_ep(1, "Lyon", ["b", "c"]), make_ep(2, None, ["d"], final_action="no idea"),
         make_ep(3, "the Paris", ["e"]), make_ep(4, "Paris", ["f"], final_action="<think>so<answer>Paris</answer>")]
    scorer = FakeSupportScorer(probs)
    res = get_reward("igpo", scorer=scorer).score_group(g)
    assert res.rewards[0] == pytest.approx([0.5 - 0.2, 1.0])
    assert res.rewards[1] == pytest.approx([0.05 - 0.1, 0.4 - 0.05, 0.0])
    assert res.rewards[2] == pytest.approx([0.2 - 0.3, -2.0])  # no answer: format penalty
    assert res.rewards[3] == pytest.approx([0.4 - 0.3, 2 * 0.5 * 1.0 / 1.5])  # set F1, "the" kept
    assert res.rewards[4] == pytest.approx([0.0, -2.0])  # <think> never closed: format penalty
    # scored after each observation, τ_0..τ_{T−1}; τ_T (after the answer) is never scored
    assert scorer.calls[0][0] == [[1000], [1000, 1, 2, 3]]
    assert get_reward("igpo", scorer=scorer).score_group([make_ep(5, "Paris", [])]).rewards == [[1.0]]


def test_igpo_options_reproduce_the_earlier_variant_and_the_final_turn_gain():
    probs = {(0, "Paris"): [0.2, 0.5, 0.7], (1, "Paris"): [0.1, 0.05, 0.4, 0.3]}
    g = [make_ep(0, "Paris", ["a"]), make_ep(1, "Lyon", ["b", "c"])]
    res = get_reward("igpo", scorer=FakeSupportScorer(probs), lam=0.4, eps=0.0, gain="log_probability",
                     final_reward="outcome", format_penalty=None, final_turn_gain=True).score_group(g)
    assert res.rewards[0] == pytest.approx([math.log(0.5) - math.log(0.2), math.log(0.7) - math.log(0.5) + 0.6 * 1.0])
    assert res.rewards[1] == pytest.approx([math.log(0.05) - math.log(0.1), math.log(0.4) - math.log(0.05),
                                            math.log(0.3) - math.log(0.4)])
    # final_turn_gain=True: the answer turn also gets ΔΦ_T, scored at τ_T (as SIOP)
    gain = get_reward("igpo", scorer=FakeSupportScorer(probs), final_turn_gain=True).score_group(g)
    assert gain.rewards[0] == pytest.approx([0.5 - 0.2, 0.7 - 0.5 + 1.0])
    assert gain.rewards[1] == pytest.approx([0.05 - 0.1, 0.4 - 0.05, 0.3 - 0.4 + 0.0])
    with pytest.raises(ValueError, match="gain"):
        get_reward("igpo", gain="log")
    with pytest.raises(ValueError, match="turn_limit_gains"):
        get_reward("igpo", turn_limit_gains="drop")


def limit_ep(i, n_turns, gold="Paris"):
    """An episode cut by the turn limit: every turn an executed search, no answer (the last observation dropped)."""
    turns = [Turn(index=j, action="<search>q</search>", observation=None if j == n_turns - 1 else f"o{j}",
                  action_ids=[1], observation_ids=None if j == n_turns - 1 else [2, 3],
                  tool_calls=[{"name": "search", "arguments": {"query": "q"}}]) for j in range(n_turns)]
    return Episode(id=f"e{i}", env_id="turngym/SearchQA-v0", task={"question": "Where?", "answers": [gold]},
                   prompt=[{"role": "user", "content": "Where?"}], prompt_ids=[1000 + i], turns=turns,
                   final_answer=None, truncated=True, outcome={"em": 0.0})


def test_igpo_turn_limit_gains_dropped_exactly_when_the_repository_drops_them():
    """GuoqingWang1/IGPO: a rollout still calling tools at the turn limit ends with the generation prompt
    (``generation.py`` line 501), so its response splits into T + 1 chat pieces but has only T − 1 gains
    (one per later step, lines 419-423). ``info_gain.py`` lines 171-184: if pieces > 10 a 0.0 gain is appended
    and the gains are placed; else the F1 alone (no answer: −2) on the last token. The launcher's
    ``max_turns=10`` (``policy_optimization.sh``) gives 11 pieces: kept; turngym's SearchQA limit of 4: dropped."""
    probs = {(0, "Paris"): [0.1, 0.2, 0.4, 0.3], (1, "Paris"): [0.05 * k for k in range(1, 11)]}
    scorer = FakeSupportScorer(probs)
    short, long = limit_ep(0, 4), limit_ep(1, 10)
    res = get_reward("igpo", scorer=scorer).score_group([short, long])
    assert res.rewards[0] == [0.0, 0.0, 0.0, -2.0]  # 5 pieces ≤ 10: gains dropped, the penalty alone
    assert res.rewards[1] == pytest.approx([0.05] * 9 + [-2.0])  # 11 pieces: gains kept, the appended 0 + F1
    assert res.diagnostics["gains_dropped"] == [True, False]
    assert len(scorer.calls) == 1  # the dropped rollout is not scored at all
    keep = get_reward("igpo", scorer=FakeSupportScorer(probs), turn_limit_gains="keep").score_group([short])
    assert keep.rewards[0] == pytest.approx([0.1, 0.2, -0.1, -2.0])
    answered = make_ep(2, "Paris", ["a"])  # an answered rollout is never cut by this rule
    answered.truncated = True
    assert get_reward("igpo", scorer=FakeSupportScorer({(2, "Paris"): [0.2, 0.5]})).score_group(
        [answered]).rewards[0] == pytest.approx([0.3, 1.0])


def test_igpo_f1_uses_the_first_gold_answer_as_the_repository_trains():
    """GuoqingWang1/IGPO ``scrl/llm_agent/generation.py`` lines 275-277 cut each ``reward_model`` dict's
    ``ground_truth`` to its first answer in place; ``ray_trainer.py`` line 1149 passes those very dicts, so the
    reward manager's ``compute_f1`` (``info_gain.py`` lines 73, 103) then sees the first gold answer only."""
    ep = make_ep(0, "City of Light", [])
    ep.task["answers"] = ["Paris", "City of Light"]
    assert get_reward("igpo").score_group([ep]).rewards == [[0.0]]  # F1 against "Paris" alone
    assert get_reward("igpo", f1_golds="all").score_group([ep]).rewards == [[1.0]]


def test_igpo_format_check_reads_the_executed_forced_first_search():
    """IGPO's check (``info_gain.py`` lines 7-41, −2 at line 80) reads the transcript. A forced first search
    (SearchQA ``force_first_search``, native format) that the env accepted and ran without ``</tool_call>`` is
    a closed call as executed (vLLM's Hermes parser reads ``<tool_call>(.*)``): no penalty. A call the env
    rejected, or an open call the model wrote itself, is still unbalanced: −2."""
    from turngym.envs.search_qa import FIRST_SEARCH_PREFILL
    from turngym.rewards.siop import igpo_transcript

    prefill = FIRST_SEARCH_PREFILL["native"]

    def forced(i, parse_error=None, prefilled=True):
        ep = make_ep(i, "Paris", ["<tool_response>Paris is in France</tool_response>"])
        ep.turns[0].action = prefill + 'capital of France"}}'
        ep.turns[0].prefill = prefill if prefilled else None
        if parse_error:
            ep.turns[0].parse_error, ep.turns[0].tool_calls = parse_error, []
        return ep

    reward = get_reward("igpo")
    assert igpo_transcript(forced(0)).startswith(prefill + 'capital of France"}}</tool_call>')
    assert reward.outcome(forced(0), ["Paris"]) == 1.0
    assert reward.outcome(forced(1, parse_error="bad call"), ["Paris"]) == -2.0
    assert reward.outcome(forced(2, prefilled=False), ["Paris"]) == -2.0


def test_igpo_f1_and_format_check():
    from turngym.rewards.siop import igpo_f1, igpo_tags_balanced

    assert igpo_f1("Paris, France", ["paris"]) == pytest.approx(2 / 3)
    assert igpo_f1("new york new york", ["New York City", "NYC"]) == pytest.approx(2 * 1 * (2 / 3) / (1 + 2 / 3))
    assert igpo_f1("", ["x"]) == 0.0
    assert igpo_tags_balanced("<think>a</think><answer>b</answer>")
    assert not igpo_tags_balanced("<answer>b")
    assert not igpo_tags_balanced("</think>a<think>")


def test_igpo_format_check_and_answer_read_the_lower_cased_response():
    """GuoqingWang1/IGPO at bff163b72718a8b8f9175ce019ec7114ad6bd59a: ``verl/utils/reward_score/info_gain.py``
    line 71 lower-cases the response before the tag check (line 75) and the answer search (line 84), so
    ``</THINK>`` closes ``<think>`` and ``<ANSWER>`` is an answer."""
    probs = {(0, "Paris"): [0.5], (1, "Paris"): [0.5]}
    g = [make_ep(0, "Paris", [], final_action="<think>so</THINK><answer>Paris</answer>"),
         make_ep(1, None, [], final_action="<ANSWER>Paris</ANSWER>")]
    res = get_reward("igpo", scorer=FakeSupportScorer(probs)).score_group(g)
    assert res.rewards == [[1.0], [1.0]]  # case-sensitive, both would get -2
    # the env found no answer in episode 1 ("env": the env's answer decides): the penalty
    assert get_reward("igpo", scorer=FakeSupportScorer(probs), f1_answer="env").score_group(g).rewards == [[1.0], [-2.0]]


def test_igpo_f1_reads_the_first_answer_tag():
    """info_gain.py line 84: ``re.search(r'<answer>(.*?)</answer>', ...)``, the first answer; turngym's env
    records the last one as the final answer (``f1_answer="env"``)."""
    ep = make_ep(0, "Paris", [], final_action="<answer>Lyon</answer> no, <answer>Paris</answer>")
    scorer = FakeSupportScorer({(0, "Paris"): [0.5]})
    assert get_reward("igpo", scorer=scorer).score_group([ep]).rewards == [[0.0]]
    assert get_reward("igpo", scorer=scorer, f1_answer="env").score_group([ep]).rewards == [[1.0]]
    with pytest.raises(ValueError, match="f1_answer"):
        get_reward("igpo", f1_answer="last")


def test_igpo_transcript_keeps_the_tool_response_of_the_turn_limit():
    """``scrl/llm_agent/generation.py`` lines 481-501: a rollout still calling tools at the last step gets its tool
    message appended, then the whole conversation is rendered as its response, so the format check and the
    answer search read that tool response. The env records it as ``Turn.unshown_observation``."""
    import gymnasium

    from turngym.rewards.siop import igpo_transcript

    env = gymnasium.make("turngym/Calculator-v0", max_turns=1).unwrapped
    env.reset(options={"index": 0})
    _, _, terminated, truncated, _ = env.step("<calc>2*3</calc>")
    ep = env.episode
    assert truncated and not terminated and ep.turns[-1].observation is None
    assert ep.turns[-1].unshown_observation == "\n<result>6</result>\n"
    assert igpo_transcript(ep) == "<calc>2*3</calc>\n<result>6</result>\n"
    # a turn-limit rollout whose last tool response holds an answer tag: IGPO reads it as the answer
    cut = make_ep(0, None, ["doc"], final_action="<search>more</search>")
    cut.turns[-1].tool_calls = [{"name": "search", "arguments": {"query": "more"}}]
    cut.truncated = True
    cut.turns[-1].unshown_observation = "<information>the page says <answer>Paris</answer></information>"
    res = get_reward("igpo", scorer=FakeSupportScorer({})).score_group([cut])
    assert res.rewards == [[0.0, 1.0]] and res.diagnostics["gains_dropped"] == [True]
    cut.turns[-1].unshown_observation = None
    assert get_reward("igpo", scorer=FakeSupportScorer({})).score_group([cut]).rewards == [[0.0, -2.0]]


def test_surface_variants_land_in_one_cluster():
    answers = ["The Eiffel Tower.", "eiffel tower", "Eiffel  Tower!", "an eiffel tower", "Louvre", None]
    cl = cluster_answers("What?", answers, NormalizedMatch())
    assert cl.labels == [0, 0, 0, 0, 1, None]
    aliases = NormalizedMatch(aliases=[["NYC", "New York City"]])
    assert cluster_answers("q", ["NYC", "New York City", "Boston"], aliases).labels == [0, 0, 1]
    assert cluster_answers("q", ["\\frac{1}{2}", "0.5", "1/3"], MathEquivalence()).labels == [0, 0, 1]


class FakeNLI:
    """A fake NLI model that records what it is shown and entails only identical normalised texts."""

    def __init__(self):
        self.seen = []

    def entails(self, pairs):
        self.seen.extend(pairs)
        return [p.lower().strip(" .") == h.lower().strip(" .") for p, h in pairs]


def test_long_prompts_do_not_collapse_clusters():
    long_prompt = "context " * 5000
    g = [make_ep(i, a, ["x"]) for i, a in enumerate(["Paris", "London", "Rome"])]
    for e in g:
        e.prompt = [{"role": "user", "content": long_prompt}]
    nli = FakeNLI()
    res = get_reward("ttrl", equivalence=NLIEquivalence(nli), vote_on="equivalence").score_group(g)
    assert res.diagnostics["clusters"]["labels"] == [0, 1, 2]
    assert nli.seen and all(len(p) < 200 and len(h) < 200 for p, h in nli.seen)
    assert get_reward("empo").score_group(g).diagnostics["clusters"]["labels"] == [0, 1, 2]


def test_real_nli_model_bidirectional_entailment(tiny_nli_dir):
    import torch

    from turngym.rewards.nli import NLIModel

    nli = NLIModel.load(str(tiny_nli_dir), device="cpu")
    answers = ["Paris", "paris city", "London"]
    with torch.no_grad():  # make entailment the arg-max everywhere: one cluster
        nli.model.classifier.bias.copy_(torch.tensor([0.0, 0.0, 50.0]))
    assert cluster_answers("q", answers, NLIEquivalence(nli)).labels == [0, 0, 0]
    with torch.no_grad():  # contradiction everywhere: every distinct answer alone
        nli.model.classifier.bias.copy_(torch.tensor([50.0, 0.0, 0.0]))
    assert cluster_answers("q", answers, NLIEquivalence(nli)).labels == [0, 1, 2]
    assert all(0 <= p <= 1 for p in nli.entailment([("a", "b"), ("c", "d")]))


def test_bad_configuration_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown reward"):
        get_reward("nope")
    with pytest.raises(ValueError, match="bad configuration"):
        get_reward("siop", etaa=1)
    with pytest.raises(ValueError, match="lam"):
        get_reward("siop", lam=2)
    with pytest.raises(ValueError, match="one query"):
        get_reward("ttrl").score_group([make_ep(0, "a", [], question="q1"), make_ep(1, "b", [], question="q2")])
    with pytest.raises(ValueError, match="support scorer"):
        get_reward("siop").score_group(group())


def test_real_nli_evidence_scores(tiny_nli_dir):
    from turngym.rewards.evidence import AnswerInEvidence, NLIEvidence, cluster_evidence
    from turngym.rewards.nli import NLIModel

    ev = NLIEvidence(NLIModel.load(str(tiny_nli_dir), device="cpu"))
    scores = ev.scores("Where?", "Paris", ["Paris is in France", "London"])
    assert len(scores) == 2 and all(0 <= s <= 1 for s in scores)
    members = [make_ep(0, "Paris", ["the city of Paris", "x"]), make_ep(1, "Paris", [])]
    assert cluster_evidence(AnswerInEvidence(), "Where?", "Paris", members) == 0.5


def test_igpo_siop_preset_is_the_siop_repositorys_gold_reference_baseline():
    """dl-m9/SIOP, IGPO mode (``siop_use_gold_ref``, ``verl/utils/siop/siop_process_reward.py`` lines 326-352):
    the first gold answer is every rollout's only reference with q = 1, answered or not; τ_0 = the prompt,
    τ_t = prompt + response up to the end of assistant turn t (lines 388-403); r_t = log(p_t + ε) −
    log(p_{t−1} + ε), the last turn + (1 − λ) (lines 512-526); one turn: (1 − λ) (lines 383-386); no F1 in
    training (``siop_reward.py`` lines 186-214 place only these). Then that repository's ``igpo`` estimator
    (``core_algos.py`` lines 2540-2632) on the group, by hand."""
    eps, lam = 1e-8, 0.5
    probs = {(0, "Paris"): [0.2, 0.4, 0.5], (1, "Paris"): [0.1, 0.1, 0.3, 0.2]}
    g = [make_ep(0, "Paris", ["a"]), make_ep(1, None, ["b", "c"]), make_ep(2, "Lyon", [])]
    g[0].task["answers"] = ["Paris", "City of Light"]
    scorer = FakeSupportScorer(probs)
    reward = get_reward("igpo_siop", scorer=scorer)
    res = reward.score_group(g)
    lg = lambda p: math.log(p + eps)  # noqa: E731
    want = [[lg(0.4) - lg(0.2), lg(0.5) - lg(0.4) + (1 - lam)],
            [0.0, lg(0.3) - lg(0.1), lg(0.2) - lg(0.3) + (1 - lam)],
            [1 - lam]]
    for got, w in zip(res.rewards, want, strict=True):
        assert got == pytest.approx(w, abs=1e-12)
    assert scorer.calls[0][0] == [[1000], [1000, 1], [1000, 1, 2, 3, 4]]  # before each observation, τ_T too
    # the SIOP repository's igpo estimator: F1 slots and the non-zero gains normalised apart
    from turngym.training.advantages import get_estimator

    assert (type(reward).estimator, type(reward).official_estimator) == ("turn_loo", "igpo_siop")
    f1s = [want[0][1], want[1][2], want[2][0]]
    igs = [want[0][0], want[1][1]]  # ep1's first gain is exactly 0: no boundary
    fm, gm = sum(f1s) / 3, sum(igs) / 2
    fs = math.sqrt(sum((x - fm) ** 2 for x in f1s) / 3 + 1e-8) + 1e-6
    gs = math.sqrt(sum((x - gm) ** 2 for x in igs) / 2 + 1e-8) + 1e-6
    adv = get_estimator("igpo_siop")(res.rewards)
    a1_last = (f1s[1] - fm) / fs
    a1_mid = (igs[1] - gm) / gs + a1_last
    assert adv[0] == pytest.approx([(igs[0] - gm) / gs + (f1s[0] - fm) / fs, (f1s[0] - fm) / fs])
    assert adv[1] == pytest.approx([a1_mid, a1_mid, a1_last])
    assert adv[2] == pytest.approx([(f1s[2] - fm) / fs])


def test_env_reward_is_what_env_step_returned():
    from turngym.envs.digits import DigitsEnv
    from turngym.rewards import get_reward

    env = DigitsEnv(max_turns=2)
    env.reset(seed=0, options={"index": 0})
    rewards = [env.step("12ab")[1], env.step("x9")[1]]
    scores = get_reward("env").score_group([env.episode])
    assert scores.rewards == [rewards] == [[0.5, 0.5]]
    assert get_reward("env").estimator == "turn_loo"


def test_igpos_first_answer_is_the_regexs_span_read_linearly():
    """``info_gain.py`` line 84 reads the first ``<answer>(.*?)</answer>`` of the lower-cased response; two finds give
    the same span on any text (the regex backtracks quadratically over unclosed tags: 22 s at 200 KB)."""
    import random
    import re as regex

    from turngym.rewards.siop import igpo_first_answer

    official = regex.compile(r"<answer>(.*?)</answer>", regex.DOTALL)
    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choice(["<answer>", "</answer>", "<ANSWER>", "</Answer>", "a", " x\n"])
                       for _ in range(rng.randint(0, 14)))
        m = official.search(text.lower())
        assert igpo_first_answer(text) == (m.group(1).strip() if m else None), text
    assert igpo_first_answer("<answer>" * 25_000) is None
