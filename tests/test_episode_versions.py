"""Every schema version of the episode record reads as today's record, through the one reader.

``tests/fixtures/episode_versions/vN.jsonl`` were written by turngym itself at the commit that last wrote
format N (Calculator, SearchQA on NQ and BFCL simple_python / multi_turn_base, scripted actions): v1 at
995a1a9 (before episodes carried reward_needs), v2 at d91f26b (before turns carried truth), v3 at 84a0c95
(before reward_needs had its checker fields), v4 at c912432 (today's record, still labelled 1). All four
say ``schema_version: 1``, as every file did before version 4.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from turngym.episode import SCHEMA_VERSION, Episode, EpisodeWriter, RewardNeeds, Turn
from turngym.episode.migrations import MIGRATIONS, record_version
from turngym.episode.reader import load_episodes, read_episodes, read_records

FIXTURES = Path(__file__).parent / "fixtures" / "episode_versions"
PAST = (1, 2, 3, 4)

# the record's fields at each version: a change to Episode, Turn or RewardNeeds without a new version (and its
# migration) fails test_the_record_cannot_change_without_a_new_version
RECORD_FIELDS = {
    4: {
        "Episode": ["id", "env_id", "task", "prompt", "turns", "final_answer", "outcome", "terminated", "truncated",
                    "seed", "group", "meta", "prompt_ids", "tools", "reward_needs"],
        "Turn": ["index", "action", "tool_calls", "parse_error", "observation", "observation_role", "reward",
                 "metrics", "latency_ms", "action_ids", "action_logprobs", "observation_ids", "prefill",
                 "prefill_ids", "truth", "unshown_observation"],
        "RewardNeeds": ["answer_kind", "answer_cue", "tool_ok_metrics", "tool_error_metrics", "checker_metric",
                        "checker_outcome", "user_turn_metric", "predates"],
    },
}


def _view(ep: Episode) -> tuple:
    """What the versions must agree on: the declaration and each turn's truth."""
    return ep.reward_needs, [t.truth for t in ep.turns]


@pytest.mark.parametrize("version", PAST)
def test_each_past_file_is_dated_by_what_it_holds(version):
    records, errors = read_records(FIXTURES / f"v{version}.jsonl", strict=True)
    assert not errors and len(records) == 5
    assert {r["schema_version"] for _, r in records} == {1}
    assert [record_version(r) for _, r in records] == [version] * 5


@pytest.mark.parametrize("version", PAST)
def test_a_file_of_every_past_version_reads_as_todays_record(version):
    today = {e.id: _view(e) for e in read_episodes(FIXTURES / "v4.jsonl", strict=True).episodes}
    report = read_episodes(FIXTURES / f"v{version}.jsonl", strict=True)
    got = {e.id: _view(e) for e in report.episodes}
    if version == 2:  # SearchQA declared no search_ok metric yet: the file keeps the declaration it was played under
        needs, truth = got["old-2"]
        assert needs.tool_ok_metrics == () and today["old-2"][0].tool_ok_metrics == ("search_ok",)
        got["old-2"] = (dataclasses.replace(needs, tool_ok_metrics=("search_ok",)), truth)
    assert got == today
    assert all(e.reward_needs is not None and not e.reward_needs.predates for e in report.episodes)
    # SearchQA's retrieval hit left the metrics at version 3: read from them for older files
    search = next(e for e in report.episodes if e.env_id == "turngym/SearchQA-v0")
    assert "retrieval_hit" in search.turns[0].truth
    # BFCL's checker fields came at version 4: each episode gets its own category's
    bfcl = {e.task["dataset"]: e.reward_needs for e in report.episodes if e.env_id == "turngym/BFCL-v0"}
    assert bfcl["simple_python"].checker_outcome == "bfcl_valid"
    assert bfcl["multi_turn_base"].checker_metric == "bfcl_turn_valid"
    with_truth = sum(any(truth for truth in turns) for _, turns in today.values())
    assert with_truth == 4  # the Calculator pair (tool_ok), SearchQA (retrieval_hit), BFCL multi-turn
    expected = {1: {2: 5, 3: with_truth}, 2: {3: with_truth, 4: 5}, 3: {4: 5}, 4: {}}[version]
    assert report.upgraded == expected


def test_notes_say_once_what_each_migration_filled(capsys):
    report = load_episodes(FIXTURES / "v1.jsonl")
    out = capsys.readouterr().out
    assert report.notes() == [
        "5 episode(s) written before episodes carried reward_needs (or all its fields): their registered env's "
        "declaration is used for what they lack",
        "4 episode(s) written before turns carried truth: the truth keys their registered env declares were read "
        "from their metrics"]
    assert out.count("note: ") == 2
    load_episodes(FIXTURES / "v4.jsonl")
    assert "note:" not in capsys.readouterr().out


def test_the_viewer_reads_old_files_through_the_reader_and_gets_their_truth(tmp_path):
    from turngym.views.viewer import write_viewer

    html = write_viewer(FIXTURES / "v2.jsonl", tmp_path / "view.html").read_text()
    assert "4 episode(s) written before turns carried truth" in html


def test_a_file_written_today_is_labelled_with_the_current_version_and_needs_no_migration(tmp_path):
    path = tmp_path / "new.jsonl"
    with EpisodeWriter(path) as w:
        for ep in read_episodes(FIXTURES / "v1.jsonl").episodes:
            w.write(ep)
    records, _ = read_records(path)
    assert {r["schema_version"] for _, r in records} == {SCHEMA_VERSION}
    report = read_episodes(path)
    assert report.upgraded == {} and report.notes() == []
    again = {e.id: _view(e) for e in report.episodes}
    assert again == {e.id: _view(e) for e in read_episodes(FIXTURES / "v4.jsonl").episodes}


def test_a_newer_or_malformed_version_is_one_bad_line_and_the_rest_is_kept(tmp_path):
    path = tmp_path / "mixed.jsonl"
    shutil.copy(FIXTURES / "v4.jsonl", path)
    good = json.loads((FIXTURES / "v4.jsonl").read_text().splitlines()[0])
    with path.open("a") as fh:
        fh.write(json.dumps({**good, "id": "future", "schema_version": SCHEMA_VERSION + 1}) + "\n")
        fh.write(json.dumps({**good, "id": "odd", "schema_version": "two"}) + "\n")
        fh.write("[1, 2]\n")
    report = read_episodes(path)
    assert len(report.episodes) == 5
    assert [e.line_no for e in report.errors] == [6, 7, 8]
    assert "newer than this turngym understands" in report.errors[0].reason
    assert "positive integer" in report.errors[1].reason
    assert "JSON object" in report.errors[2].reason
    with pytest.raises(ValueError, match=r"mixed.jsonl:6: episode schema_version 5 is newer"):
        read_episodes(path, strict=True)


def test_an_old_episode_of_an_env_that_is_not_registered_is_left_as_it_is(tmp_path):
    record = {**json.loads((FIXTURES / "v1.jsonl").read_text().splitlines()[0]), "env_id": "lab/Unknown-v0"}
    (tmp_path / "old.jsonl").write_text(json.dumps(record) + "\n")
    report = read_episodes(tmp_path / "old.jsonl")
    assert report.episodes[0].reward_needs is None and report.upgraded == {}
    assert all(not t.truth for t in report.episodes[0].turns)


def test_the_record_cannot_change_without_a_new_version():
    assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION)), "one migration from every past version"
    assert all(MIGRATIONS[v].to_version == v + 1 for v in MIGRATIONS)
    now = {cls.__name__: [f.name for f in dataclasses.fields(cls)] for cls in (Episode, Turn, RewardNeeds)}
    assert RECORD_FIELDS.get(SCHEMA_VERSION) == now, (
        "the episode record changed: bump SCHEMA_VERSION, add the migration from the old version to "
        "turngym.episode.migrations.MIGRATIONS, a fixture file of the old version, and its fields here")


def test_only_the_reader_reads_episode_files():
    """Every command reads episodes through turngym.episode.reader: the file layer is called nowhere else."""
    import re

    root = Path(__file__).parents[1]
    file_layer = re.compile(r"from turngym\.episode(?:\.reader)? import (?:\([^)]*|[^\n]*)\bread_records\b|\.read_records\(")
    callers = sorted(str(p.relative_to(root)) for folder in ("turngym", "benchmarks") for p in (root / folder).rglob("*.py")
                     if file_layer.search(p.read_text()))
    assert callers == ["turngym/episode/__init__.py"]  # its package's exports; turngym.episode.reader defines it
