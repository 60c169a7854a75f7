"""The BFCL V4 overall score against bfcl-eval's own leaderboard aggregation."""

from __future__ import annotations

import csv
import importlib
import random
import types

import pytest

from turngym.envs.bfcl.data import load_category
from turngym.envs.bfcl.score import V4_COUNTS, bfcl_metrics, v4_summary
from turngym.envs.bfcl.upstream import bfcl
from turngym.episode import Episode


def _leaderboard_overall(accuracy: dict[str, float], tmp_path, monkeypatch) -> dict[str, str]:
    bfcl()
    helper = importlib.import_module("bfcl_eval.eval_checker.eval_runner_helper")
    config = types.SimpleNamespace(display_name="turngym-score", url="", org="", license="", input_price=None,
                                   output_price=None, is_fc_model=False, underscore_to_dot=False)
    monkeypatch.setitem(helper.MODEL_CONFIG_MAPPING, "turngymscore", config)
    table = {"turngymscore": {c: {"accuracy": a, "total_count": V4_COUNTS[c]} for c, a in accuracy.items()}}
    helper.generate_leaderboard_csv(table, tmp_path)
    with open(tmp_path / "data_overall.csv") as fh:
        return next(csv.DictReader(fh))


def _pct(cell: str) -> float:
    return float(cell.rstrip("%")) / 100


@pytest.mark.parametrize("seed,drop", [(0, ()), (1, ("web_search_base", "memory_kv", "memory_vector", "memory_rec_sum",
                                                       "web_search_no_snippet", "live_parallel", "simple_java"))])
def test_v4_overall_equals_bfcl_eval_leaderboard(tmp_path, monkeypatch, seed, drop):
    rng = random.Random(seed)
    accuracy = {c: rng.random() for c in V4_COUNTS if c not in drop}
    row = _leaderboard_overall(accuracy, tmp_path, monkeypatch)
    ours = v4_summary(accuracy)
    assert ours["overall_v4"] == pytest.approx(_pct(row["Overall Acc"]), abs=6e-5)
    for group, column in (("multi_turn", "Multi Turn Acc"), ("live", "Live Acc"), ("non_live", "Non-Live AST Acc"),
                          ("irrelevance", "Irrelevance Detection")):
        if row[column] != "N/A":  # bfcl-eval shows N/A for a group with a category missing
            assert ours["groups"][group] == pytest.approx(_pct(row[column]), abs=6e-5), group
    assert sorted(ours["missing"]) == sorted(drop)


def test_v4_counts_match_the_bfcl_data():
    for category, n in V4_COUNTS.items():
        if category.startswith("web_search") or category == "memory_vector":
            continue
        assert len(load_category(category)) == n, category


def test_bfcl_metrics_from_episodes():
    eps = [Episode(id=f"e{i}", env_id="turngym/BFCL-v0", task={"id": f"{cat}_{i // 2}"},
                   outcome={"bfcl_valid": i % 2 == 0, "category": cat})
           for i, cat in enumerate(["multi_turn_base"] * 4 + ["simple_python"] * 2)]
    m = bfcl_metrics(eps)
    assert m["per_category"]["multi_turn_base"]["value"] == 0.5
    assert m["per_category"]["simple_python"]["value"] == 0.5
    assert m["groups"]["multi_turn"] == pytest.approx(0.5 / 4)
    assert m["groups"]["non_live"] == pytest.approx(0.5 / 3 / 4)
    assert m["overall_v4"] == pytest.approx(0.3 * 0.125 + 0.1 * 0.5 / 12)
    assert m["partial_categories"] == {"multi_turn_base": 2, "simple_python": 1}
    assert m["episodes_per_category"] == {"multi_turn_base": 4, "simple_python": 2}
    assert bfcl_metrics([Episode(id="x", env_id="e", outcome={"correct": True})]) == {}


def test_bfcl_categories_are_defined_once():
    """The env, the scorer and the lm-eval bridge use the one category table."""
    from turngym.envs.bfcl import categories, data
    from turngym.envs.bfcl import score as bfcl_score
    from turngym.integrations import lm_eval_bridge

    assert data.CATEGORIES is categories.CATEGORIES and bfcl_score.V4_COUNTS is categories.V4_COUNTS
    leaderboard = set(categories.V4_COUNTS)
    playable = set(categories.CATEGORIES) - set(categories.MEMORY_PREREQ)
    assert leaderboard == playable | (set(categories.REFUSED) - {"format_sensitivity"})
    assert {n for n, e in lm_eval_bridge.ENV_FOR.items() if e == "turngym/BFCL-v0"} == \
        {"bfcl_" + c for c in categories.CONVERSATION_CATEGORIES}
