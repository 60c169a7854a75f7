"""Per-turn truth that rewards cannot see, and credit tables that separate within-episode credit from
between-episode correlation (within-episode AUC, label-free baselines, --estimators)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from turngym.credit.ablate import ablate
from turngym.credit.accuracy import credit_score, within_auc
from turngym.credit.table import baseline_scores, parse_estimators
from turngym.episode import Episode, EpisodeGroup, EpisodeWriter, Turn, group_episodes, reward_view, turn_labels
from turngym.rewards import get_reward
from turngym.rewards.base import GroupReward, GroupScores
from turngym.truth import TruthError, TruthMap, TruthValue


def ep(i, group, labels, correct, key="retrieval_hit", source="env"):
    """Search turns with ``labels`` as truth (None: no truth), then an answer turn."""
    turns = [Turn(index=t, action=f"<search>q{t}</search>", observation="docs",
                  truth={} if lab is None else {key: TruthValue(lab, source)}) for t, lab in enumerate(labels)]
    turns.append(Turn(index=len(labels), action="<answer>x</answer>"))
    return Episode(id=f"e{i}", env_id="turngym/SearchQA-v0", group=group, task={"question": group, "answers": ["x"]},
                   turns=turns, final_answer="x", outcome={"em": float(correct)}, terminated=True)


class Peek(GroupReward):
    """A reward that records what it was handed: the truth and the metrics of every turn."""

    name, estimator = "peek", "turn"

    def __init__(self):
        self.seen = []

    def score_group(self, group, **_):
        self.seen += [(dict(t.truth), dict(t.metrics)) for e in group for t in e.turns]
        return GroupScores([[0.0] * len(e.turns) for e in group])


# ------------------------------------------------------------------ the namespace


def test_truth_round_trips_and_older_records_still_load():
    e = ep(0, "g", [True, -1], correct=True, source="human")
    back = Episode.from_json(e.to_json())
    assert back.turns[0].truth == {"retrieval_hit": TruthValue(True, "human")}
    assert back.turns[1].truth["retrieval_hit"] == TruthValue(-1, "human") and back.turns[2].truth == {}
    old = json.loads(e.to_json())
    for t in old["turns"]:
        del t["truth"]
    assert all(t.truth == {} for t in Episode.from_dict(old).turns)  # a file from before truth existed
    with pytest.raises(ValueError, match="source"):
        TruthValue(1, "guessed")
    old["turns"][0]["truth"] = {"k": 1}
    with pytest.raises(ValueError, match="'value'"):
        Episode.from_dict(old)
    assert "truth" not in e.turns[0].info_dict()  # never in what a policy may see


def test_minus_one_is_not_useful_and_non_binary_truth_needs_a_map():
    e = ep(0, "g", [1, -1, 0], correct=True, source="human")
    with pytest.raises(TruthError, match=r"-1 .*not binary.*--truth-map"):
        turn_labels(e)
    m = TruthMap.parse("+1:1,-1:0,0:skip")
    assert turn_labels(e, "retrieval_hit", m) == [1, 0, None, None]
    with pytest.raises(TruthError, match="not in --truth-map"):
        turn_labels(e, mapping=TruthMap.parse("1:1,0:0"))
    with pytest.raises(TruthError, match="VALUE:LABEL"):
        TruthMap.parse("+1=1")
    with pytest.raises(TruthError, match="1, 0 or skip"):
        TruthMap.parse("+1:yes")
    assert turn_labels(ep(1, "g", [True, False, 1.0], correct=True)) == [1, 0, 1, None]
    two = ep(2, "g", [1, 0], correct=True)
    two.turns[0].truth["planted"] = TruthValue(0, "planted")
    with pytest.raises(TruthError, match="several truth keys"):
        turn_labels(two)
    assert turn_labels(two, "planted") == [0, None, None]


def test_reward_view_holds_no_truth_and_leaves_the_episodes_alone():
    eps = [ep(0, "g", [1, 0], True), ep(1, "g", [0, 1], False)]
    group = group_episodes(eps)[0]
    seen = reward_view(group)
    assert isinstance(seen, EpisodeGroup) and seen.key == group.key
    assert all(t.truth == {} for e in seen for t in e.turns)
    assert eps[0].turns[0].truth["retrieval_hit"].value == 1  # the caller's episodes keep theirs
    assert [e.id for e in reward_view(eps)] == ["e0", "e1"]


def test_no_reward_sees_the_truth_in_ablate_creditbench_or_the_trainer():
    from turngym.credit.creditbench import score_groups
    from turngym.training.advantages import get_estimator
    from turngym.training.trainer import TurnGRPOTrainer

    eps = [ep(0, "g", [1, 0], True), ep(1, "g", [0, 1], False), ep(2, "h", [1, 1], True), ep(3, "h", [0, 0], False)]
    peek = Peek()
    ablate(eps, {"peek": peek})
    score_groups([eps[:2], eps[2:]], {"peek": peek}, labels_of=lambda e: turn_labels(e), n_boot=10)
    groups = group_episodes(eps)
    trainer = SimpleNamespace(reward=peek, estimator=get_estimator("grpo"), advantage_eps=None, gamma=1.0,
                              _estimator_kwargs=lambda g: {}, _warn_if_biased=lambda g: None)
    TurnGRPOTrainer._score_groups(trainer, eps, groups, None)
    assert len(peek.seen) == 3 * 12
    assert all(truth == {} and "retrieval_hit" not in metrics for truth, metrics in peek.seen)


def test_older_files_get_the_truth_their_env_declares(tmp_path):
    from turngym.episode.reader import load_episodes

    old = ep(0, "g", [], True)
    old.turns = [Turn(index=0, action="<search>q</search>", metrics={"retrieval_hit": True, "tool_ok": True}),
                 Turn(index=1, action="<answer>x</answer>")]
    record = {**old.to_dict(), "schema_version": 1}  # as written before turns carried truth
    for t in record["turns"]:
        del t["truth"]
    (tmp_path / "old.jsonl").write_text(json.dumps(record) + "\n")
    got = load_episodes(tmp_path / "old.jsonl").episodes[0]
    assert got.turns[0].truth == {"retrieval_hit": TruthValue(True, "env")}  # SearchQA declares retrieval_hit only


# ------------------------------------------------------------------ the table


def test_within_episode_auc_by_hand():
    a, b = [(0.9, 1), (0.1, 0)], [(0.2, 1), (0.5, 0)]
    assert within_auc([a, b]) == 0.5  # one of the two in-episode pairs ranked right
    s = credit_score([[a], [b]], n_boot=50)
    assert s.auc == 0.75 and s.within_auc == 0.5 and s.n_within_pairs == 2  # pooled: 3 of 4 pairs
    assert within_auc([[(1.0, 1), (1.0, 0), (1.0, 0)]]) == 0.5  # an episode-level credit: ties, exactly 0.5
    assert within_auc([[(1.0, 1)], [(0.0, 0)]]) is None  # no episode holds both labels


def test_label_free_baselines_by_hand():
    # A: useless then useful (3 turns, the answer unlabelled), outcome 1; B: useful then useless (2 turns), outcome 0
    a = ep(0, "g", [0, 1], True)
    b = Episode(id="e1", env_id="turngym/SearchQA-v0", group="g", task=a.task, outcome={"em": 0.0},
                turns=[Turn(index=0, action="s", truth={"retrieval_hit": TruthValue(1, "env")}),
                       Turn(index=1, action="s", truth={"retrieval_hit": TruthValue(0, "env")})])
    base = baseline_scores([[a, b]], [[turn_labels(a), turn_labels(b)]], n_boot=10)
    # position: A (0, .5, 1), B (0, 1); useful .5 and 0 vs useless 0 and 1: win, loss, tie, loss
    assert base["position"]["auc"] == 0.375 and base["position"]["within_auc"] == 0.5
    # -(turns remaining): A (-2, -1, 0), B (-1, 0); useful -1, -1 vs useless -2, 0
    assert base["remaining"]["auc"] == 0.5 and base["remaining"]["within_auc"] == 0.5
    assert base["outcome"]["auc"] == 0.5 and base["outcome"]["within_auc"] == 0.5


def test_episode_level_rewards_score_half_within_episodes_and_are_marked(tmp_path):
    # useless turns sit in failing episodes: pooled credit for the outcome, none within an episode
    eps = [ep(0, "g", [1, 0], True), ep(1, "g", [0, 0], False), ep(2, "g", [1, 1], True),
           ep(3, "h", [0, 1], True), ep(4, "h", [0, 0], False), ep(5, "h", [0, 0], False)]
    s = ablate(eps, {n: get_reward(n) for n in ("outcome", "ttrl")}, tmp_path, estimators=["turn"])
    for name in ("outcome", "ttrl"):
        grpo = s["rewards"][name]["by_estimator"]["grpo"]
        assert grpo["within_auc"] == 0.5 and grpo["n_within_pairs"] == 2
        assert grpo["beats_label_free"]["within_auc"] is False
        assert set(s["rewards"][name]["by_estimator"]) == {"grpo", "turn"}
    out = s["rewards"]["outcome"]["credit_accuracy_advantage"]
    # pooled: the between-episode correlation. Broadcasting the outcome itself: each of the 4 useful turns (all in
    # correct episodes) beats the 6 useless turns of failed episodes and ties the 2 of correct ones: 28 / 32
    assert s["baselines"]["outcome"]["auc"] == 0.875 and s["baselines"]["position"]["auc"] == 0.5
    # GRPO's per-group z-scores rank group h's success above group g's: 27 / 32, below the baseline, marked
    assert out["auc"] == 27 / 32 and out["beats_label_free"]["auc"] is False
    md = (tmp_path / "ablation.md").read_text()
    assert "within-episode AUC" in md and "*label-free: −(turns remaining)*" in md and "0.500 [" in md and "†" in md
    assert json.loads((tmp_path / "ablation.json").read_text())["best_label_free"]["auc"]["name"] == "outcome"


def test_estimators_are_checked():
    assert parse_estimators("turn, rloo") == ["turn", "rloo"] and parse_estimators("") == []
    with pytest.raises(ValueError, match=r"unknown estimator\(s\) \['nope'\]"):
        parse_estimators("turn,nope")


def test_ablate_command_names_the_truth_and_refuses_unmapped_labels(tmp_path):
    f = tmp_path / "human.jsonl"
    with EpisodeWriter(f) as w:
        for e in (ep(0, "g", [1, -1], True, source="human"), ep(1, "g", [-1, 0], False, source="human")):
            w.write(e)
    cmd = [sys.executable, "-m", "turngym.cli", "ablate", "--episodes", str(f), "--rewards", "outcome",
           "--out", str(tmp_path / "o")]
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "not binary" in bad.stderr and "--truth-map" in bad.stderr
    ok = subprocess.run(cmd + ["--truth", "retrieval_hit", "--truth-map", "+1:1,-1:0,0:skip", "--estimators", "rloo"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    summary = json.loads((tmp_path / "o" / "ablation.json").read_text())
    assert summary["turns_with_ground_truth"] == 3 and set(summary["rewards"]["outcome"]["by_estimator"]) == {"grpo", "rloo"}
    missing = subprocess.run(cmd + ["--truth", "planted"], capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "no turn carries truth 'planted'" in missing.stderr


# ------------------------------------------------------------------ the contrast design


def test_contrast_design_leaves_episode_level_rewards_at_exactly_half():
    from turngym.credit.creditbench import BenchConfig, build_searchqa, planted_labels, score_groups

    cfg = BenchConfig(groups=2, k=4, seed=0, designs=("contrast",))
    groups = build_searchqa(cfg, "contrast")
    orders = [planted_labels(e)[:2] for g in groups for e in g]
    assert all(o in ([1, 0], [0, 1]) for o in orders) and [1, 0] in orders and [0, 1] in orders
    assert all(planted_labels(e)[2] is None for g in groups for e in g)
    res = score_groups(groups, {n: get_reward(n) for n in ("outcome", "ttrl", "empo")}, n_boot=20,
                       estimators=("turn",))
    for name in ("outcome", "ttrl", "empo"):
        assert res[name]["advantage"]["within_auc"] == 0.5 and res[name]["advantage"]["auc"] == 0.5, name
        assert res[name]["by_estimator"]["turn"]["within_auc"] == 0.5  # both orders: no position to exploit


def test_mathcode_contrast_puts_the_useless_cell_first_and_last():
    from turngym.credit.creditbench import BenchConfig, build_mathcode, planted_labels

    groups = build_mathcode(BenchConfig(groups=2, k=2, seed=0, noise=0.01, designs=("contrast",)), "contrast")
    assert [[planted_labels(e)[:3] for e in g] for g in groups] == [[[0, 1, 1], [1, 1, 0]]] * 2
    assert all(e.id.startswith("creditbench|mathcode-contrast|") for g in groups for e in g)
