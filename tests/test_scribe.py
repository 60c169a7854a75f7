"""SCRIBE and its baselines: strict-JSON LLM calls, steps inside turns, the two-level library, routing,
judging, the ``scribe``, ``prm`` and composite rewards, reliability, training dynamics, recipes.

Deterministic tests use ``FakeRulePolicy``, a fake LLM backend whose replies are computed from
the prompt, and ``FakeNoisyJudge``, a fake judge with a known noise rate; beside them, the
same paths run on a real local transformers model (a tiny random one; the default Gemma 3
270M in the slow test). The embedder and clusterers are the real ones (all-MiniLM-L6-v2,
hdbscan, scipy).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from turngym.agents.policy import Generation, PolicyBase
from turngym.episode import Episode, Turn
from turngym.rewards import get_reward
from turngym.rewards.scribe.cluster import cluster_skills
from turngym.rewards.scribe.decompose import TokenCounter, decompose, split_turn, windows
from turngym.rewards.scribe.diagnostics import cross_instance_consistency, neighbour_pairs, reliability, repeat_consistency
from turngym.rewards.scribe.dynamics import DynamicsRecorder, normalised_entropy
from turngym.rewards.scribe.embed import SentenceEmbedder
from turngym.rewards.scribe.library import SkillItem, SkillLibrary, SkillPrototype, build_library
from turngym.rewards.scribe.llm import JSONLLM, parse_json_reply, validate
from turngym.rewards.scribe.prompts import DECOMPOSE_SCHEMA, JUDGE_SCHEMA
from turngym.rewards.scribe.scoring import StepRecord
from turngym.rewards.scribe.steps import EmbeddingRouter, LLMRouter, judge_prompts, judge_steps

ROOT = Path(__file__).resolve().parents[1]


class FakeRulePolicy(PolicyBase):
    """A fake LLM backend for unit tests: ``rule(prompt, n, sampling)`` gives the reply text."""

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


# A planted two-level hierarchy: two skill families, two skills each.
SKILLS = {
    ("search", "birth"): ["search the web for the birthplace of a person", "look up where a famous person was born",
                          "query a search engine for a person's place of birth", "search for the city a singer was born in",
                          "find the home town of an actor by searching", "use search to find the birth city of a writer"],
    ("search", "film"): ["search for the release year of a film", "look up when a movie came out",
                         "query a search engine for a film's release date", "find the year a movie premiered by searching",
                         "search for when the film was first shown", "use search to find the release year of a movie"],
    ("code", "sum"): ["write python code to compute a sum and print it", "run a python snippet that adds numbers",
                      "compute an arithmetic total by executing python", "use the interpreter to add a list of numbers",
                      "execute python to sum the values", "print the sum of numbers with python code"],
    ("code", "debug"): ["fix a python traceback error in the code", "debug a failing python snippet",
                        "read the python error message and correct the code", "repair code that raised an exception",
                        "fix the bug that made the python run fail", "correct python code after a NameError"],
}
# what the fake decomposer calls a step tagged [tag] in the agent's text
TAG_SKILL = {"birth": SKILLS["search", "birth"][0], "film": SKILLS["search", "film"][0], "sum": SKILLS["code", "sum"][0],
             "debug": SKILLS["code", "debug"][0], "bake": "knead sourdough and proof it overnight"}


def planted_items() -> tuple[list[SkillItem], list[tuple[str, str]]]:
    items, labels = [], []
    for (fam, skill), texts in SKILLS.items():
        for k, t in enumerate(texts):
            items.append(SkillItem(subgoal=f"{fam} {skill} step {k}", skill=t, episode_id=f"{skill}{k}"))
            labels.append((fam, skill))
    return items, labels


BLOCK = re.compile(r"\[turn (\d+)(?:, characters \d+-\d+ of \d+)?\] agent:\n(.*?)(?=\n\[turn \d+|\n\nReply with JSON)", re.S)
STEP_TEXT = re.compile(r"The step:\n(.*?)(?:\n\nThe environment's reply|\n\nRubric:|\n\nScale:)", re.S)


def fake_steps(prompt: str) -> list[dict]:
    """Fake decomposer: every line starting with "Step" opens a step (else the turn's first line)."""
    steps = []
    for m in BLOCK.finditer(prompt):
        turn, lines = int(m.group(1)), [ln for ln in m.group(2).split("\n") if ln.strip()]
        for line in [ln for ln in lines if ln.startswith("Step")] or lines[:1]:
            tag = re.search(r"\[(\w+)\]", line)
            steps.append({"subgoal": line[:60], "skill": TAG_SKILL.get(tag.group(1) if tag else "", TAG_SKILL["birth"]),
                          "turn": turn, "starts_with": " ".join(line.split()[:8])})
    steps.append({"subgoal": "hallucinated", "skill": "x", "turn": 99, "starts_with": "nowhere"})  # dropped, counted
    return steps


def scripted_rule(prompt: str, n: int, sampling) -> str:
    """Decompose as above; distil a rubric; rubric judge: 1 for a WRONG step, else 3; PRM: 0 / 2; route: first listed."""
    if prompt.startswith("Split the agent's work"):
        return "Here you go:\n```json\n" + json.dumps({"steps": fake_steps(prompt)}) + "\n```"
    if prompt.startswith("These steps"):
        first = re.search(r"- skill: (.*?) \|", prompt).group(1)
        return json.dumps({"name": first, "when_to_use": f"when a step needs to {first}",
                           "checklist": ["state the final condition explicitly", "use the tool correctly"],
                           "pitfalls": [{"mistake": "boundary leak", "score": 2}]})
    if prompt.startswith("Grade one step of an agent's work: is it correct"):
        step = STEP_TEXT.search(prompt).group(1)
        return json.dumps({"score": 0 if "WRONG" in step else 2, "reason": "fake"})
    if prompt.startswith("Grade one step"):
        step = STEP_TEXT.search(prompt).group(1)
        return f"{{'score': '{1 if 'WRONG' in step else 3}', 'violated': ['use the tool correctly', 'not on the list'],}}"
    if prompt.startswith("Which skill rubric"):
        return '{"prototype": "none"}' if "sourdough" in prompt else \
            json.dumps({"prototype": re.search(r"^- (\S+):", prompt, re.M).group(1)})
    return "no idea"


def episode(eid: str, actions: list[str], correct: bool = True, group: str = "g") -> Episode:
    turns = [Turn(index=i, action=a, observation=f"obs {i}") for i, a in enumerate(actions)]
    return Episode(id=eid, env_id="turngym/SearchQA-v0", task={"question": "Where was X born, and the bound?"},
                   turns=turns, outcome={"em": float(correct)}, group=group)


@pytest.fixture(scope="module")
def embedder():
    return SentenceEmbedder("default")


@pytest.fixture(scope="module")
def planted_library(embedder):
    items, _ = planted_items()
    lib, _ = build_library(items, embedder, JSONLLM(FakeRulePolicy(scripted_rule)), min_cluster_size=3)
    return lib


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
    assert validate({"steps": [{"subgoal": "a", "skill": "b", "turn": -1, "starts_with": "x"}]},
                    DECOMPOSE_SCHEMA) == "$.steps[0].turn must be >= 0"


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


# ------------------------------------------------------------------ steps inside turns


def long_reasoning_turn(n: int = 12) -> str:
    body = [f"Step {k} [sum]: add the partial sum number {k} to the running total. " + "x" * 300 for k in range(1, n + 1)]
    return "Let me think about this carefully.\n" + "\n".join(body) + "\nStep 13 [sum]: WRONG, so the answer is \\boxed{7}"


def test_a_long_turn_is_decomposed_into_several_judged_steps_without_losing_its_end(planted_library, embedder):
    policy = FakeRulePolicy(scripted_rule)
    llm = JSONLLM(policy)
    action = long_reasoning_turn()
    assert len(action) > 3 * 1200  # far past the old fixed 1,200-character cut
    ep = episode("long", [action, "<answer>7</answer>"])
    reward = get_reward("scribe", llm=llm, library=planted_library, embedder=embedder, window_tokens=256,
                        outcome_weight=0.0)
    scores = reward.score_group([ep])
    d = scores.diagnostics
    steps = [s for s in d["steps"][0] if s["turn"] == 0]
    assert d["decompose_windows"] >= 4  # ~1,024 characters (256 tokens at 4 characters each) per window
    assert len(steps) == 13 and d["dropped_steps"] == [d["decompose_windows"]]  # each window's hallucinated step
    # the steps tile the turn: nothing lost, the first absorbs the preamble, the last reaches the end
    assert "".join(action[s["start"]:s["end"]] for s in steps) == action
    assert steps[0]["start"] == 0 and steps[-1]["end"] == len(action)
    assert all(a["end"] == b["start"] for a, b in zip(steps, steps[1:], strict=False))
    assert steps[-1]["score"] == 1 and all(s["score"] == 3 for s in steps[:-1])  # the end was judged, and wrong
    assert all(s["prototype"] == planted_library.by_id(steps[0]["prototype"]).id for s in steps)
    assert planted_library.by_id(steps[0]["prototype"]).level == 2  # the skill, not only its family
    assert scores.rewards[0][0] == pytest.approx((12 * 1.0 + 1 / 3) / 13)  # mean of the turn's steps
    judged_end = [p for p in policy.prompts if p.startswith("Grade one step") and "\\boxed{7}" in p]
    assert len(judged_end) == 1
    for w in (p for p in policy.prompts if p.startswith("Split the agent's work")):
        assert len(w) < 1024 + 1100  # every window respects the budget (plus the fixed instructions)


def test_token_budget_windows_with_a_real_tokenizer(tiny_chat_policy):
    counter = TokenCounter(tiny_chat_policy.tokenizer)
    text = "\n".join(f"line {k}: " + "alpha beta gamma " * (k % 7 + 1) for k in range(60)) + "\n" + "z" * 900
    parts = split_turn(text, 3, 64, counter)
    assert len(parts) > 3 and parts[0].start == 0 and parts[-1].end == len(text)
    assert all(a.end == b.start for a, b in zip(parts, parts[1:], strict=False))
    assert all(counter.count(text[p.start:p.end]) <= 64 + 2 for p in parts)  # per-piece counts add up to the budget
    short = episode("s", ["one short turn", "and another"])
    assert [[p.turn for p in w] for w in windows(short, 64, counter)] == [[0, 1]]  # short turns share a window
    assert "omitted" in counter.clip("word " * 400, 20) and counter.clip("tiny", 20) == "tiny"


def test_unlocatable_steps_are_dropped_and_turns_without_steps_are_counted():
    def rule(prompt, n, s):
        if prompt.startswith("Split the agent's work"):
            return json.dumps({"steps": [{"subgoal": "a", "skill": "b", "turn": 0, "starts_with": "not in the text"},
                                         {"subgoal": "c", "skill": "d", "turn": 1, "starts_with": "second   turn"}]})
        return "?"

    [d] = decompose([episode("e", ["first turn", "the second turn\nwith more"])], JSONLLM(FakeRulePolicy(rule)))
    assert d.dropped == 1 and d.unstepped_turns == [0]
    assert [(i.turn, i.start, i.end, i.span) for i in d.items] == [(1, 0, 25, "the second turn\nwith more")]
    [failed] = decompose([episode("e", ["x"])], JSONLLM(FakeRulePolicy(lambda p, n, s: "nope"), reask=False))
    assert failed.failed and failed.items == [] and failed.unstepped_turns == [0]


# ------------------------------------------------------------------ the two-level library and routing


def test_clustering_recovers_planted_skill_groups(embedder):
    from sklearn.metrics import adjusted_rand_score

    items, labels = planted_items()
    clusters = cluster_skills(embedder.embed([it.text for it in items]), min_cluster_size=3)
    kept = [(lab, c) for lab, c in zip(labels, clusters.labels, strict=True) if c >= 0]
    assert len(kept) >= 0.8 * len(labels)
    assert adjusted_rand_score([str(k[0]) for k in kept], [k[1] for k in kept]) >= 0.8
    assert len(clusters.groups) == 4


def test_kmeans_takes_over_when_hdbscan_finds_only_noise():
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(60, 16))
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    clusters = cluster_skills(vecs, min_cluster_size=25, max_noise=0.2)
    assert clusters.method == "kmeans" and clusters.noise_fraction == 0 and clusters.params["k"] >= 2


def test_identical_descriptions_form_one_group_instead_of_failing():
    vecs = np.tile(np.eye(8)[0], (30, 1))
    clusters = cluster_skills(vecs, min_cluster_size=3)
    assert clusters.method == "single" and clusters.labels == [0] * 30
    two = np.vstack([np.tile(np.eye(8)[0], (20, 1)), np.tile(np.eye(8)[1], (20, 1))])
    assert len(cluster_skills(two, min_cluster_size=30).groups) == 1  # only two distinct points: no K-means


def test_library_has_skill_families_and_skills_and_round_trips(tmp_path, planted_library):
    lib = planted_library
    items, labels = planted_items()
    fams, skills = lib.families(), [p for p in lib.prototypes if p.level == 2]
    assert len(fams) == 2 and len(skills) == 4 and lib.clustering["families"] == 2
    for f in fams:
        kids = lib.children(f.id)
        assert len(kids) == 2 and f.size == sum(k.size for k in kids) == 12
        # a family's skills are the planted skills of one planted family
        planted = {labels[[it.skill for it in items].index(k.examples[0])][0] for k in kids}
        assert len(planted) == 1
    path = lib.save(tmp_path / "lib.json")
    again = SkillLibrary.load(path)
    assert again.to_dict() == lib.to_dict()
    flat_v1 = {**lib.to_dict(), "schema_version": 1,
               "prototypes": [{k: v for k, v in p.items() if k not in ("level", "parent")} for p in lib.to_dict()["prototypes"]]}
    assert all(p.level == 1 for p in SkillLibrary.from_dict(flat_v1).prototypes)  # an old flat library still loads
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a SCRIBE skill library"):
        SkillLibrary.load(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError, match="build one"):
        SkillLibrary.load(tmp_path / "missing.json")


def test_hierarchical_routing_picks_the_deepest_match_and_falls_back_to_the_family(planted_library, embedder):
    lib = planted_library
    router = EmbeddingRouter(embedder, family_threshold=0.35, skill_threshold=0.5)
    probe = [SkillItem("find birthplace", "look up where a novelist was born"),
             SkillItem("research", "use a search engine to find out about a topic"),
             SkillItem("bake", "knead sourdough and proof it overnight")]
    deep, shallow, none = router.route(probe, lib)
    assert lib.by_id(deep).level == 2 and "born" in " ".join(lib.by_id(deep).examples + [lib.by_id(deep).name]) + "born"
    assert lib.by_id(deep).parent == shallow  # the birthplace skill of the search family
    assert lib.by_id(shallow).level == 1 and none is None
    # raising the skill threshold sends the deep match to its family too
    assert EmbeddingRouter(embedder, 0.35, 0.99).route(probe[:1], lib) == [shallow]


def test_llm_router_walks_the_two_levels():
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    fam = SkillPrototype("f0", "search", "when searching", ["use the tool correctly"], [])
    kid = SkillPrototype("f0.s0", "search birthplaces", "when looking for a birthplace", ["c"], [], level=2, parent="f0")
    lone = SkillPrototype("f1", "code", "when coding", ["c"], [])
    lib = SkillLibrary([fam, kid, lone])
    routes = LLMRouter(llm).route([SkillItem("find it", "search"), SkillItem("x", "knead sourdough")], lib)
    assert routes == ["f0.s0", None]


def test_judge_keeps_to_the_schema_and_the_checklist():
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    proto = SkillPrototype("p0", "search", "when searching", ["use the tool correctly", "state the final condition explicitly"],
                           [{"mistake": "boundary leak", "score": 2}])
    ep = episode("e", ["WRONG STEP here"])
    [j] = judge_steps([(ep, SkillItem("s", "k", 0, 0, 15, span="WRONG STEP here"), proto)], llm)
    assert j.score == 1 and j.violated == ["use the tool correctly"] and j.unknown_violations == 1
    [(prompt, _)] = judge_prompts([(ep, SkillItem("s", "k", 0, 0, 15, span="WRONG STEP here"), proto)], llm)
    assert "The environment's reply after this step:\nobs 0" in prompt  # the step ends its turn


# ------------------------------------------------------------------ the scribe reward


def test_unmatched_steps_get_the_neutral_value_and_are_counted(planted_library, embedder):
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    ep = episode("e", ["Step 1 [sum]: add the numbers with python\nStep 2 [bake]: knead the dough"], correct=False)
    reward = get_reward("scribe", llm=llm, library=planted_library, embedder=embedder, outcome_weight=0.0)
    s = reward.score_group([ep])
    assert [x["status"] for x in s.diagnostics["steps"][0]] == ["judged", "unmatched"]
    assert s.diagnostics["unmatched_steps"] == 1 and s.diagnostics["judge_calls"] == 1
    assert s.rewards[0] == pytest.approx([(1.0 + 0.5) / 2])  # neutral 0.5, not the minimum 0
    custom = get_reward("scribe", llm=llm, library=planted_library, embedder=embedder, outcome_weight=0.0,
                        unmatched_value=0.2, turn_aggregate="min")
    assert custom.score_group([ep]).rewards[0] == pytest.approx([0.2])


def test_scribe_reward_aggregates_per_turn_as_documented(planted_library, embedder):
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    reward = get_reward("scribe", llm=llm, library=planted_library, embedder=embedder, outcome_weight=0.25)
    good = episode("e1", ["Step 1 [birth]: search X birthplace", "Step 2 [sum]: c <= 44, so 44"], correct=True)
    bad = episode("e2", ["Step 1 [birth]: search X birthplace", "Step 2 [sum]: WRONG STEP here\nStep 3 [sum]: so 45",
                         "<answer>45</answer>"], correct=False)
    scores = reward.score_group([good, bad])
    # good: both turns judged 3 -> p = 1; bad: turn 1 = mean(1/3, 1); turn 2 ("<answer>") its first line, judged 3
    assert scores.rewards[0] == pytest.approx([0.75, 0.75 + 0.25])
    assert scores.rewards[1] == pytest.approx([0.75, 0.75 * (1 / 3 + 1) / 2, 0.75])
    d = scores.diagnostics
    assert d["judge_calls"] == 6 and d["unstepped_turns"] == [[], []] and d["library_version"] == 1
    wrong = d["steps"][1][1]
    assert wrong["score"] == 1 and wrong["violated"] == ["use the tool correctly"] and wrong["turn"] == 1
    assert bad.turns[1].action[wrong["start"]:wrong["end"]].startswith("Step 2 [sum]: WRONG")
    before = llm.stats.generated
    reward.score_group([good, bad])  # identical calls: all from the cache
    assert llm.stats.generated == before and reward.score_episode(good) == scores.rewards[0]


def test_scribe_bootstraps_and_refreshes_the_library_every_n_steps(tmp_path, embedder):
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    path = tmp_path / "lib.json"
    reward = get_reward("scribe", llm=llm, embedder=embedder, bootstrap_items=4, refresh_every=3,
                        library_path=str(path), min_cluster_size=2, outcome_weight=0.0)
    eps = [episode(f"e{i}", ["Step 1 [birth]: search X", "Step 2 [sum]: c <= 44"]) for i in range(3)]
    first = reward.score_group(eps[:1])
    assert reward.library is None and first.rewards == [[0.5, 0.5]]  # below bootstrap: every step unmatched, neutral
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
    with pytest.raises(ValueError, match="turn_aggregate"):
        get_reward("prm", llm=llm, turn_aggregate="median")
    with pytest.raises(ValueError, match="unmatched_value"):
        get_reward("scribe", llm=llm, unmatched_value=-1)
    with pytest.raises(ValueError, match="bad configuration"):
        get_reward("scribe", llm=llm, nonsense=1)


# ------------------------------------------------------------------ prm and composite rewards


def test_prm_judges_the_same_steps_with_open_criteria():
    policy = FakeRulePolicy(scripted_rule)
    prm = get_reward("prm", llm=JSONLLM(policy), outcome_weight=0.0)
    ep = episode("e", ["Step 1 [birth]: search X\nStep 2 [birth]: WRONG guess", "Step 3 [sum]: so 44"])
    s = prm.score_group([ep])
    assert [(x["turn"], x["score"], x["prototype"]) for x in s.diagnostics["steps"][0]] == [
        (0, 2, None), (0, 0, None), (1, 2, None)]
    assert s.rewards[0] == pytest.approx([(2 / 3 + 0) / 2, 2 / 3]) and s.diagnostics["judge_calls"] == 3
    judged = [p for p in policy.prompts if p.startswith("Grade one step")]
    assert judged and not any("Rubric:" in p or "checklist" in p for p in judged)  # no prototype, no rubric


def test_composite_rewards_add_weighted_parts(planted_library, embedder):
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    ep = episode("e", ["Step 1 [birth]: search X", "Step 2 [sum]: WRONG so 45"], correct=True)
    scribe_cfg = {"llm": llm, "library": planted_library, "embedder": embedder, "outcome_weight": 0.0}
    combo = get_reward("scribe+outcome", weights={"scribe": 1.0, "outcome": 0.5}, scribe=scribe_cfg)
    s = combo.score_group([ep])
    scribe_r = get_reward("scribe", **scribe_cfg).score_group([ep]).rewards[0]
    outcome_r = get_reward("outcome").score_group([ep]).rewards[0]
    assert outcome_r == [0.0, 1.0] and scribe_r == pytest.approx([1.0, 1 / 3])
    assert s.rewards[0] == pytest.approx([1.0, 1 / 3 + 0.5])
    assert s.diagnostics["part_rewards"]["outcome"] == [outcome_r] and combo.name == "scribe+outcome"
    funrl = get_reward("scribe+funrl", scribe=scribe_cfg).score_group([ep])  # whatever funrl's definition, it adds
    funrl_r = funrl.diagnostics["part_rewards"]["funrl"][0]
    assert funrl.rewards[0] == pytest.approx([a + b for a, b in zip(scribe_r, funrl_r, strict=True)])
    built = get_reward("composite", parts=[{"reward": get_reward("prm", llm=llm, outcome_weight=0.0), "weight": 2.0},
                                           {"name": "outcome", "weight": 1.0}])
    assert built.score_group([ep]).rewards[0] == pytest.approx([2 * 2 / 3, 2 * 0.0 + 1.0])
    with pytest.raises(ValueError, match="not among its parts"):
        get_reward("scribe+funrl", weights={"egpo": 1.0}, scribe=scribe_cfg)
    with pytest.raises(ValueError, match="unknown reward"):
        get_reward("scribe+nonexistent", scribe=scribe_cfg)
    with pytest.raises(ValueError, match="joins reward names"):
        get_reward("scribe+", scribe=scribe_cfg)


# ------------------------------------------------------------------ reliability


class FakeNoisyJudge(PolicyBase):
    """A fake judge with known noise: with sampling on, each score is the true one (3, or 1 for a
    WRONG step) with probability 1 - p, else uniform over 0-3; greedy calls always give the true one."""

    tokenizer = None
    max_context = None
    name = "fake-noisy-judge"

    def __init__(self, p: float, seed: int = 0):
        self.p, self.rng = p, random.Random(seed)

    def generate(self, requests, sampling):
        out = []
        for r in requests:
            prompt = r.messages[-1]["content"]
            true = 1 if "WRONG" in STEP_TEXT.search(prompt).group(1) else 3
            noisy = sampling.temperature > 0 and self.rng.random() < self.p
            out.append(Generation(text=json.dumps({"score": self.rng.randrange(4) if noisy else true, "violated": []})))
        return out


def noisy_jobs(n: int) -> list:
    proto = SkillPrototype("p0", "bound", "when bounding", ["state the final condition explicitly"], [])
    eps = [episode(f"e{i}", ["WRONG step" if i % 2 else f"fine step {i}"]) for i in range(n)]
    return [(e, SkillItem("s", "k", 0, 0, len(e.turns[0].action), e.id, e.turns[0].action), proto) for e in eps]


def test_repeat_consistency_measures_a_judge_with_known_noise():
    p, n = 0.4, 5
    jobs = noisy_jobs(200)
    noisy = JSONLLM(FakeNoisyJudge(p))
    r = repeat_consistency(judge_prompts(jobs, noisy), noisy, n=n, temperature=0.7)
    same = 1 - p + p / 4   # P(a judgement equals the true score)
    expected_pairwise = same ** 2 + 3 * (p / 4) ** 2
    expected_exact = same ** n + 3 * (p / 4) ** n
    assert r["pairwise_agreement"] == pytest.approx(expected_pairwise, abs=0.05)
    assert r["exact_agreement"] == pytest.approx(expected_exact, abs=0.07)
    assert r["llm"]["cache_hits"] == 0 and r["judged_every_time"] == 200
    steady = JSONLLM(FakeNoisyJudge(0.0))
    s = repeat_consistency(judge_prompts(jobs, steady), steady, n=3)
    assert s["exact_agreement"] == 1.0 and s["mean_score_range"] == 0 and s["mean_score_std"] == 0


def test_cross_instance_pairs_come_from_routing_and_embeddings_not_from_the_judge(embedder):
    proto, other = (SkillPrototype(i, "bound", "w", ["c"], []) for i in ("p0", "p1"))
    texts = ["Since c < 44.75 and c is an integer, the largest value is c = 44.",
             "Since c < 44.75 and c must be an integer, the largest value is 44.",
             "Since c < 44.75 and c is an integer, the largest value is c = 44.",
             "Now search for the birthplace of the author of the novel."]
    eps = [episode(f"e{i}", [t]) for i, t in enumerate(texts)]
    jobs = [(eps[0], SkillItem("s", "k", span=texts[0]), proto), (eps[1], SkillItem("s", "k", span=texts[1]), proto),
            (eps[2], SkillItem("s", "k", span=texts[2]), other), (eps[3], SkillItem("s", "k", span=texts[3]), proto)]
    pairs = neighbour_pairs(jobs, embedder, threshold=0.8)
    assert pairs == [(0, 1)]  # job 2 is a neighbour but routed elsewhere; job 3 is routed alike but not a neighbour
    c = cross_instance_consistency(pairs, [3, 2, 3, 0])
    assert c == {"pairs": 1, "scored_pairs": 1, "exact_agreement": 0.0, "mean_abs_difference": 1.0}
    assert cross_instance_consistency(pairs, [3, 3, None, None])["exact_agreement"] == 1.0
    # copies of one step (identical judge prompts) are counted apart: they agree by construction
    c = cross_instance_consistency([(0, 1), (0, 2), (1, 3)], [3, 3, 3, 1], identical=[True, False, False])
    assert c["exact_agreement"] == pytest.approx(2 / 3) and c["identical_prompt_pairs"] == 1
    assert c["distinct_scored_pairs"] == 2 and c["distinct_exact_agreement"] == 0.5
    assert c["distinct_mean_abs_difference"] == 1.0
    with pytest.raises(ValueError, match="one flag per pair"):
        cross_instance_consistency(pairs, [3, 3, 3, 3], identical=[])


def test_reliability_of_scribe_and_prm_on_the_same_steps(planted_library, embedder):
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    scribe = get_reward("scribe", llm=llm, library=planted_library, embedder=embedder)
    eps = [episode(f"e{i}", ["Step 1 [sum]: add 2 and 3 with python, giving 5", "Step 2 [birth]: search X"])
           for i in range(3)]
    r = reliability(eps, scribe, repeats=3)
    assert r["routed_steps"] == 6 and set(r["judges"]) == {"scribe", "prm"}
    for name in ("scribe", "prm"):
        assert r["judges"][name]["repeat"]["exact_agreement"] == 1.0  # the scripted judge is deterministic
        ci = r["judges"][name]["cross_instance"]
        assert ci["scored_pairs"] == 6  # 3 episodes x 2 identical steps: 3 pairs each
        assert ci["identical_prompt_pairs"] == 6 and ci["distinct_exact_agreement"] is None  # all copies
    from turngym.credit.ablate import reliability_table

    table = "\n".join(reliability_table(r))
    assert "| scribe | 3 | 1.000 |" in table and "| prm | 3 | 1.000 |" in table
    assert "| 6 (6 with identical prompts) |" in table


def test_reliability_with_a_real_local_judge(tiny_chat_policy):
    """A tiny random transformers model as the judge: greedy scores repeat exactly; sampled ones vary."""
    llm = JSONLLM(tiny_chat_policy, max_new_tokens=4)
    jobs = noisy_jobs(6)
    prompts = judge_prompts(jobs, llm)
    greedy = repeat_consistency(prompts, llm, n=2, temperature=0.0)
    assert greedy["exact_agreement"] == 1.0 and greedy["judged_every_time"] == 6  # scores chosen among 0-3
    sampled = repeat_consistency(prompts, llm, n=3, temperature=5.0)
    assert sampled["judged_every_time"] == 6 and sampled["exact_agreement"] < 1.0


# ------------------------------------------------------------------ training dynamics


def record(turn: int, prototype: str | None, score: int | None) -> StepRecord:
    status = "unmatched" if prototype is None else "judged"
    return StepRecord(turn, 0, 1, "s", "k", status, 0.5 if score is None else score / 3, prototype, score)


def test_uncertainty_and_plan_separability_by_hand():
    assert normalised_entropy([3, 3, 3]) == 0.0 and normalised_entropy([0, 1, 2, 3]) == pytest.approx(1.0)
    rec = DynamicsRecorder()
    family_of = {"f0": "f0", "f0.s0": "f0", "f1": "f1"}
    # successes plan with family f0, failures with f1: plans separate success fully
    rec.add_group([[record(0, "f0.s0", 3)], [record(0, "f0.s0", 1)], [record(0, "f1", 0)], [record(0, "f1", 0)]],
                  [1.0, 1.0, 0.0, 0.0], family_of)
    rec.add_group([[record(0, "f0.s0", 3)], [record(0, "f0", 2)], [record(0, "f1", 1)], [record(0, None, None)]],
                  [1.0, 1.0, 0.0, 0.0], family_of)
    m = rec.metrics()
    assert m["scribe/plan_separability"] == 1.0
    assert m["scribe/uncertainty/f0.s0"] == pytest.approx(np.mean([normalised_entropy([3, 1])]))  # group 2 has one
    assert m["scribe/uncertainty/f1"] == 0.0 and m["scribe/unmatched_rate"] == pytest.approx(1 / 8)
    assert rec.metrics() == {}  # drained
    rec.add_group([[record(0, "f0", 3)]] * 4, [1.0, 0.0, 1.0, 0.0], family_of)
    assert rec.metrics()["scribe/plan_separability"] == 0.5  # identical plans say nothing about success


def test_trainer_logs_scribe_training_dynamics(tmp_path, planted_library, embedder):
    from test_trainer import config, model_and_tokenizer
    from turngym.envs.calculator import CalculatorEnv
    from turngym.training.trainer import TurnGRPOTrainer, task_dataset

    reward = get_reward("scribe", llm=JSONLLM(FakeRulePolicy(scripted_rule)), library=planted_library,
                        embedder=embedder)
    model, tok = model_and_tokenizer()
    tr = TurnGRPOTrainer(model=model, processing_class=tok, env_factory=lambda: CalculatorEnv(max_turns=2),
                         reward=reward, args=config(tmp_path, max_steps=1), train_dataset=task_dataset(range(4)),
                         estimator="turn")
    tr.train()
    logged = {k for h in tr.state.log_history for k in h}
    assert "turngym/scribe/unmatched_rate" in logged
    assert reward.dynamics.groups == []  # drained by the trainer every step


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


# ------------------------------------------------------------------ recipes


RECIPES = sorted((ROOT / "configs").glob("train_*_scribe*.yaml")) + sorted((ROOT / "configs").glob("train_*_prm.yaml"))


def test_scribe_recipes_load_and_name_rewards_that_build(planted_library, embedder):
    """Every SCRIBE recipe parses and its reward builds (with a fake judge in place of the recipe's model)."""
    from turngym.training.config import TrainConfig

    names = {p.name for p in RECIPES}
    assert {"train_math_scribe.yaml", "train_bfcl_scribe.yaml", "train_math_prm.yaml", "train_bfcl_prm.yaml",
            "train_math_scribe_egpo.yaml", "train_bfcl_scribe_egpo.yaml", "train_bfcl_scribe_funrl.yaml"} <= names
    llm = JSONLLM(FakeRulePolicy(scripted_rule))
    for path in RECIPES:
        cfg = TrainConfig.load(path)
        reward = dict(cfg.reward)
        name = reward.pop("name")
        assert "scribe" in name or name == "prm", path
        assert set(name.split("+")) <= {"scribe", "prm", "funrl"}, path
        parts = name.split("+")
        if len(parts) > 1:
            assert set(reward.get("weights", {})) == set(parts), path
        for part in parts:
            sub = reward.get(part, {}) if len(parts) > 1 else reward
            if part in ("scribe", "prm"):
                sub.update(llm=llm)
                if part == "scribe":
                    sub.update(library=planted_library, embedder=embedder, library_path=None)
        built = get_reward(name, **reward)
        s = built.score_group([episode("e", ["Step 1 [sum]: add 2 and 3", "Step 2 [birth]: so 5"])])
        assert len(s.rewards[0]) == 2 and all(np.isfinite(s.rewards[0])), path


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
    d = scores.diagnostics
    assert d["steps"] == [[] for _ in eps] or reward.library is not None
    assert all(0 <= s["score"] <= 3 for steps in d["steps"] for s in steps if s["score"] is not None)
    assert all(np.isfinite(x) for r in scores.rewards for x in r) and all(len(r) == 2 for r in scores.rewards)
    prm = get_reward("prm", llm=reward.llm)
    assert all(len(r) == 2 for r in prm.score_group(eps).rewards)
    print("default-model chain:", json.dumps(stats.to_dict()), "steps:", d["steps"])


# ------------------------------------------------------------------ commands, over a served model


def _serve(rule):
    from conftest import FakeJSONServer

    def reply(path, body, n):
        return 200, {"choices": [{"message": {"content": rule(body["messages"][-1]["content"], n, None)},
                                  "finish_reason": "stop"}]}

    return FakeJSONServer(reply)


def _build_library(server, eps, lib, *extra: str) -> int:
    """``turngym scribe build-library`` on ``eps`` with the served model ``m``, writing ``lib``."""
    from turngym.cli import main

    return main(["scribe", "build-library", str(eps), "--llm", "m", "--base-url", server.url, "--out", str(lib), *extra])


def _write_episodes(path, n_groups=3):
    from turngym.episode import EpisodeWriter
    from turngym.truth import TruthValue

    with EpisodeWriter(path) as w:
        for g in range(n_groups):
            for k in range(2):
                ep = episode(f"g{g}#{k}", ["Step 1 [birth]: search X birthplace",
                                           "Step 2 [sum]: WRONG STEP here" if k else "Step 2 [sum]: c <= 44"],
                             correct=k == 0)
                ep.group = f"g{g}"
                ep.turns[0].truth["retrieval_hit"] = TruthValue(True, "env")  # where today's SearchQA records it
                ep.turns[1].truth["retrieval_hit"] = TruthValue(k == 0, "env")
                w.write(ep)


def test_build_library_and_diagnose_commands_against_a_served_model(tmp_path):
    from turngym.cli import main

    server = _serve(scripted_rule)
    try:
        eps = tmp_path / "eps.jsonl"
        _write_episodes(eps)
        lib = tmp_path / "lib.json"
        assert _build_library(server, eps, lib, "--min-cluster-size", "2") == 0
        assert SkillLibrary.load(lib).prototypes
        out = tmp_path / "diag.json"
        assert main(["scribe", "diagnose", str(eps), "--llm", "m", "--base-url", server.url, "--library", str(lib),
                     "--repeats", "3", "--out", str(out)]) == 0
        diag = json.loads(out.read_text())
        assert diag["routed_steps"] == 12 and diag["judges"]["scribe"]["repeat"]["exact_agreement"] == 1.0
        assert diag["judges"]["prm"]["repeat"]["exact_agreement"] == 1.0
    finally:
        server.close()


def test_build_library_reports_when_the_model_gives_no_json(tmp_path, capsys):
    server = _serve(lambda p, n, s: "I am not JSON")
    try:
        eps = tmp_path / "eps.jsonl"
        _write_episodes(eps, 1)
        with pytest.raises(SystemExit, match=r"no skill items from 2 episode\(s\): 2 of 2 decomposer windows gave no "
                                             r"valid JSON\n"):
            _build_library(server, eps, tmp_path / "lib.json")
        assert not (tmp_path / "lib.json").exists()
    finally:
        server.close()


def paraphrasing_rule(prompt: str, n: int, sampling) -> str:
    """As ``scripted_rule``, but the decomposer quotes no turn verbatim (as small models paraphrase)."""
    if prompt.startswith("Split the agent's work"):
        steps = [{**st, "starts_with": "In other words, " + st["subgoal"]} for st in fake_steps(prompt)]
        return json.dumps({"steps": steps})
    return scripted_rule(prompt, n, sampling)


def test_build_library_says_when_every_quote_is_a_paraphrase_and_whole_turn_steps_keep_them(tmp_path):
    server = _serve(paraphrasing_rule)
    try:
        eps = tmp_path / "eps.jsonl"
        _write_episodes(eps)
        lib = tmp_path / "lib.json"
        with pytest.raises(SystemExit, match=r"0 of 6 decomposer windows gave no valid JSON; 18 proposed step\(s\) were "
                                             r"dropped: their quotes are not in the turn's text, or they name a turn "
                                             r"outside their window \(--locate fuzzy or --unlocated whole_turn keep such"):
            _build_library(server, eps, lib)
        assert not lib.exists()
        assert _build_library(server, eps, lib, "--unlocated", "whole_turn", "--min-cluster-size", "2") == 0
        assert SkillLibrary.load(lib).prototypes
    finally:
        server.close()


def test_the_no_steps_hint_names_only_the_options_not_tried():
    import argparse

    from turngym.cli.scribe import no_items_reason
    from turngym.rewards.scribe.decompose import Decomposition

    tried = argparse.Namespace(locate="fuzzy", unlocated="drop")
    assert no_items_reason([Decomposition([], dropped=3, windows=1)], tried).endswith(
        "(--unlocated whole_turn keeps such steps)")


@pytest.mark.parametrize("label", ["scribe", "scribe[unlocated_steps=whole_turn]"])  # a variant takes the table too
def test_ablate_reports_scribe_prm_and_their_reliability_table(tmp_path, label):
    from turngym.credit.ablate import run_ablation

    server = _serve(scripted_rule)
    try:
        eps = tmp_path / "eps.jsonl"
        _write_episodes(eps)
        summary = run_ablation(eps, ["outcome", label, "prm", "funrl"], tmp_path / "abl", scribe_llm="m",
                               scribe_base_url=server.url, reliability_repeats=2)
        assert not summary["errors"], summary["errors"]
        s = summary["rewards"][label]
        assert s["library"]["prototypes"] >= 1 and s["llm"]["calls"] > 0
        assert s["credit_accuracy"] is not None and s["credit_accuracy"] > 0.5  # WRONG STEP turns get low credit
        assert summary["rewards"]["prm"]["credit_accuracy"] > 0.5
        assert set(summary["reliability"]["judges"]) == {"scribe", "prm"}
        md = (tmp_path / "abl" / "ablation.md").read_text()
        assert "Judge reliability" in md and "| prm | 2 |" in md
    finally:
        server.close()


def test_the_reliability_table_needs_exactly_one_scribe(tmp_path):
    from turngym.credit.ablate import run_ablation

    eps = tmp_path / "eps.jsonl"
    _write_episodes(eps, 1)
    with pytest.raises(ValueError, match="needs one 'scribe' among the rewards$"):
        run_ablation(eps, ["outcome", "prm"], tmp_path / "abl", scribe_llm="m", scribe_base_url="http://127.0.0.1:9",
                     reliability_repeats=2)
    with pytest.raises(ValueError, match=r"needs one 'scribe' among the rewards, not 2: scribe, scribe\[router=llm\]$"):
        run_ablation(eps, ["scribe", "scribe[router=llm]"], tmp_path / "abl", scribe_llm="m",  # refused before any build
                     scribe_base_url="http://127.0.0.1:9", reliability_repeats=2)


def test_local_model_scores_are_constrained_to_the_scale(tiny_chat_policy):
    """A tiny random local model cannot write JSON, but its score is picked among 0-3 by log-probability."""
    from turngym.rewards.scribe.constrain import option_logprobs

    llm = JSONLLM(tiny_chat_policy, max_new_tokens=8)
    proto = SkillPrototype("p0", "bound", "when bounding", ["state the final condition explicitly"], [])
    jobs = [(episode(f"e{i}", [f"step {i}"]), SkillItem("s", "k", 0, 0, 6, span=f"step {i}"), proto) for i in range(3)]
    verdicts = judge_steps(jobs, llm)
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
        [v] = judge_steps([(episode("e", ["x"]), SkillItem("s", "k", 0, 0, 1, span="x"), proto)], llm)
        assert v.score == 3
        body = server.requests[0][1]
        assert body["response_format"]["json_schema"]["schema"] == JUDGE_SCHEMA
    finally:
        server.close()


def test_single_token_options_take_one_forward_pass_with_the_same_logprobs(tiny_chat_policy):
    """The judge's 0-3 score options are one token each after the prompt: the one-pass path gives the
    log-probabilities the padded one-copy-per-option pass gives (a multi-token option forces that path)."""
    from turngym.rewards.scribe.constrain import option_logprobs

    prompt, opts = "Grade: {\"score\":", ["0", "1", "2", "3"]  # (with a trailing space this tokenizer merges " 1")
    tok = tiny_chat_policy.tokenizer
    base = tok(prompt, add_special_tokens=False)["input_ids"]
    assert all(tok(prompt + o, add_special_tokens=False)["input_ids"][:-1] == base for o in opts)  # the fast path applies
    fast = option_logprobs(tiny_chat_policy, prompt, opts, add_special_tokens=False)
    padded = option_logprobs(tiny_chat_policy, prompt, opts + ["3 and a longer tail"], add_special_tokens=False)
    assert np.allclose(fast, padded[:4], atol=1e-4)


def test_reliability_counts_judge_replies_without_json_and_completes(planted_library, embedder):
    """A served judge whose open-ended (PRM) replies are prose when sampled: the reliability run does not
    abort; those replies are counted, shown in ablate's table, and the steps they hit are left out of agreement."""

    def rule(prompt: str, n: int, sampling) -> str:
        if prompt.startswith("Grade one step of an agent's work: is it correct") and sampling.temperature > 0:
            return "I think this step is fine."  # no JSON, also after the re-ask
        return scripted_rule(prompt, n, sampling)

    scribe = get_reward("scribe", llm=JSONLLM(FakeRulePolicy(rule)), library=planted_library, embedder=embedder)
    eps = [episode(f"e{i}", ["Step 1 [sum]: add 2 and 3 with python, giving 5", "Step 2 [birth]: search X"])
           for i in range(2)]
    r = reliability(eps, scribe, repeats=2)
    prm = r["judges"]["prm"]
    assert prm["repeat"]["llm"]["failed"] == 8 and prm["repeat"]["judged_every_time"] == 0  # 4 steps x 2 repeats
    assert prm["repeat"]["exact_agreement"] is None
    assert prm["cross_instance"]["scored_pairs"] == 2  # the greedy judgements parse: cross-instance still filled
    assert r["judges"]["scribe"]["repeat"]["llm"]["failed"] == 0
    from turngym.credit.ablate import reliability_table

    table = "\n".join(reliability_table(r))
    assert "| prm | 2 | – | – | – | 2 (2 with identical prompts) |" in table and table.count(" 8 of 8 |") == 1
    assert " 0 of 8 |" in table


def test_a_reply_cut_off_by_the_token_limit_keeps_its_complete_steps():
    from turngym.rewards.scribe.prompts import DECOMPOSE_SCHEMA

    step = {"subgoal": "bound c {strictly}", "skill": "state an integer bound", "turn": 0, "starts_with": "Since c"}
    cut = '{"steps": [' + json.dumps(step) + ', {"subgoal": "check the ans'
    value, err, repaired = parse_json_reply(cut, DECOMPOSE_SCHEMA)
    assert err is None and repaired and value == {"steps": [step]}
    # nothing complete inside the object: still a failure, nothing invented
    assert parse_json_reply('{"steps": [{"subgoal": "check', DECOMPOSE_SCHEMA)[0] is None
    # a complete object is never cut back
    whole = json.dumps({"steps": [step, step]})
    assert parse_json_reply(whole + " and more prose", DECOMPOSE_SCHEMA)[0] == {"steps": [step, step]}


def test_repeat_tokens_change_no_local_score(tiny_chat_policy):
    """A local judge's score is drawn before generation: repeats that generate 1 token give the same
    agreement as repeats that generate 8 (same draws), and every reply still yields a score."""
    llm = JSONLLM(tiny_chat_policy, max_new_tokens=8)
    prompts = judge_prompts(noisy_jobs(5), llm)
    long = repeat_consistency(prompts, llm, n=3, temperature=5.0)
    short = repeat_consistency(prompts, llm, n=3, temperature=5.0, max_new_tokens=1)
    keys = ("judged_every_time", "exact_agreement", "pairwise_agreement", "mean_score_range", "mean_score_std")
    assert [short[k] for k in keys] == [long[k] for k in keys] and short["judged_every_time"] == 5
    assert short["exact_agreement"] < 1.0 and short["llm"]["failed"] == 0


def test_unlocated_quotes_drop_steps_or_make_the_turn_one_step():
    """A decomposer that paraphrases instead of quoting: by default its steps are dropped and the turn is
    unstepped; with unlocated="whole_turn" the turn becomes one step (first placed step's labels), counted."""
    from turngym.rewards.scribe.decompose import decompose

    def paraphrasing(prompt: str, n: int, sampling) -> str:
        return json.dumps({"steps": [
            {"subgoal": "compute the product", "skill": "evaluate an expression", "turn": 0, "starts_with": "Calculate 84*63"},
            {"subgoal": "then add", "skill": "add numbers", "turn": 0, "starts_with": "not in the text"},
            {"subgoal": "answer", "skill": "give the final answer", "turn": 1, "starts_with": "<answer>5343"}]})

    ep = episode("e", ["<calc>84 * 63 + 51</calc>", "<answer>5343</answer>"])
    [dropped] = decompose([ep], JSONLLM(FakeRulePolicy(paraphrasing)))
    assert dropped.dropped == 2 and dropped.unstepped_turns == [0] and dropped.whole_turn_steps == 0
    assert [(it.turn, it.start, it.end) for it in dropped.items] == [(1, 0, 21)]
    [whole] = decompose([ep], JSONLLM(FakeRulePolicy(paraphrasing)), unlocated="whole_turn")
    assert whole.dropped == 2 and whole.unstepped_turns == [] and whole.whole_turn_steps == 1
    first = whole.items[0]
    assert (first.turn, first.start, first.end, first.skill) == (0, 0, 25, "evaluate an expression")
    assert first.span == ep.turns[0].action
    with pytest.raises(ValueError, match="unlocated"):
        decompose([ep], JSONLLM(FakeRulePolicy(paraphrasing)), unlocated="guess")



def test_fuzzy_location_places_paraphrased_quotes_only_when_opted_in():
    """locate_steps="fuzzy": a paraphrased quote is placed where the turn's words cover most of the quote's
    words (counted as fuzzy_located); a quote with too little in common is still dropped; the default
    ("exact") is unchanged, and bad settings are refused with one message."""
    from turngym.rewards.scribe.decompose import locate_fuzzy

    def paraphrasing(prompt: str, n: int, sampling) -> str:
        return json.dumps({"steps": [
            {"subgoal": "set up", "skill": "restate the task", "turn": 0, "starts_with": "First work out"},
            {"subgoal": "multiply", "skill": "evaluate a product", "turn": 0, "starts_with": "let x equal 84*63"},
            {"subgoal": "invented", "skill": "narrate", "turn": 0, "starts_with": "the agent thinks hard"},
            {"subgoal": "answer", "skill": "give the final answer", "turn": 1, "starts_with": "Answer: 5343"}]})

    turn0 = "First, work out the product.\nLet x = 84 * 63, then x + 51 = 5343."
    ep = episode("e", [turn0, "<answer>5343</answer>"])
    [exact] = decompose([ep], JSONLLM(FakeRulePolicy(paraphrasing)))
    assert exact.items == [] and exact.dropped == 4 and exact.fuzzy_located == 0
    [fuzzy] = decompose([ep], JSONLLM(FakeRulePolicy(paraphrasing)), locate_steps="fuzzy")
    let = turn0.index("Let x")
    assert [(it.turn, it.start, it.end, it.skill) for it in fuzzy.items] == [
        (0, 0, let, "restate the task"), (0, let, len(turn0), "evaluate a product"),
        (1, 0, 21, "give the final answer")]  # a turn's first step starts at character 0
    assert fuzzy.fuzzy_located == 3 and fuzzy.dropped == 1 and fuzzy.unstepped_turns == []
    assert fuzzy.items[1].span.startswith("Let x = 84 * 63")
    assert locate_fuzzy("multiply 84 * 63", "<calc>84 * 63 + 51</calc>") == 6
    assert locate_fuzzy("agent", "<calc>84 * 63 + 51</calc>") is None
    assert locate_fuzzy("Add 51 to the result", "<calc>84 * 63 + 51</calc>") is None  # 1 of 5 words
    assert locate_fuzzy("Add 51 to the result", "<calc>84 * 63 + 51</calc>", min_coverage=0.2) is None  # 1 word
    with pytest.raises(ValueError, match="locate_steps"):
        decompose([ep], JSONLLM(FakeRulePolicy(paraphrasing)), locate_steps="nearest")
    with pytest.raises(ValueError, match="fuzzy_min_coverage"):
        decompose([ep], JSONLLM(FakeRulePolicy(paraphrasing)), locate_steps="fuzzy", fuzzy_min_coverage=0)

def test_json_repair_honours_escaped_quotes_before_brackets():
    """An escaped quote inside a string does not end it, so brackets after it stay text."""
    from turngym.rewards.scribe.llm import _outermost_object, close_truncated

    assert close_truncated('{"steps": [{"q": "a \\"}\\" b"}, {"q": "c"}, {"q": "d') == \
        '{"steps": [{"q": "a \\"}\\" b"}, {"q": "c"}]}'
    assert _outermost_object('say {"q": "x \\"}\\" y", "n": 1} end') == '{"q": "x \\"}\\" y", "n": 1}'
    assert _outermost_object('x {"a": "\\\\"} y') == '{"a": "\\\\"}'


def test_scribe_costs_counts_judged_episodes_and_refuses_one_repeat():
    """benchmarks/scribe_costs.py: an episode counts as judged when any of its steps went to the judge
    (judged, or judged without valid JSON), not when all were unmatched or it had none; --repeats 1 is refused."""
    import importlib.util
    import subprocess
    import sys

    spec = importlib.util.spec_from_file_location("scribe_costs", ROOT / "benchmarks" / "scribe_costs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    st = lambda status: {"status": status}  # noqa: E731
    diags = [{"steps": [[st("unmatched"), st("judged")], [st("unmatched")], []]},
             {"steps": [[st("judge_failed")], [st("judged"), st("judged")]]}]
    assert mod.judged_episodes(diags) == 3
    assert mod.per_judged(4, 3) == 4 / 3 and mod.per_judged(0, 0) is None
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scribe_costs.py"), "--repeats", "1"],
                         capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert run.returncode == 2 and "--repeats must be at least 2" in run.stderr


def test_scribe_commands_say_each_stage_before_it_runs_and_count_replies_as_they_arrive(tmp_path, monkeypatch):
    """Stage lines and reply counts in the order things happen: every line is recorded beside the served
    model's requests, so a line said after the work it names would show up out of order."""
    import turngym.progress as progress
    from turngym.cli import main

    events: list[str] = []
    monkeypatch.setattr(progress, "say", lambda text: events.append(text.split("] ", 1)[1]))

    def recorded(prompt, n, sampling):
        events.append("<llm call>")
        return scripted_rule(prompt, n, sampling)

    server = _serve(recorded)
    try:
        eps = tmp_path / "eps.jsonl"
        _write_episodes(eps)
        lib = tmp_path / "lib.json"
        assert main(["scribe", "build-library", str(eps), "--llm", "m", "--base-url", server.url, "--out", str(lib),
                     "--min-cluster-size", "2", "--concurrency", "2"]) == 0
        assert events[0].startswith("scribe build-library: importing")
        first_call = events.index("<llm call>")
        assert events[first_call - 1] == "decomposing 6 episodes into steps…"
        # identical episodes share a prompt: 2 distinct decompositions, one chunk; 4 rubrics, two chunks of 2
        assert events[first_call + 2] == "decomposing 6 episodes into steps: replies 2/2"
        stages = [e for e in events if e.endswith("…")]
        assert [s.split(" ")[0] for s in stages] == ["scribe", "reading", "LLM", "decomposing", "embedding", "clustering",
                                                     "distilling"]
        distil = events.index("distilling 4 rubrics (2 families)…")
        assert events[distil + 1] == "<llm call>"
        counts = [e for e in events[distil:] if "replies" in e]
        assert counts[0].startswith("distilling 4 rubrics (2 families): replies 2/4, ETA ")
        assert counts[1:] == ["distilling 4 rubrics (2 families): replies 4/4"] and events[-1] == counts[-1]

        events.clear()
        assert main(["scribe", "diagnose", str(eps), "--llm", "m", "--base-url", server.url, "--library", str(lib),
                     "--repeats", "2", "--no-prm"]) == 0
        stages = [e for e in events if e.endswith("…")]
        assert stages[:4] == ["scribe diagnose: importing the decomposer, embedder and judge…",
                              f"reading episodes from {eps}…", f"LLM 'm' served at {server.url}…",
                              "decomposing 6 episodes into steps…"]
        assert stages[-3:] == ["scribe judge: first judgement of 12 steps…", "scribe judge: repeat 1/2 over 12 steps…",
                               "scribe judge: repeat 2/2 over 12 steps…"]
        last = events[-1]
        assert last.startswith("scribe judge: repeat 2/2 over 12 steps: replies ") and last.endswith("/12")
    finally:
        server.close()
