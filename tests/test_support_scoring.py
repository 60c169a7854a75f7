"""The real support scorers: the tree-mask transformers scorer equals one full forward per
(point, reference); SIOP and IGPO run end to end on rollouts from a real (tiny) model and
equal a hand computation from that model's own log-probs; a scorer whose tokenizer differs
from the episode's is refused; the vLLM-shaped server path is checked against a fake server."""

import math

import pytest

from conftest import FakeJSONServer
from turn_rewards import EpisodeRewardEnv
from turngym.agents.policy import SamplingParams
from turngym.agents.runner import RolloutRunner
from turngym.envs.calculator import CalculatorEnv
from turngym.rewards import get_reward
from turngym.rewards.support import (
    HFSupportScorer,
    MemoSupportScorer,
    OpenAISupportScorer,
    PseudoAnswer,
    continuation,
    end_of_turn_text,
    make_scorer,
    scoring_points,
)


@pytest.fixture(scope="module")
def episodes(tiny_chat_policy):
    runner = RolloutRunner(tiny_chat_policy, lambda: CalculatorEnv(max_turns=4), SamplingParams(max_new_tokens=10, seed=0), k=4)
    return runner.run([0])


def calculator_group(plays, question, gold):
    """One group of Calculator episodes on an ad-hoc task: per episode a (calculation, answer) pair."""
    import copy

    group = []
    for k, (calc, answer) in enumerate(plays):
        env = CalculatorEnv(max_turns=3)
        env.reset(seed=k, options={"task": {"question": question, "answers": [gold]}})
        env.step(f"<calc>{calc}</calc>")
        env.step(f"<answer>{answer}</answer>")
        group.append(copy.deepcopy(env.episode))
    return group


def tiny_gemma3(tok, softcap=None):
    """A random two-layer Gemma-3-style model: a sliding-window layer (window 8) and a full one."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"], max_position_embeddings=512,
                           pad_token_id=tok.pad_token_id, final_logit_softcapping=softcap)
    return Gemma3ForCausalLM(cfg).eval()


def conts_for(tok, refs):
    return [continuation(tok, PseudoAnswer(), r, end_of_turn_text(tok)) for r in refs]


def test_tree_scoring_equals_naive_forwards(tiny_chat_policy, episodes):
    tok = tiny_chat_policy.tokenizer
    ep = max(episodes, key=lambda e: len(e.turns))
    points = scoring_points(ep, tok)
    assert len(points) == len(ep.turns) + 1 and all(b[: len(a)] == a for a, b in zip(points, points[1:], strict=False))
    conts = conts_for(tok, ["413", "12", "forty"])
    tree = HFSupportScorer(tiny_chat_policy.model, tok)
    naive = HFSupportScorer(tiny_chat_policy.model, tok, method="naive")
    a, b = tree.mean_logprobs(points, conts), naive.mean_logprobs(points, conts)
    for ra, rb in zip(a, b, strict=True):
        assert ra == pytest.approx(rb, abs=1e-4)
    assert all(x < 0 for row in a for x in row)
    assert tree.stats["forwards"] == 2 and tree.stats["tokens"] < naive.stats["tokens"]


def test_scoring_points_follow_the_episode_ids(tiny_chat_policy, episodes):
    ep = max(episodes, key=lambda e: len(e.turns))
    before = scoring_points(ep, tiny_chat_policy.tokenizer, "before_observation")
    after = scoring_points(ep, tiny_chat_policy.tokenizer, "after_observation")
    t0, last = ep.turns[0], ep.turns[-1]
    assert before[0] == after[0] == ep.prompt_ids
    assert before[1] == ep.prompt_ids + t0.action_ids
    assert after[1] == ep.prompt_ids + t0.action_ids + t0.observation_ids
    assert before[-1] == after[-1] and before[-1][-len(last.action_ids):] == last.action_ids
    with pytest.raises(ValueError, match="prefix"):
        scoring_points(ep, tiny_chat_policy.tokenizer, "sideways")


def test_reference_tokens_found_by_offsets_in_the_one_string_tokenisation(tiny_chat_policy):
    tok = tiny_chat_policy.tokenizer
    [c] = conts_for(tok, ["forty two"])
    text = "\nNow there's enough information to answer\n</think>\n<answer>\nforty two\n</answer><|im_end|>"
    assert list(c.ids) == tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(list(c.ids[c.start:c.end])).strip() == "forty two"


def test_siop_and_igpo_equal_a_hand_computation_from_the_real_model(tiny_chat_policy, episodes):
    import torch

    model, tok = tiny_chat_policy.model, tiny_chat_policy.tokenizer
    for e, ans in zip(episodes, ["413", "413", "12", None], strict=True):  # give the group answers to cluster
        e.final_answer = ans
    multi = [e for e in episodes if len(e.turns) > 1]
    assert multi, "need a multi-turn episode"
    scorer = HFSupportScorer(model, tok)
    lam, eps = 0.5, 1e-8
    siop = get_reward("siop", scorer=scorer, lam=lam, eps=eps).score_group(episodes)
    igpo = get_reward("igpo", scorer=scorer, final_turn_gain=True, turn_limit_gains="keep").score_group(episodes)
    igpo_default = get_reward("igpo", scorer=scorer).score_group(episodes)

    def p_ref(prefix_ids, ref):  # exp(mean log p(ref tokens)), computed here with a plain forward
        text_ids = tok("\nNow there's enough information to answer\n</think>\n<answer>\n" + ref + "\n</answer><|im_end|>",
                       add_special_tokens=False, return_offsets_mapping=True)
        a = len("\nNow there's enough information to answer\n</think>\n<answer>\n")
        span = [i for i, (s, e) in enumerate(text_ids["offset_mapping"]) if e > a and s < a + len(ref)]
        seq = list(prefix_ids) + text_ids["input_ids"][: span[-1] + 1]
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0].float(), -1)
        n = len(prefix_ids)
        vals = [lp[n + i - 1, text_ids["input_ids"][i]].item() for i in span]
        return math.exp(sum(vals) / len(vals))

    d = siop.diagnostics
    for i, e in enumerate(episodes):
        T = len(e.turns)
        if e.final_answer is None:
            assert siop.rewards[i] == [0.0] * T
            continue
        q = d["q"][d["clusters"]["labels"][i]]
        refs = d["references"][d["clusters"]["labels"][i]]
        if T == 1:
            assert siop.rewards[i] == pytest.approx([(1 - lam) * q])
            continue
        # τ_t ends with assistant turn t (before its observation); τ_T ends with the final turn
        ids, pts = list(e.prompt_ids), [list(e.prompt_ids)]
        for t in e.turns:
            ids += t.action_ids
            pts.append(list(ids))
            ids += t.observation_ids or []
        sup = [sum(p_ref(pt, r) for r in refs) / len(refs) for pt in pts]
        phi = [q * math.log(s + eps) for s in sup]
        want = [phi[t + 1] - phi[t] for t in range(T)]
        want[-1] += (1 - lam) * q
        assert siop.rewards[i] == pytest.approx(want, abs=1e-4)
    e = max(episodes, key=lambda x: len(x.turns))  # IGPO: after the observation, probability gain, F1
    gold = e.task["answers"][0]
    ids, pts = list(e.prompt_ids), [list(e.prompt_ids)]
    for t in e.turns[:-1]:
        ids += t.action_ids + (t.observation_ids or [])
        pts.append(list(ids))
    pts.append(list(ids) + e.turns[-1].action_ids)
    p = [p_ref(pt, gold) for pt in pts]
    i = episodes.index(e)
    want = [p[t + 1] - p[t] for t in range(len(e.turns))]
    want[-1] += igpo.diagnostics["outcome"][i]
    assert igpo.rewards[i] == pytest.approx(want, abs=1e-5)
    # defaults (the IGPO repository): the answer turn gets the F1 alone; a short turn-limit rollout no gains
    o = igpo_default.diagnostics["outcome"][i]
    dropped = igpo_default.diagnostics["gains_dropped"][i]
    assert dropped == (e.truncated and e.final_answer is None and len(e.turns) + 1 <= 10 and bool(e.turns[-1].tool_calls))
    want_default = [0.0] * (len(e.turns) - 1) + [o] if dropped else want[:-1] + [o]
    assert igpo_default.rewards[i] == pytest.approx(want_default, abs=1e-5)


def test_a_scorer_with_another_tokenizer_is_refused_and_text_mode_retokenises(episodes):
    from turngym.agents.loading import load_hf_policy
    from turngym.agents.tiny import tiny_model_dir

    other = load_hf_policy(str(tiny_model_dir(chat=True, vocab_size=400)), dtype="float32", device="cpu")
    g = list(episodes)
    for e, ans in zip(g, ["413", "413", "12", None], strict=True):
        e.final_answer = ans
    scorer = HFSupportScorer(other.model, other.tokenizer)
    with pytest.raises(ValueError, match="tokenizer differs"):
        get_reward("siop", scorer=scorer).score_group(g)
    res = get_reward("siop", scorer=scorer, tokens="text").score_group(g)
    assert all(math.isfinite(x) for r in res.rewards for x in r)
    multi = next(e for e in g if len(e.turns) > 1 and e.final_answer)
    pts = scoring_points(multi, other.tokenizer, tokens="text")
    text = other.tokenizer.apply_chat_template(multi.prompt, add_generation_prompt=True, tokenize=False)
    assert pts[0] == other.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(pts) == len(multi.turns) + 1 and pts[1][len(pts[0]):] == other.tokenizer(
        multi.turns[0].action, add_special_tokens=False)["input_ids"]
    unrecorded = list(g)
    saved = [e.meta.pop("tokenizer") for e in unrecorded]
    try:
        with pytest.raises(ValueError, match="does not record which tokenizer"):
            get_reward("siop", scorer=scorer).score_group(unrecorded)
    finally:
        for e, fp in zip(unrecorded, saved, strict=True):
            e.meta["tokenizer"] = fp


def test_outcome_reward_as_a_gymnasium_wrapper():
    env = EpisodeRewardEnv(CalculatorEnv(), get_reward("outcome"))
    _, info = env.reset(options={"index": 0})
    _, r1, *_ = env.step("<calc>1+1</calc>")
    gold = env.unwrapped.episode.task["answers"][0]  # info carries no gold answers
    _, r2, term, _, _ = env.step(f"<answer>{gold}</answer>")
    assert (r1, r2, term) == (0.0, 1.0, True)
    with pytest.raises(TypeError, match="groups only"):
        EpisodeRewardEnv(CalculatorEnv(), get_reward("ttrl"))


def FakeVLLMServer():
    """A fake vLLM answering prompt_logprobs with log p(token) = -token_id / 100 (real loopback HTTP)."""

    def reply(path, body, n):
        return 200, {"choices": [{"index": i, "text": "",
                                  "prompt_logprobs": [None] + [{str(t): {"logprob": -t / 100}} for t in p[1:]]}
                                 for i, p in enumerate(body["prompt"])]}

    return FakeJSONServer(reply)


def test_openai_prompt_logprobs_scorer_reads_the_reference_span():
    from turngym.rewards.support import Continuation

    server = FakeVLLMServer()
    try:
        scorer = OpenAISupportScorer(model="m", base_url=server.url, tokenizer=None)
        conts = [Continuation((7, 10, 20, 99), 1, 3), Continuation((7, 30), 1, 2)]
        table = scorer.mean_logprobs([[1, 2], [1, 2, 3]], conts)
        assert table == [[pytest.approx(-0.15), pytest.approx(-0.30)], [pytest.approx(-0.15), pytest.approx(-0.30)]]
        [(_, body)] = server.requests
        assert body["prompt"] == [[1, 2, 7, 10, 20], [1, 2, 7, 30], [1, 2, 3, 7, 10, 20], [1, 2, 3, 7, 30]]
        assert body["prompt_logprobs"] == 0
    finally:
        server.close()


def test_siop_through_a_server_scorer_spec_equals_the_local_scorer_on_the_fake(tiny_chat_policy, episodes):
    """A ``{base_url, model, tokenizer}`` scorer spec builds the server scorer; against the fake
    server its rewards equal the local scorer's given the same fake log-probs."""
    from turngym.agents.tiny import tiny_model_dir

    server = FakeVLLMServer()
    try:
        spec = {"base_url": server.url, "model": "served", "tokenizer": str(tiny_model_dir(chat=True))}
        scorer = make_scorer(spec)
        assert isinstance(scorer, OpenAISupportScorer)
        for e, ans in zip(episodes, ["413", "413", "12", None], strict=True):
            e.final_answer = ans
        res = get_reward("siop", scorer=spec).score_group(episodes)
        assert all(math.isfinite(x) for r in res.rewards for x in r)
        [c] = conts_for(scorer.tokenizer, ["413"])
        lp = sum(-t / 100 for t in c.ids[c.start:c.end]) / (c.end - c.start)
        e = next(i for i, x in enumerate(episodes) if len(x.turns) > 1 and x.final_answer == "413")
        # the fake's log-probs do not depend on the prefix: every ΔΦ is 0, the final turn keeps (1 − λ)q
        assert res.diagnostics["support"][e][0] == pytest.approx(math.exp(lp))
        assert res.rewards[e][:-1] == pytest.approx([0.0] * (len(episodes[e].turns) - 1))
    finally:
        server.close()
    with pytest.raises(ValueError, match="policy"):
        make_scorer("policy")
    with pytest.raises(ValueError, match="scorer mapping"):
        make_scorer({"base_url": "http://x"})


@pytest.mark.parametrize("pseudo", [PseudoAnswer(), PseudoAnswer(prefix="", suffix="", end_of_turn=False)])
def test_tree_scoring_reads_the_continuations_common_opening_once_and_equals_naive(tiny_chat_policy, episodes, pseudo):
    """The continuations' common first ids are one segment per point: with the official pseudo-answer (a long
    common opening), with none (references only; one reference the start of another), the scores equal plain
    forwards, and the branch forward reads the opening once per point, not once per reference."""
    tok = tiny_chat_policy.tokenizer
    ep = max(episodes, key=lambda e: len(e.turns))
    points = scoring_points(ep, tok)
    conts = [continuation(tok, pseudo, r, end_of_turn_text(tok)) for r in ["Paris", "Paris city", "Lyon"]]
    tree = HFSupportScorer(tiny_chat_policy.model, tok)
    naive = HFSupportScorer(tiny_chat_policy.model, tok, method="naive")
    for ra, rb in zip(tree.mean_logprobs(points, conts), naive.mean_logprobs(points, conts), strict=True):
        assert ra == pytest.approx(rb, abs=1e-5)
    inputs = [c.ids[:c.end - 1] for c in conts]
    shared = next(i for i in range(min(map(len, inputs)) + 1)
                  if i == min(map(len, inputs)) or len({ids[i] for ids in inputs}) > 1)
    branch = tree.stats["tokens"] - len(points[-1])
    assert branch == len(points) * (shared + sum(len(ids) - shared for ids in inputs))
    assert (shared > 5) == (pseudo.prefix != "")


def test_tree_scoring_with_sliding_window_layers_equals_naive(tiny_chat_policy):
    """Gemma-3-style models (sliding-window layers): the windowed tree mask equals plain forwards."""
    tok = tiny_chat_policy.tokenizer
    model = tiny_gemma3(tok, softcap=3.0)  # the tree path applies the head's soft-capping as the model's forward does
    ids = tok("What is 12 * 34 + 5? <calc>12 * 34</calc> <result>408</result> then add five",
              add_special_tokens=False)["input_ids"]
    points = [ids[:6], ids[:15], ids]  # later points run past the sliding window
    conts = conts_for(tok, ["413", "forty"])
    tree = HFSupportScorer(model, tok).mean_logprobs(points, conts)
    naive = HFSupportScorer(model, tok, method="naive").mean_logprobs(points, conts)
    for a, b in zip(tree, naive, strict=True):
        assert a == pytest.approx(b, abs=1e-4)


def test_ablate_scorer_spec_local_model_and_server(tiny_chat_policy, episodes, tmp_path):
    import json

    from turngym.agents.tiny import tiny_model_dir
    from turngym.credit.ablate import run_ablation
    from turngym.episode import EpisodeWriter

    for e, ans in zip(episodes, ["413", "413", "12", None], strict=True):
        e.final_answer = ans
    path = tmp_path / "episodes.jsonl"
    writer = EpisodeWriter(path)
    for e in episodes:
        writer.write(e)
    writer.close()
    local = run_ablation(path, ["siop", "igpo"], tmp_path / "a", scorer=json.dumps({"model": str(tiny_model_dir(chat=True))}))
    assert local["errors"] == {} and set(local["rewards"]) == {"siop", "igpo"}
    server = FakeVLLMServer()
    try:
        spec = {"base_url": server.url, "model": "served", "tokenizer": str(tiny_model_dir(chat=True)), "tokens": "text"}
        remote = run_ablation(path, ["siop"], tmp_path / "b", scorer=json.dumps(spec))
        assert remote["errors"] == {} and server.requests
    finally:
        server.close()
    with pytest.raises(ValueError, match="JSON"):
        run_ablation(path, ["siop"], tmp_path / "c", scorer="{not json")


def test_kept_prefixes_give_the_same_scores_with_one_forward_less(tiny_chat_policy):
    """SIOP then IGPO on one shared scorer with ``prefix_cache_tokens``: SIOP's longest prefix (τ_T) runs once per
    episode and IGPO's (τ_{T−1} after its observation, a prefix of it) is cut from it, and both rewards' rewards
    equal those of scorers that keep nothing."""
    tok = tiny_chat_policy.tokenizer
    group = calculator_group([("6*7", "42"), ("6*7", "42"), ("2+2", "4"), ("6*7", "41")], "What is 6 times 7?", "42")
    multi = len(group)  # every episode is answered and has two turns: both rewards score all of them

    def run(keep):
        scorer = HFSupportScorer(tiny_chat_policy.model, tok, prefix_cache_tokens=keep)
        out = [get_reward(n, scorer=scorer, tokens="text").score_group(group).rewards for n in ("siop", "igpo")]
        return out, scorer.stats

    (siop_a, igpo_a), plain = run(0)
    (siop_b, igpo_b), kept = run(100_000)
    for a, b in ((siop_a, siop_b), (igpo_a, igpo_b)):
        for ra, rb in zip(a, b, strict=True):
            assert ra == pytest.approx(rb, abs=1e-5)
    assert kept["prefix_reused"] >= multi and plain["prefix_reused"] == 0
    assert kept["forwards"] <= plain["forwards"] - multi
    small = HFSupportScorer(tiny_chat_policy.model, tok, prefix_cache_tokens=1)  # too small to keep any prefix
    get_reward("siop", scorer=small, tokens="text").score_group(group)
    assert small.stats["prefix_reused"] == 0 and not small._prefixes


def test_a_memo_scorer_scores_each_support_once_and_changes_no_reward(tiny_chat_policy):
    """Two configurations of IGPO and SIOP on one memo: the second pass runs no forward, and every reward
    equals the plain scorer's."""
    tok = tiny_chat_policy.tokenizer
    group = calculator_group([("6*7", "42"), ("2+2", "4"), ("6*7", "41")], "What is 6 times 7?", "42")
    plain = HFSupportScorer(tiny_chat_policy.model, tok)
    memo = MemoSupportScorer(HFSupportScorer(tiny_chat_policy.model, tok))
    for name in ("siop", "igpo"):
        want = get_reward(name, scorer=plain, tokens="text").score_group(group).rewards
        first = get_reward(name, scorer=memo, tokens="text").score_group(group).rewards
        forwards = memo.scorer.stats["forwards"]
        again = get_reward(name, scorer=memo, tokens="text").score_group(group).rewards
        assert memo.scorer.stats["forwards"] == forwards > 0  # the second pass ran no forward
        for a, b, c in zip(want, first, again, strict=True):
            assert a == pytest.approx(b, abs=1e-5) and b == c
    assert memo.tokenizer is tok and memo.memo


def test_lone_surrogates_anywhere_in_a_group_score_with_siop_igpo_and_prm(tiny_chat_policy):
    """Question, gold, query and answers holding lone surrogates (a JSON reply may carry them):
    every support and judge reward scores the group instead of raising TypeError in the tokenizer."""
    group = calculator_group([("6*7", "42\ud800"), ("6*7", "42"), ("2+2 \udc00", "4"), ("6*7", "41")],
                             "What is 6 \ud800 times 7?", "42\udfff")
    scorer = HFSupportScorer(tiny_chat_policy.model, tiny_chat_policy.tokenizer)
    for reward in (get_reward("siop", scorer=scorer, tokens="text"), get_reward("igpo", scorer=scorer, tokens="text"),
                    get_reward("prm", llm=tiny_chat_policy)):
        rewards = reward.score_group(group).rewards
        assert [len(r) for r in rewards] == [2, 2, 2, 2]
        assert all(math.isfinite(x) for r in rewards for x in r)


def test_a_groups_shared_prompt_runs_once_and_the_scores_do_not_change(tiny_chat_policy):
    """Within ``sharing_prompt`` the episodes' common prompt runs once: each later episode's longest prefix runs
    from the kept opening, the scores equal naive forwards (and the tree scorer's without the scope), also where
    the kept hidden states are read (a pseudo-answer with no text before the reference), an episode of another
    question runs on from what it shares, and nothing is kept after the scope."""
    tok, model = tiny_chat_policy.tokenizer, tiny_chat_policy.model
    group = calculator_group([("6*7", "42"), ("6*7", "41"), ("2+2", "4")], "What is 6 times 7?", "42")
    other = calculator_group([("2+2", "4")], "What is 2 plus 2?", "4")
    points = [scoring_points(ep, tok, tokens="text") for ep in group + other]
    prompt = len(points[0][0])
    assert all(p[0] == points[0][0] for p in points[:3]) and points[3][0] != points[0][0]
    common = next(i for i, (a, b) in enumerate(zip(points[0][0], points[3][0], strict=False)) if a != b)
    assert 0 < common < prompt
    conts = conts_for(tok, ["42", "forty-two"])
    bare = [continuation(tok, PseudoAnswer(prefix=""), r, end_of_turn_text(tok)) for r in ["42", "forty-two"]]
    assert all(c.start == 0 for c in bare)  # the first reference id is read from the prefix forward's hidden states
    tree, alone = HFSupportScorer(model, tok), HFSupportScorer(model, tok)
    naive = HFSupportScorer(model, tok, method="naive")
    with tree.sharing_prompt():
        shared = [tree.mean_logprobs(p, conts) for p in points[:3]]
        assert tree._opening.ids == tuple(points[0][0])
        shared.append(tree.mean_logprobs(points[3], conts))
        assert tree._opening.ids == tuple(points[0][0])  # the kept prompt stays for the group's later episodes
        with tree.sharing_prompt():  # nested: the outer scope keeps its opening
            pass
        assert tree._opening is not None
    assert tree._opening is None and not tree._sharing
    reader = HFSupportScorer(model, tok)
    with reader.sharing_prompt():
        read = [reader.mean_logprobs(p, bare) for p in points]
    assert reader.stats["prompt_reused"] == 3
    for r, p in zip(read, points, strict=True):
        for a, b in zip(r, naive.mean_logprobs(p, bare), strict=True):
            assert a == pytest.approx(b, abs=1e-4)
    inside = HFSupportScorer(model, tok)
    with inside.sharing_prompt():  # a point that ends inside the kept opening still runs its last id
        inside.mean_logprobs([points[0][-1]], conts)
        short = points[1][-1][: prompt + 2]
        assert tuple(short) == inside._opening.ids[: len(short)]
        assert inside.mean_logprobs([short], conts)[0] == pytest.approx(naive.mean_logprobs([short], conts)[0], abs=1e-4)
    assert inside.stats["prompt_reused"] == 1
    plain = [alone.mean_logprobs(p, conts) for p in points]
    want = [naive.mean_logprobs(p, conts) for p in points]
    for s, a, w in zip(shared, plain, want, strict=True):
        for rs, ra, rw in zip(s, a, w, strict=True):
            assert rs == pytest.approx(ra, abs=1e-5) and rs == pytest.approx(rw, abs=1e-4)
    assert tree.stats["prompt_reused"] == 3 and alone.stats["prompt_reused"] == 0
    assert tree.stats["tokens"] == alone.stats["tokens"] - 2 * prompt - common


def test_a_shared_opening_past_the_sliding_window_equals_naive_and_lives_only_in_its_scope(tiny_chat_policy):
    """Gemma-3-style layers with an opening longer than the window; then the weights change (a training step)
    and a new scope's scores follow them: no keys or values of the old weights are reused."""
    import torch

    tok = tiny_chat_policy.tokenizer
    model = tiny_gemma3(tok)
    opening = tok("What is 12 * 34 + 5? Think step by step.", add_special_tokens=False)["input_ids"]
    tails = [tok(t, add_special_tokens=False)["input_ids"] for t in (" <calc>12 * 34</calc> <result>408</result>",
                                                                       " <calc>12*34+5</calc> <result>413</result>")]
    assert len(opening) > model.config.sliding_window
    episodes = [[opening, opening + tail[:5], opening + tail] for tail in tails]
    conts = conts_for(tok, ["413", "forty"])
    scorer, naive = HFSupportScorer(model, tok), HFSupportScorer(model, tok, method="naive")

    def check() -> None:
        with scorer.sharing_prompt():
            got = [scorer.mean_logprobs(p, conts) for p in episodes]
        for g, p in zip(got, episodes, strict=True):
            for a, b in zip(g, naive.mean_logprobs(p, conts), strict=True):
                assert a == pytest.approx(b, abs=1e-4)

    check()
    reused = scorer.stats["prompt_reused"]
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    check()
    assert scorer.stats["prompt_reused"] == reused + 1 == 2


def test_siop_and_igpo_share_a_groups_prompt_and_a_group_with_nothing_to_score_loads_no_scorer(tiny_chat_policy):
    tok = tiny_chat_policy.tokenizer
    group = calculator_group([("6*7", "42"), ("6*7", "42"), ("2+2", "4"), ("6*7", "41")], "What is 6 times 7?", "42")
    for name in ("siop", "igpo"):
        tree, naive = HFSupportScorer(tiny_chat_policy.model, tok), HFSupportScorer(tiny_chat_policy.model, tok,
                                                                                       method="naive")
        got = get_reward(name, scorer=tree, tokens="text").score_group(group).rewards
        want = get_reward(name, scorer=naive, tokens="text").score_group(group).rewards
        for a, b in zip(got, want, strict=True):
            assert a == pytest.approx(b, abs=1e-4)
        assert tree.stats["prompt_reused"] == len(group) - 1 and tree._opening is None
    single, cut = [], []  # one-turn episodes; two-turn ones cut by the turn limit without an answer
    for k in range(2):
        env = CalculatorEnv(max_turns=3)
        env.reset(seed=k, options={"task": {"question": "What is 6 times 7?", "answers": ["42"]}})
        env.step("<answer>42</answer>")
        single.append(env.episode)
        env = CalculatorEnv(max_turns=2)
        env.reset(seed=k, options={"task": {"question": "What is 6 times 7?", "answers": ["42"]}})
        env.step("<calc>6*7</calc>")
        env.step("<calc>6*8</calc>")
        assert env.episode.truncated and env.episode.final_answer is None
        cut.append(env.episode)
    for name in ("siop", "igpo"):  # a scorer that cannot load: none of these groups has a support to score
        for episodes in (single, cut):  # siop: no answer to cluster; igpo: a turn-limit rollout's gains are dropped
            reward = get_reward(name, scorer={"model": "no/such-model-here"}, tokens="text")
            assert len(reward.score_group(episodes).rewards) == 2 and reward._scorer is None
