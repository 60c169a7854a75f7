"""Reward wrappers on hand-computed groups, with a fake support scorer (named as such) beside
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
    g = group()
    assert get_reward("outcome").score_group(g).rewards == [[0, 1.0], [0, 0, 1.0], [0, 0.0], [0, 0.0]]
    assert get_reward("outcome", metric="em").score_group(g).rewards[1] == [0, 0, 1.0]
    assert get_reward("ttrl").score_group(g).rewards == [[0, 1.0], [0, 0, 1.0], [0, 0.0], [0, 0.0]]
    empo = get_reward("empo").score_group(g)  # EMPO's code: p(c) = |c| / K over all K rollouts
    assert empo.rewards == [[0, 2 / 4], [0, 0, 2 / 4], [0, 1 / 4], [0, 0.0]]
    assert get_reward("empo", share_of="answered").score_group(g).rewards == [[0, 2 / 3], [0, 0, 2 / 3], [0, 1 / 3], [0, 0.0]]
    assert empo.diagnostics["clusters"]["labels"] == [0, 0, 1, None]


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
                      final_reward="outcome", lam=0.5, format_penalty=None).score_group(g)
    assert siop.diagnostics["q"][0] == pytest.approx(1.0, abs=1e-9)
    for i in range(3):
        assert siop.rewards[i] == pytest.approx(igpo.rewards[i], abs=1e-6)
    assert igpo.rewards[3][-1] == pytest.approx(0.0)  # log 0.2 − log 0.2 + (1 − λ)·0 (wrong answer)


def test_nan_and_inf_rewards_become_zero():
    probs = {(0, "Paris"): [0.0, float("nan"), 0.5], (1, "London"): [1.0, float("inf"), 0.3]}
    g = [make_ep(0, "Paris", ["a"]), make_ep(1, "London", ["b"])]
    res = get_reward("siop", scorer=FakeSupportScorer(probs), eps=0.0).score_group(g)
    assert all(math.isfinite(x) for r in res.rewards for x in r)
    assert res.rewards[0] == [0.0, 0.0]  # NaN gains (and a NaN final turn, gain + bonus) become 0
    igpo = get_reward("igpo", scorer=FakeSupportScorer({(0, "Paris"): [0.2, float("nan"), 0.5]})).score_group(g[:1])
    assert igpo.rewards[0] == [0.0, 0.0]


def test_evidence_counts_only_tool_results_cut_to_2000_characters():
    from turngym.rewards.evidence import AnswerInEvidence, cluster_evidence, evidence_texts

    ep = make_ep(0, "Paris", ["Paris is in France", "Paris again", "x" * 2500 + " Paris"])
    ep.turns[1].parse_error = "no <search> or <answer> tag"  # an invalid-action message
    ep.turns[1].tool_calls = []
    texts = evidence_texts(ep)
    assert texts == ["Paris is in France", "x" * 2000]
    assert evidence_texts(ep, "observations", None)[1] == "Paris again"
    err = make_ep(1, "Paris", ["Error: search failed: Paris"])
    err.turns[0].metrics = {"retrieval_error": "down"}
    assert evidence_texts(err) == []
    assert cluster_evidence(AnswerInEvidence(), "q", "Paris", [ep, err]) == 0.5  # err has none: not counted
    assert cluster_evidence(AnswerInEvidence(), "q", "Paris", [ep, err], "observations", None) == pytest.approx(
        (1.0 + 1.0) / 2)


def test_igpo_hand_computed_official_defaults():
    probs = {(0, "Paris"): [0.2, 0.5, 0.7], (1, "Paris"): [0.1, 0.05, 0.4, 0.3],
             (2, "Paris"): [0.3, 0.2, 0.1], (3, "Paris"): [0.3, 0.4, 0.6], (4, "Paris"): [0.5, 0.5, 0.5]}
    g = [make_ep(0, "Paris", ["a"]), make_ep(1, "Lyon", ["b", "c"]), make_ep(2, None, ["d"]),
         make_ep(3, "the Paris", ["e"]), make_ep(4, "Paris", ["f"], final_action="<think>so<answer>Paris</answer>")]
    scorer = FakeSupportScorer(probs)
    res = get_reward("igpo", scorer=scorer).score_group(g)
    # information gain = probability difference; final turn: its gain + IGPO's F1 (weight 1)
    assert res.rewards[0] == pytest.approx([0.5 - 0.2, 0.7 - 0.5 + 1.0])
    assert res.rewards[1] == pytest.approx([0.05 - 0.1, 0.4 - 0.05, 0.3 - 0.4 + 0.0])
    assert res.rewards[2] == pytest.approx([0.2 - 0.3, 0.1 - 0.2 - 2.0])  # no answer: format penalty
    assert res.rewards[3] == pytest.approx([0.4 - 0.3, 0.6 - 0.4 + 2 * 0.5 * 1.0 / 1.5])  # set F1, "the" kept
    assert res.rewards[4] == pytest.approx([0.0, 0.0 - 2.0])  # <think> never closed: format penalty
    # official IGPO scores after the observation
    assert scorer.calls[0][0] == [[1000], [1000, 1, 2, 3], [1000, 1, 2, 3, 4]]
    # one assistant turn: the F1 alone, nothing scored (the fake has no table for episode 5)
    assert get_reward("igpo", scorer=scorer).score_group([make_ep(5, "Paris", [])]).rewards == [[1.0]]


def test_igpo_options_reproduce_the_earlier_variant_and_the_repo_reward_placement():
    probs = {(0, "Paris"): [0.2, 0.5, 0.7], (1, "Paris"): [0.1, 0.05, 0.4, 0.3]}
    g = [make_ep(0, "Paris", ["a"]), make_ep(1, "Lyon", ["b", "c"])]
    res = get_reward("igpo", scorer=FakeSupportScorer(probs), lam=0.4, eps=0.0, gain="log_probability",
                     final_reward="outcome", format_penalty=None).score_group(g)
    assert res.rewards[0] == pytest.approx([math.log(0.5) - math.log(0.2), math.log(0.7) - math.log(0.5) + 0.6 * 1.0])
    assert res.rewards[1] == pytest.approx([math.log(0.05) - math.log(0.1), math.log(0.4) - math.log(0.05),
                                            math.log(0.3) - math.log(0.4)])
    # final_turn_gain=False: the answer turn gets the F1 alone (reward placement of the IGPO repo)
    repo = get_reward("igpo", scorer=FakeSupportScorer(probs), final_turn_gain=False).score_group(g)
    assert repo.rewards[0] == pytest.approx([0.5 - 0.2, 1.0])
    assert repo.rewards[1] == pytest.approx([0.05 - 0.1, 0.4 - 0.05, 0.0])
    with pytest.raises(ValueError, match="gain"):
        get_reward("igpo", gain="log")


def test_igpo_f1_and_format_check():
    from turngym.rewards.siop import igpo_f1, igpo_tags_balanced

    assert igpo_f1("Paris, France", ["paris"]) == pytest.approx(2 / 3)
    assert igpo_f1("new york new york", ["New York City", "NYC"]) == pytest.approx(2 * 1 * (2 / 3) / (1 + 2 / 3))
    assert igpo_f1("", ["x"]) == 0.0
    assert igpo_tags_balanced("<think>a</think><answer>b</answer>")
    assert not igpo_tags_balanced("<answer>b")
    assert not igpo_tags_balanced("</think>a<think>")


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
    res = get_reward("ttrl", equivalence=NLIEquivalence(nli)).score_group(g)
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
