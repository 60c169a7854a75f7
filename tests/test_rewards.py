"""Reward wrappers on hand-computed groups, with a fake support scorer (named as such) beside
tests of the real transformers scorer."""

import math
from dataclasses import dataclass

import pytest

from turngym.episode import Episode, Turn
from turngym.rewards import get_reward
from turngym.rewards.equivalence import MathEquivalence, NLIEquivalence, NormalizedMatch, cluster_answers


class FakeCharTokenizer:
    """A fake tokenizer: one id per character."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


@dataclass
class FakeSupportScorer:
    """A fake scorer: p(ref | point) looked up from a table keyed by (episode, reference, point)."""

    probs: dict
    tokenizer = FakeCharTokenizer()

    def mean_logprobs(self, points, cue, references):
        ep = points[0][0] - 1000
        log = lambda p: math.log(p) if p > 0 else (-math.inf if p == 0 else p)  # noqa: E731
        return [[log(self.probs[(ep, "".join(map(chr, r)))][i]) for r in references] for i in range(len(points))]


def make_ep(i, answer, observations, question="Where is the Eiffel Tower?", gold="Paris"):
    turns = [Turn(index=j, action="<search>q</search>", observation=o, action_ids=[1], observation_ids=[2, 3])
             for j, o in enumerate(observations)]
    turns.append(Turn(index=len(observations), action=f"<answer>{answer}</answer>", action_ids=[4]))
    return Episode(id=f"e{i}", env_id="turngym/SearchQA-v0", task={"question": question, "answers": [gold]},
                   prompt=[{"role": "user", "content": question}], prompt_ids=[1000 + i], turns=turns,
                   final_answer=answer, outcome={"em": float(answer is not None and answer.lower() == gold.lower())})


def group():
    return [make_ep(0, "Paris", ["Paris is in France"]),
            make_ep(1, "paris", ["no idea", "The tower is in Paris."]),
            make_ep(2, "London", ["London bridge"]),
            make_ep(3, None, ["nothing"])]


PROBS = {(0, "Paris"): [0.1, 0.6], (0, "paris"): [0.05, 0.3],
         (1, "Paris"): [0.1, 0.2, 0.7], (1, "paris"): [0.05, 0.1, 0.5],
         (2, "London"): [0.2, 0.4]}


def test_outcome_ttrl_empo_hand_computed():
    g = group()
    assert get_reward("outcome").score_group(g).rewards == [[0, 1.0], [0, 0, 1.0], [0, 0.0], [0, 0.0]]
    assert get_reward("outcome", metric="em").score_group(g).rewards[1] == [0, 0, 1.0]
    assert get_reward("ttrl").score_group(g).rewards == [[0, 1.0], [0, 0, 1.0], [0, 0.0], [0, 0.0]]
    empo = get_reward("empo").score_group(g)  # EMPO's code: p(c) = |c| / K over all K rollouts
    assert empo.rewards == [[0, 2 / 4], [0, 0, 2 / 4], [0, 1 / 4], [0, 0.0]]
    assert get_reward("empo", share_of="answered").score_group(g).rewards == [[0, 2 / 3], [0, 0, 2 / 3], [0, 1 / 3], [0, 0.0]]
    assert empo.diagnostics["clusters"]["labels"] == [0, 0, 1, None]


def test_siop_hand_computed():
    lam, eta, eps = 0.5, 1.0, 1e-8
    res = get_reward("siop", scorer=FakeSupportScorer(PROBS), lam=lam, eta=eta, eps=eps).score_group(group())
    d = res.diagnostics
    # m counts answered rollouts only; r: answer-in-evidence, mean over members of their mean
    assert d["m"] == pytest.approx([2 / 3, 1 / 3])
    assert d["r"] == pytest.approx([(1.0 + 0.5) / 2, 1.0])
    z = 2 / 3 * math.exp(0.75) + 1 / 3 * math.exp(1.0)
    q0, q1 = 2 / 3 * math.exp(0.75) / z, 1 / 3 * math.exp(1.0) / z
    assert d["q"] == pytest.approx([q0, q1])
    assert d["references"] == [["Paris", "paris"], ["London"]]
    sup0 = [0.5 * 0.1 + 0.5 * 0.05, 0.5 * 0.6 + 0.5 * 0.3]
    sup1 = [0.5 * 0.1 + 0.5 * 0.05, 0.5 * 0.2 + 0.5 * 0.1, 0.5 * 0.7 + 0.5 * 0.5]
    phi = lambda q, p: q * math.log(p + eps)  # noqa: E731
    assert res.rewards[0] == pytest.approx([phi(q0, sup0[1]) - phi(q0, sup0[0]), (1 - lam) * q0])
    assert res.rewards[1] == pytest.approx([phi(q0, sup1[1]) - phi(q0, sup1[0]),
                                            phi(q0, sup1[2]) - phi(q0, sup1[1]), (1 - lam) * q0])
    assert res.rewards[2] == pytest.approx([phi(q1, 0.4) - phi(q1, 0.2), (1 - lam) * q1])
    assert res.rewards[3] == [0.0, 0.0]  # unanswered: q = 0, zero rewards


def test_siop_process_rewards_telescope():
    res = get_reward("siop", scorer=FakeSupportScorer(PROBS)).score_group(group())
    for rewards, phi in zip(res.rewards, res.diagnostics["potentials"]):
        if phi is None:
            continue
        assert sum(rewards[:-1]) == pytest.approx(phi[-1] - phi[0])


def test_single_cluster_gets_q_one_and_single_turn_gets_only_the_final_term():
    eps = [make_ep(0, "Paris", ["Paris"]), make_ep(1, "PARIS!", ["x"])]
    one_turn = make_ep(2, "paris", [])
    res = get_reward("siop", scorer=FakeSupportScorer(PROBS | {(1, "Paris"): [0.1, 0.2]}), lam=0.3,
                     n_ref=1).score_group(eps + [one_turn])
    assert res.diagnostics["q"] == [1.0]
    assert res.rewards[2] == [pytest.approx(0.7)]


def test_siop_equals_igpo_when_q_concentrates_on_gold_and_gold_is_the_reference():
    probs = {(i, "Paris"): [0.1 + 0.1 * i, 0.3 + 0.05 * i, 0.9] for i in range(3)}
    probs[(3, "London")] = probs[(3, "Paris")] = [0.2, 0.2, 0.2]
    g = [make_ep(i, "Paris", ["Paris here", "more Paris"]) for i in range(3)] + [make_ep(3, "London", ["x", "y"])]
    scorer = FakeSupportScorer(probs)
    siop = get_reward("siop", scorer=scorer, eta=60.0, n_ref=1).score_group(g)
    igpo = get_reward("igpo", scorer=scorer).score_group(g)
    assert siop.diagnostics["q"][0] == pytest.approx(1.0, abs=1e-9)
    for i in range(3):
        assert siop.rewards[i] == pytest.approx(igpo.rewards[i], abs=1e-6)
    assert igpo.rewards[3][-1] == 0.0  # IGPO's final term is the gold outcome


def test_nan_and_inf_rewards_become_zero():
    probs = {(0, "Paris"): [0.0, float("nan")], (1, "London"): [1.0, float("inf")]}
    g = [make_ep(0, "Paris", ["a"]), make_ep(1, "London", ["b"])]
    res = get_reward("siop", scorer=FakeSupportScorer(probs), eps=0.0).score_group(g)
    assert all(math.isfinite(x) for r in res.rewards for x in r)


def test_surface_variants_land_in_one_cluster():
    answers = ["The Eiffel Tower.", "eiffel tower", "Eiffel  Tower!", "an eiffel tower", "Louvre", None]
    cl = cluster_answers("What?", answers, NormalizedMatch())
    assert cl.labels == [0, 0, 0, 0, 1, None]
    assert cluster_answers("q", ["NYC", "New York City", "Boston"], NormalizedMatch(aliases=[["NYC", "New York City"]])).labels == [0, 0, 1]
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


def test_igpo_hand_computed():
    probs = {(0, "Paris"): [0.2, 0.5], (1, "Paris"): [0.1, 0.05, 0.4]}
    g = [make_ep(0, "Paris", ["a"]), make_ep(1, "Lyon", ["b", "c"])]
    res = get_reward("igpo", scorer=FakeSupportScorer(probs), lam=0.4, eps=0.0).score_group(g)
    assert res.rewards[0] == pytest.approx([math.log(0.5) - math.log(0.2), 0.6 * 1.0])
    assert res.rewards[1] == pytest.approx([math.log(0.05) - math.log(0.1), math.log(0.4) - math.log(0.05), 0.0])


def test_real_nli_evidence_scores(tiny_nli_dir):
    from turngym.rewards.evidence import AnswerInEvidence, NLIEvidence, cluster_evidence
    from turngym.rewards.nli import NLIModel

    ev = NLIEvidence(NLIModel.load(str(tiny_nli_dir), device="cpu"))
    scores = ev.scores("Where?", "Paris", ["Paris is in France", "London"])
    assert len(scores) == 2 and all(0 <= s <= 1 for s in scores)
    members = [make_ep(0, "Paris", ["the city of Paris", "x"]), make_ep(1, "Paris", [])]
    assert cluster_evidence(AnswerInEvidence(), "Where?", "Paris", members) == 0.5
