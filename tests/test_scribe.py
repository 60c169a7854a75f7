"""SCRIBE: strict-JSON LLM calls, decomposition, library, routing, judging, the reward, diagnostics.

Deterministic tests use ``FakeRulePolicy``, a fake LLM backend whose replies are computed
from the prompt; the embedder and clusterer are the real ones (all-MiniLM-L6-v2, hdbscan).
"""

from __future__ import annotations

import json
import re
import threading
import time

import numpy as np
import pytest

from turngym.agents.policy import Generation
from turngym.episode import Episode, Turn
from turngym.rewards import get_reward
from turngym.rewards.scribe.cluster import cluster_skills
from turngym.rewards.scribe.diagnostics import cross_instance_consistency, repeat_consistency
from turngym.rewards.scribe.embed import SentenceEmbedder
from turngym.rewards.scribe.library import SkillItem, SkillLibrary, SkillPrototype, build_library
from turngym.rewards.scribe.llm import JSONLLM, parse_json_reply, validate
from turngym.rewards.scribe.prompts import DECOMPOSE_SCHEMA, JUDGE_SCHEMA
from turngym.rewards.scribe.steps import EmbeddingRouter, LLMRouter, decompose, judge_items


class FakeRulePolicy:
    """A fake LLM backend for unit tests: ``rule(prompt, n)`` gives the reply text."""

    tokenizer = None
    max_context = None

    def __init__(self, rule, name="fake-rule"):
        self.rule, self.name = rule, name
        self.prompts: list[str] = []
        self.batches: list[int] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    def generate(self, requests, sampling):
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.batches.append(len(requests))
        time.sleep(0.01)
        out = []
        for r in requests:
            prompt = r.messages[-1]["content"]
            with self._lock:
                self.prompts.append(prompt)
                n = len(self.prompts)
            out.append(Generation(text=self.rule(prompt, n, sampling)))
        with self._lock:
            self.in_flight -= 1
        return out


FAMILIES = {
    "bound": ["state the integer bound after solving a strict inequality", "round a strict inequality to an integer bound",
              "convert c < 44.75 into the largest integer value", "turn a fractional inequality limit into an integer limit",
              "find the greatest integer satisfying a strict inequality", "state the integer boundary of a solution interval"],
    "search": ["search the web for the birthplace of a person", "look up where a famous person was born with a search",
               "query a search engine for a person's place of birth", "retrieve the home town of an actor by searching",
               "issue a search for the city a singer was born in", "use search to find the birth city of a writer"],
    "code": ["write python code to compute a sum and print it", "run a python snippet that adds numbers and prints",
             "compute an arithmetic total by executing python code", "use the interpreter to calculate and print a result",
             "execute python to evaluate a numeric expression", "print the value of a calculation with python"],
}


def planted_items() -> tuple[list[SkillItem], list[str]]:
    items, labels = [], []
    for fam, texts in FAMILIES.items():
        for k, t in enumerate(texts):
            items.append(SkillItem(subgoal=f"{fam} step {k}", skill=t, first_turn=0, last_turn=0, episode_id=f"{fam}{k}"))
            labels.append(fam)
    return items, labels


def scripted_rule(prompt: str, n: int, sampling) -> str:
    """Decompose: one step per turn; distil: a rubric named after the examples; judge: 3 unless a 'mistake'."""
    if prompt.startswith("Split this agent trajectory"):
        turns = sorted({int(x) for x in re.findall(r"\[turn (\d+)\] agent", prompt)})
        steps = [{"subgoal": f"do turn {t}", "skill": "search the web for the birthplace of a person" if t == 0
                  else "state the integer bound after solving a strict inequality", "first_turn": t, "last_turn": t}
                 for t in turns]
        steps.append({"subgoal": "out of range", "skill": "x", "first_turn": 7, "last_turn": 99})
        return "Here you go:\n```json\n" + json.dumps({"steps": steps}) + "\n```"
    if prompt.startswith("These steps"):
        name = "search" if "search" in prompt else "integer bound" if "integer" in prompt else "code"
        return json.dumps({"name": name, "when_to_use": f"when a step needs {name}",
                           "checklist": ["state the final condition explicitly", "use the tool correctly"],
                           "pitfalls": [{"mistake": "boundary leak", "score": 2}]})
    if prompt.startswith("Grade one step"):
        score = 1 if "WRONG STEP" in prompt else 3
        return f"{{'score': '{score}', 'violated': ['use the tool correctly', 'not on the list'],}}"
    if prompt.startswith("Which skill rubric"):
        return '{"prototype": "none"}' if "nothing fits" in prompt else '{"prototype": "p0"}'
    return "no idea"


def episode(eid: str, actions: list[str], correct: bool = True) -> Episode:
    turns = [Turn(index=i, action=a, observation=f"obs {i}") for i, a in enumerate(actions)]
    return Episode(id=eid, env_id="turngym/SearchQA-v0", task={"question": "Where was X born, and the bound?"},
                   turns=turns, outcome={"em": float(correct)}, group="g")


@pytest.fixture(scope="module")
def embedder():
    return SentenceEmbedder("default")


# ------------------------------------------------------------------ strict JSON


def test_replies_are_repaired_validated_or_refused():
    schema = JUDGE_SCHEMA
    assert parse_json_reply('{"score": 2, "violated": []}', schema) == ({"score": 2, "violated": []}, None, False)
    v, err, repaired = parse_json_reply("Sure!\n```json\n{\"score\": \"3\", \"violated\": \"a\",}\n```", schema)
    assert err is None and v == {"score": 3, "violated": ["a"]} and repaired
    v, err, _ = parse_json_reply("{'score': 1, 'violated': ['x'], 'extra': None}", schema)
    assert err is None and v["score"] == 1
    assert parse_json_reply('{"score": 5, "violated": []}', schema)[1] == "$.score must be one of [0, 1, 2, 3], got 5"
    assert parse_json_reply("no json here", schema)[0] is None
    assert validate({"steps": [{"subgoal": "a", "skill": "b", "first_turn": -1, "last_turn": 0}]}, DECOMPOSE_SCHEMA)


def test_invalid_reply_is_reasked_once_then_counted_as_failed():
    policy = FakeRulePolicy(lambda p, n, s: '{"score": 2, "violated": []}' if "previous reply was not valid" in p else "??")
    llm = JSONLLM(policy)
    assert llm.call("grade", JUDGE_SCHEMA) == {"score": 2, "violated": []}
    assert llm.stats.reasked == 1 and llm.stats.failed == 0
    never = JSONLLM(FakeRulePolicy(lambda p, n, s: "still not json"))
    assert never.call("grade", JUDGE_SCHEMA) is None
    assert never.stats.failed == 1 and never.stats.generated == 2


def test_identical_calls_hit_the_cache_and_the_cache_file_survives_a_restart(tmp_path):
    policy = FakeRulePolicy(lambda p, n, s: '{"score": 3, "violated": []}')
    cache = tmp_path / "llm_cache.jsonl"
    llm = JSONLLM(policy, cache_path=cache)
    out = llm.call_many([("a", JUDGE_SCHEMA), ("a", JUDGE_SCHEMA), ("b", JUDGE_SCHEMA)])
    assert out[0] == out[1] == out[2] and len(policy.prompts) == 2
    llm.call("a", JUDGE_SCHEMA)
    assert llm.stats.to_dict()["cache_hit_rate"] == pytest.approx(2 / 4)
    with open(cache, "a") as fh:
        fh.write('{"key": "torn')  # a killed writer's last line
    fresh_policy = FakeRulePolicy(lambda p, n, s: "unused")
    fresh = JSONLLM(fresh_policy, cache_path=cache)
    assert fresh.call("b", JUDGE_SCHEMA) == {"score": 3, "violated": []} and fresh_policy.prompts == []


def test_concurrency_limit_bounds_prompts_in_flight():
    policy = FakeRulePolicy(lambda p, n, s: '{"score": 3, "violated": []}')
    llm = JSONLLM(policy, max_concurrency=3, use_cache=False)
    threads = [threading.Thread(target=llm.call_many, args=([(f"q{t}-{i}", JUDGE_SCHEMA) for i in range(7)],))
               for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(policy.batches) <= 3 and sum(policy.batches) == 28


# ------------------------------------------------------------------ decomposition, library, routing, judging


def test_decomposition_ties_items_to_turns_and_drops_impossible_ranges():
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    ep = episode("e1", ["<search>X birthplace</search>", "<answer>c <= 44</answer>"])
    [d] = decompose([ep], llm)
    assert [(i.first_turn, i.last_turn) for i in d.items] == [(0, 0), (1, 1)]
    assert d.dropped == 1 and not d.failed
    assert "[turn 1] agent: <answer>c <= 44</answer>" in d.items[1].span
    [failed] = decompose([ep], JSONLLM(FakeRulePolicy(lambda p, n, s: "nope"), reask=False))
    assert failed.failed and failed.items == []


def test_clustering_recovers_planted_skill_groups(embedder):
    from sklearn.metrics import adjusted_rand_score

    items, labels = planted_items()
    clusters = cluster_skills(embedder.embed([it.text for it in items]), min_cluster_size=3)
    kept = [(lab, c) for lab, c in zip(labels, clusters.labels) if c >= 0]
    assert len(kept) >= 0.8 * len(labels)
    assert adjusted_rand_score([k[0] for k in kept], [k[1] for k in kept]) >= 0.8
    assert len(clusters.groups) == 3


def test_kmeans_takes_over_when_hdbscan_finds_only_noise():
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(60, 16))
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    clusters = cluster_skills(vecs, min_cluster_size=25, max_noise=0.2)
    assert clusters.method == "kmeans" and clusters.noise_fraction == 0 and clusters.params["k"] >= 2


def test_library_builds_routes_and_round_trips_through_json(tmp_path, embedder):
    items, _ = planted_items()
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    lib, timings = build_library(items, embedder, llm, min_cluster_size=3)
    assert len(lib.prototypes) == 3 and lib.clustering["method"] == "hdbscan" and set(timings) >= {"embed_s"}
    assert {p.name for p in lib.prototypes} == {"search", "integer bound", "code"}
    path = lib.save(tmp_path / "lib.json")
    again = SkillLibrary.load(path)
    assert again.to_dict() == lib.to_dict()
    router = EmbeddingRouter(embedder)
    probe = [SkillItem("find where she was born", "search for the birthplace of a novelist", 0, 0),
             SkillItem("bake", "knead sourdough and proof it overnight", 0, 0)]
    routes = router.route(probe, again)
    assert again.by_id(routes[0]).name == "search" and routes[1] is None
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a SCRIBE skill library"):
        SkillLibrary.load(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError, match="build one"):
        SkillLibrary.load(tmp_path / "missing.json")


def test_llm_router_and_judge_keep_to_the_schema():
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    proto = SkillPrototype("p0", "search", "when searching", ["use the tool correctly", "state the final condition explicitly"],
                           [{"mistake": "boundary leak", "score": 2}])
    lib = SkillLibrary([proto])
    items = [SkillItem("find it", "search", 0, 0), SkillItem("nothing fits", "baking", 0, 0)]
    assert LLMRouter(llm).route(items, lib) == ["p0", None]
    ep = episode("e", ["WRONG STEP here"])
    [j] = judge_items([(ep, SkillItem("s", "k", 0, 0, span="WRONG STEP here"), proto)], llm)
    assert j.score == 1 and j.violated == ["use the tool correctly"] and j.unknown_violations == 1


# ------------------------------------------------------------------ the reward


def test_scribe_reward_aggregates_per_turn_as_documented(tmp_path, embedder):
    items, _ = planted_items()
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    lib, _ = build_library(items, embedder, llm, min_cluster_size=3)
    reward = get_reward("scribe", llm=llm, library=lib, embedder=embedder, outcome_weight=0.25)
    good = episode("e1", ["<search>X birthplace</search>", "<answer>c <= 44</answer>"], correct=True)
    bad = episode("e2", ["<search>X birthplace</search>", "WRONG STEP here", "<answer>45</answer>"], correct=False)
    scores = reward.score_group([good, bad])
    # good: both turns judged 3 -> p = 1; bad: turn 1 judged 1 (a WRONG STEP) -> 1/3
    assert scores.rewards[0] == pytest.approx([0.75, 0.75 + 0.25])
    assert scores.rewards[1] == pytest.approx([0.75, 0.75 / 3, 0.75])
    d = scores.diagnostics
    assert d["judge_calls"] == 5 and d["unjudged_turns"] == [[], []] and d["library_version"] == 1
    assert d["items"][1][1]["score"] == 1 and d["items"][1][1]["violated"] == ["use the tool correctly"]
    before = llm.stats.generated
    reward.score_group([good, bad])  # identical calls: all from the cache
    assert llm.stats.generated == before and reward.score_episode(good) == scores.rewards[0]


def test_scribe_bootstraps_and_refreshes_the_library_every_n_steps(tmp_path, embedder):
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    path = tmp_path / "lib.json"
    reward = get_reward("scribe", llm=llm, embedder=embedder, bootstrap_items=4, refresh_every=3,
                        library_path=str(path), min_cluster_size=2, outcome_weight=0.0)
    eps = [episode(f"e{i}", ["<search>X</search>", "<answer>c <= 44</answer>"]) for i in range(3)]
    first = reward.score_group(eps[:1])
    assert reward.library is None and first.rewards == [[0.0, 0.0]]  # 2 items buffered, below bootstrap
    reward.score_group(eps[1:])
    assert reward.library is not None and reward.library.version == 1 and path.is_file()
    reward.observe(2)
    assert reward.library.version == 1
    reward.observe(3)
    assert reward.library.version == 2 and SkillLibrary.load(path).version == 2
    assert [r["version"] for r in reward.refreshes] == [1, 2]


def test_scribe_config_errors_are_clear():
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    with pytest.raises(ValueError, match="outcome_weight"):
        get_reward("scribe", llm=llm, outcome_weight=2.0)
    with pytest.raises(ValueError, match="router"):
        get_reward("scribe", llm=llm, router="magic")
    with pytest.raises(ValueError, match="bad configuration"):
        get_reward("scribe", llm=llm, nonsense=1)


# ------------------------------------------------------------------ diagnostics


def test_repeat_and_cross_instance_consistency():
    proto = SkillPrototype("p0", "bound", "when bounding", ["state the final condition explicitly"], [])
    eps = [episode(f"e{i}", ["a mistake" if i % 2 else "fine"]) for i in range(4)]
    jobs = [(e, SkillItem("s", "k", 0, 0, span=e.turns[0].action), proto) for e in eps]

    steady = JSONLLM(FakeRulePolicy(lambda p, n, s: '{"score": 2, "violated": ["state the final condition explicitly"]}'))
    r = repeat_consistency(jobs, steady, n=4)
    assert r["exact_agreement"] == 1.0 and r["mean_score_range"] == 0 and r["llm"]["cache_hits"] == 0
    flaky = JSONLLM(FakeRulePolicy(lambda p, n, s: json.dumps({"score": n % 3, "violated": []})))
    assert repeat_consistency(jobs, flaky, n=3)["exact_agreement"] == 0.0

    verdicts = judge_items(jobs, JSONLLM(FakeRulePolicy(
        lambda p, n, s: json.dumps({"score": 1 if "a mistake" in p else 2, "violated": ["state the final condition explicitly"]}))))
    c = cross_instance_consistency(jobs, verdicts)
    assert c["groups"] == 1 and c["exact_agreement"] == 0.0 and c["mean_score_range"] == 1


# ------------------------------------------------------------------ toolcall_dense (formerly funrl)


def test_toolcall_dense_scores_format_execution_and_the_bfcl_checker():
    from turngym.envs.bfcl.env import BFCLEnv

    env = BFCLEnv(category="multi_turn_base")
    env.reset(options={"index": 0})
    env.step("[cd(folder='document'), mkdir(dir_name='temp'), mv(source='final_report.pdf', destination='temp')]")
    env.step("[cd(folder='nowhere_at_all')]")
    env.step("All done.")   # closes user turn 0
    env.step("[ls(")        # malformed: closes user turn 1 unanswered
    ep = env.unwrapped.episode if hasattr(env, "unwrapped") else env.episode
    r = get_reward("toolcall_dense").score_episode(ep)
    comps = get_reward("toolcall_dense").score_group([ep]).diagnostics["components"][0]
    assert comps[0] == {"well_formed": 1.0, "executed": 1.0} and r[0] == 1.0
    assert comps[1]["executed"] == 0.0 and r[1] == 0.5
    assert comps[2] == {"well_formed": 1.0, "checker": 1.0}
    assert comps[3]["well_formed"] == 0.0 and comps[3]["checker"] == 0.0 and r[3] == 0.0
    math_ep = Episode(id="m", env_id="turngym/MathCode-v0", turns=[
        Turn(index=0, action="```python\n1/0\n```", tool_calls=[{"name": "python"}], metrics={"exec_ok": False}),
        Turn(index=1, action="\\boxed{2}")], outcome={"correct": True})
    assert get_reward("toolcall_dense").score_episode(math_ep) == [0.5, 1.0]


# ------------------------------------------------------------------ the real default model


@pytest.mark.slow
def test_whole_chain_with_the_real_default_model(tmp_path, embedder):
    """Gemma 3 270M (base) drives every LLM role; whatever it writes, the chain completes and accounts for it."""
    reward = get_reward("scribe", llm="default", embedder=embedder, bootstrap_items=1, min_cluster_size=2)
    eps = [episode(f"e{i}", ["<search>X birthplace</search>", f"<answer>Paris {i}</answer>"], correct=i == 0)
           for i in range(3)]
    scores = reward.score_group(eps)
    stats = reward.llm.stats
    assert stats.generated >= 3 and stats.calls >= 3
    # base model + JSON openings: decomposition, distillation and judging all ran on real output
    assert reward.library is not None and reward.library.prototypes
    assert scores.diagnostics["judge_calls"] >= 1
    judged = [i for items in scores.diagnostics["items"] for i in items if i["score"] is not None]
    assert judged and all(0 <= i["score"] <= 3 for i in judged)
    assert all(np.isfinite(x) for r in scores.rewards for x in r)
    assert all(len(r) == 2 for r in scores.rewards)
    print("default-model chain:", json.dumps(stats.to_dict()), "library:",
          None if reward.library is None else len(reward.library.prototypes))


# ------------------------------------------------------------------ commands, over a served model


def _serve(rule):
    from conftest import FakeJSONServer

    def reply(path, body, n):
        return 200, {"choices": [{"message": {"content": rule(body["messages"][-1]["content"], n, None)},
                                  "finish_reason": "stop"}]}

    return FakeJSONServer(reply)


def _write_episodes(path, n_groups=3):
    from turngym.episode import EpisodeWriter

    with EpisodeWriter(path) as w:
        for g in range(n_groups):
            for k in range(2):
                ep = episode(f"g{g}#{k}", ["<search>X birthplace</search>", "WRONG STEP here" if k else "c <= 44"],
                             correct=k == 0)
                ep.group = f"g{g}"
                ep.turns[0].metrics["retrieval_hit"] = True
                ep.turns[1].metrics["retrieval_hit"] = k == 0
                w.write(ep)


def test_build_library_and_diagnose_commands_against_a_served_model(tmp_path):
    from turngym.cli import main

    server = _serve(scripted_rule)
    try:
        eps = tmp_path / "eps.jsonl"
        _write_episodes(eps)
        lib = tmp_path / "lib.json"
        assert main(["scribe", "build-library", str(eps), "--llm", "m", "--base-url", server.url, "--out", str(lib),
                     "--min-cluster-size", "2"]) == 0
        assert SkillLibrary.load(lib).prototypes
        out = tmp_path / "diag.json"
        assert main(["scribe", "diagnose", str(eps), "--llm", "m", "--base-url", server.url, "--library", str(lib),
                     "--repeats", "3", "--out", str(out)]) == 0
        diag = json.loads(out.read_text())
        assert diag["repeat"]["exact_agreement"] == 1.0 and diag["judged_spans"] == 12
    finally:
        server.close()


def test_build_library_reports_when_the_model_gives_no_json(tmp_path, capsys):
    from turngym.cli import main

    server = _serve(lambda p, n, s: "I am not JSON")
    try:
        eps = tmp_path / "eps.jsonl"
        _write_episodes(eps, 1)
        with pytest.raises(SystemExit, match="2 of 2 decompositions failed"):
            main(["scribe", "build-library", str(eps), "--llm", "m", "--base-url", server.url,
                  "--out", str(tmp_path / "lib.json")])
        assert not (tmp_path / "lib.json").exists()
    finally:
        server.close()


def test_ablate_includes_scribe_with_its_llm_costs(tmp_path):
    from turngym.evals.ablate import run_ablation

    server = _serve(scripted_rule)
    try:
        eps = tmp_path / "eps.jsonl"
        _write_episodes(eps)
        summary = run_ablation(eps, ["outcome", "scribe", "funrl"], tmp_path / "abl", scribe_llm="m",
                               scribe_base_url=server.url)
        assert not summary["errors"], summary["errors"]
        s = summary["rewards"]["scribe"]
        assert s["library"]["prototypes"] >= 1 and s["llm"]["calls"] > 0
        assert s["credit_accuracy"] is not None and s["credit_accuracy"] > 0.5  # WRONG STEP turns get low credit
        assert "scribe" in (tmp_path / "abl" / "ablation.md").read_text()
    finally:
        server.close()


def test_identical_descriptions_form_one_group_instead_of_failing():
    vecs = np.tile(np.eye(8)[0], (30, 1))
    clusters = cluster_skills(vecs, min_cluster_size=3)
    assert clusters.method == "single" and clusters.labels == [0] * 30
    two = np.vstack([np.tile(np.eye(8)[0], (20, 1)), np.tile(np.eye(8)[1], (20, 1))])
    assert len(cluster_skills(two, min_cluster_size=30).groups) == 1  # only two distinct points: no K-means


def test_local_model_scores_are_constrained_to_the_scale(tiny_chat_policy):
    """A tiny random local model cannot write JSON, but its score is picked among 0-3 by log-probability."""
    from turngym.rewards.scribe.constrain import option_logprobs

    llm = JSONLLM(tiny_chat_policy, max_new_tokens=8)
    proto = SkillPrototype("p0", "bound", "when bounding", ["state the final condition explicitly"], [])
    jobs = [(episode(f"e{i}", [f"step {i}"]), SkillItem("s", "k", 0, 0, span=f"step {i}"), proto) for i in range(3)]
    verdicts = judge_items(jobs, llm)
    assert all(v.score in (0, 1, 2, 3) for v in verdicts) and llm.stats.failed == 0
    # the choice is the argmax of the model's own log-probabilities over the options
    lp = option_logprobs(tiny_chat_policy, "Grade: {\"score\": ", ["0", "1", "2", "3"], add_special_tokens=False)
    assert len(lp) == 4 and all(np.isfinite(lp)) and len(set(lp)) > 1
    routes = LLMRouter(llm).route([SkillItem("s", "k", 0, 0)], SkillLibrary([proto]))
    assert routes[0] in ("p0", None)


def test_served_judges_can_be_asked_for_structured_output():
    from turngym.agents.openai_compat import OpenAICompatPolicy

    server = _serve(scripted_rule)
    try:
        llm = JSONLLM(OpenAICompatPolicy(model="m", base_url=server.url), guided_json=True)
        proto = SkillPrototype("p0", "bound", "when bounding", ["use the tool correctly"], [])
        [v] = judge_items([(episode("e", ["x"]), SkillItem("s", "k", 0, 0, span="x"), proto)], llm)
        assert v.score == 3
        body = server.requests[0][1]
        assert body["response_format"]["json_schema"]["schema"] == JUDGE_SCHEMA
    finally:
        server.close()
