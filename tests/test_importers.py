"""Importers: labelled chat trajectories become episodes whose human step labels credit tables can score."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from turngym.envs.parsing import parse_hermes_tool_calls
from turngym.episode import group_episodes, turn_labels
from turngym.episode.reader import read_episodes
from turngym.grading.qa import exact_match, f1_score
from turngym.importers import Fields, TrajectoryError, import_agentprocessbench, import_messages
from turngym.truth import TruthError, TruthMap, TruthValue

FIXTURE = Path(__file__).parent / "fixtures" / "agentprocessbench_mini.jsonl"
MAP = "+1:1,-1:0,0:skip"


def records() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]


@pytest.fixture
def imported(tmp_path):
    out = tmp_path / "eps.jsonl"
    summary = import_agentprocessbench(FIXTURE, out)
    return out, summary, read_episodes(out, strict=True).episodes


def test_labels_round_trip_with_all_three_values(imported):
    out, summary, eps = imported
    assert summary.written == 5 and dict(summary.skipped) == {"gaia_dev": 1}  # GAIA has no turngym env
    by_record = {r["total_index"]: r for r in records()}
    for ep in eps:
        rec = by_record[ep.meta["imported"]["record"]]
        assistant_at = [i for i, m in enumerate(rec["messages"]) if m["role"] == "assistant"]
        assert len(ep.turns) == len(assistant_at)
        want = [rec["step_labels"].get(str(i)) for i in assistant_at]
        got = [t.truth["human"].value if "human" in t.truth else None for t in ep.turns]
        assert got == want and all(type(v) is int for v in got if v is not None)  # never cast to bool
        assert all(t.truth["human"].source == "human" for t in ep.turns if t.truth)
        assert ep.meta["imported"]["source"] == "agentprocessbench" and ep.meta["imported"]["final_label"] == rec["final_label"]
        assert ep.prompt_ids is None and all(t.action_ids is None for t in ep.turns)
    assert set(summary.labels) == {-1, 0, 1} and TruthValue(-1, "human") in [t.truth.get("human") for e in eps for t in e.turns]


def test_envs_prompts_and_native_actions(imported):
    _, _, eps = imported
    sq = [e for e in eps if e.env_id == "turngym/SearchQA-v0"]
    assert len(sq) == 4 and {e.env_id for e in eps} == {"turngym/SearchQA-v0", "turngym/BFCL-v0"}
    first = sq[0]
    assert [m["role"] for m in first.prompt] == ["system", "user"] and first.task["dataset"] == "hotpotqa"
    assert first.tools and first.tools[0]["function"]["name"] == "search"
    call = first.turns[0]
    # the step is recorded as the native format's reply: a Hermes block that parses back to the same call
    assert parse_hermes_tool_calls(call.action).calls == call.tool_calls == [
        {"name": "search", "arguments": {"query_list": ["Tatra mountains highest peak country"]}}]
    assert call.observation_role == "tool" and '"result"' in call.observation
    assert first.turns[-1].tool_calls == [{"name": "answer", "arguments": {"answer": "Danube"}}]
    assert first.turns[-1].observation is None and first.terminated
    bfcl = next(e for e in eps if e.env_id == "turngym/BFCL-v0")
    assert bfcl.outcome == {"bfcl_valid": True} and bfcl.task["dataset"] == "multi_turn_base"
    assert [t.metrics["bfcl_user_turn"] for t in bfcl.turns] == [0, 0, 1, 1]
    assert bfcl.turns[1].observation_role == "user" and "list the current directory" in bfcl.turns[1].observation
    assert json.loads(bfcl.final_answer) == [["mkdir(dir_name='Projects')"], ["ls(a=True)"]]


def test_groups_are_questions_and_outcome_is_the_envs_grade(imported):
    _, _, eps = imported
    groups = group_episodes(eps)
    assert sorted(len(g) for g in groups) == [1, 2, 2] and all(g.key == g.question for g in groups)
    for ep in (e for e in eps if e.env_id == "turngym/SearchQA-v0"):
        golds = ep.task["answers"]
        assert ep.final_answer is not None
        assert ep.outcome["em"] == exact_match(ep.final_answer, golds)
        assert ep.outcome["f1"] == f1_score(ep.final_answer, golds)
    ems = {e.final_answer: e.outcome["em"] for e in eps if e.env_id == "turngym/SearchQA-v0"}
    assert ems == {"Danube": 0.0, "Vistula": 1.0, "Quentin Tarantino": 1.0, "Emir Kusturica": 0.0}


def test_unmapped_minus_one_is_refused_never_useful(imported):
    _, _, eps = imported
    ep = next(e for e in eps if any(t.truth.get("human") == TruthValue(-1, "human") for t in e.turns))
    with pytest.raises(TruthError, match="not binary"):
        turn_labels(ep, "human")
    with pytest.raises(TruthError, match="not in --truth-map"):
        turn_labels(ep, "human", TruthMap.parse("+1:1,0:skip"))
    labels = turn_labels(ep, "human", TruthMap.parse(MAP))
    raw = [t.truth["human"].value for t in ep.turns]
    assert [lab for v, lab in zip(raw, labels, strict=True) if v == -1] == [0] * raw.count(-1)


def test_ablate_scores_the_imported_file_with_within_episode_auc(imported, tmp_path):
    out, _, _ = imported
    cmd = [sys.executable, "-m", "turngym.cli", "ablate", "--episodes", str(out), "--rewards", "outcome",
           "--truth", "human", "--out", str(tmp_path / "ab")]
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--truth-map" in bad.stderr
    ok = subprocess.run(cmd + ["--truth-map", MAP], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    summary = json.loads((tmp_path / "ab" / "ablation.json").read_text())
    grpo = summary["rewards"]["outcome"]["by_estimator"]["grpo"]
    assert summary["turns_with_ground_truth"] == 13 and grpo["n_turns"] == 13  # the three 0 labels are skipped
    assert grpo["n_within_pairs"] > 0 and grpo["within_auc"] == 0.5  # an episode-level reward: exactly half
    assert "within-episode AUC" in (tmp_path / "ab" / "ablation.md").read_text()


def test_import_command_refuses_to_overwrite_and_never_duplicates(tmp_path):
    out = tmp_path / "eps.jsonl"
    cmd = [sys.executable, "-m", "turngym.cli", "import", "agentprocessbench", str(FIXTURE), "--out", str(out)]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "wrote 5 episode(s)" in first.stdout and "skipped 1 trajectory(ies) of gaia_dev" in first.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "--overwrite" in again.stderr
    assert subprocess.run(cmd + ["--overwrite"], capture_output=True, text=True, timeout=120).returncode == 0
    assert len(read_episodes(out, strict=True).episodes) == 5


def _write(tmp_path, rows) -> Path:
    p = tmp_path / "in.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r.pop("messages"), r"trajectory 3 .*field 'messages' is missing"),
    (lambda r: r["step_labels"].update({"4": 2}), r"trajectory 3 .*step_labels\['4'\] is 2; a step label is -1, 0, 1"),
    (lambda r: r["step_labels"].update({"4": True}), r"step_labels\['4'\] is True"),
    (lambda r: r["step_labels"].update({"3": 1}), r"labels message 3, which is not an assistant message"),
    (lambda r: r["messages"][2]["tool_calls"][0]["function"].update({"arguments": "{oops"}),
     r"trajectory 3 .*messages\[2\]\.tool_calls\[0\]\.function\.arguments is not JSON"),
    (lambda r: r.pop("ground_truth"), r"field 'ground_truth.target' \(the gold answers\) is missing"),
])
def test_a_malformed_trajectory_gives_one_clear_message_and_writes_nothing(tmp_path, change, message):
    rows = records()
    bad = next(r for r in rows if r["total_index"] == 3)
    change(bad)
    out = tmp_path / "eps.jsonl"
    with pytest.raises(TrajectoryError, match=message):
        import_agentprocessbench(_write(tmp_path, rows), out)
    assert not out.exists() and not list(tmp_path.glob(".eps.jsonl.*"))


def test_messages_importer_with_label_lists_and_own_field_names(tmp_path):
    rows = []
    for r in records()[:4]:  # the HotpotQA trajectories, relabelled as a list per assistant step
        assistant_at = [i for i, m in enumerate(r["messages"]) if m["role"] == "assistant"]
        rows.append({"uid": f"q{r['query_index']}-s{r['sample_index']}", "conversation": r["messages"],
                     "labels": [r["step_labels"].get(str(i)) for i in assistant_at],
                     "meta": {"q": r["question"], "golds": r["ground_truth"]["target"]}})
    rows[0]["labels"][0] = None  # an unlabelled step stays unlabelled
    fields = Fields(messages="conversation", labels="labels", question="meta.q", answers="meta.golds", id="uid")
    s = import_messages(_write(tmp_path, rows), tmp_path / "o.jsonl", "SearchQA-v0", fields, source="mine",
                        dataset="hotpotqa")
    eps = read_episodes(tmp_path / "o.jsonl", strict=True).episodes
    assert s.written == 4 and eps[0].id == "mine:q0-s0" and "human" not in eps[0].turns[0].truth
    assert [t.truth["human"].value for t in eps[1].turns] == [1, 0, 1, 1]
    rows[1]["labels"] = [1]
    with pytest.raises(TrajectoryError, match=r"trajectory 'q0-s1' .*field 'labels' has 1 labels for 4 assistant"):
        import_messages(_write(tmp_path, rows), tmp_path / "o2.jsonl", "SearchQA-v0", fields)
    with pytest.raises(TrajectoryError, match="SearchQA-v0 or BFCL-v0"):
        import_messages(_write(tmp_path, rows), tmp_path / "o3.jsonl", "Nope-v0", fields)
