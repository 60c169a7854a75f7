"""Intervals and report plots on edge values: 0, 1, n = 1, n = 10,000, all-zero comparisons."""

import json
import math
import re

import pytest

from turngym.episode import Episode, Turn
from turngym.evals.harness import EvalSpec, summarise, write_results
from turngym.grading.metrics import bootstrap_mean, outcome_metrics, rate, wilson
from turngym.views.report import (
    compare_runs,
    credit_figure,
    credit_heatmap,
    integer_ticks,
)


def episodes(correct, k=1, turns=2):
    return [Episode(id=f"e{i}", env_id="turngym/MathCode-v0", group=f"q{i // k}", task={"dataset": "d"},
                    turns=[Turn(index=t, action="x") for t in range(turns)], final_answer="1",
                    outcome={"correct": float(c)}, meta={"wall_ms": 10.0}) for i, c in enumerate(correct)]


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (0, 2), (0, 300), (300, 300), (0, 10_000), (10_000, 10_000), (3, 7)])
def test_wilson_matches_scipy_and_contains_the_value(k, n):
    from scipy.stats import binomtest

    est = wilson(k, n)
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert est.low <= est.value <= est.high and est.high > est.low  # never zero-width: n >= 1 always leaves doubt
    assert est.low == pytest.approx(ref.low, abs=1e-12) and est.high == pytest.approx(ref.high, abs=1e-12)
    assert (est.low == 0.0) == (k == 0) and (est.high == 1.0) == (k == n)


def test_one_rule_for_rates_and_undefined_rather_than_false_zero_width():
    two_failures = outcome_metrics(episodes([0, 0]))
    # accuracy and pass@1 are the same quantity here, so they get the same interval
    assert two_failures["accuracy"]["ci95"] == two_failures["pass@1"]["ci95"]
    assert two_failures["accuracy"]["ci95"][1] == pytest.approx(0.6576, abs=1e-3)
    k4 = outcome_metrics(episodes([1, 0, 0, 0, 1, 1, 0, 1], k=4), k=2)
    assert k4["pass@1"]["ci"] == "bootstrap BCa" and k4["pass@2"]["n"] == 2
    one = bootstrap_mean([0.5])
    assert one.n == 1 and math.isnan(one.low) and "one unit" in one.ci
    flat = bootstrap_mean([2.0] * 50)
    assert math.isnan(flat.high) and "all values equal" in flat.ci
    assert rate([0.5, 0.5], binary=False).ci.startswith("no interval") and rate([1.0], binary=True).ci == "wilson"
    with pytest.raises(ValueError, match="0 or 1"):
        rate([0.5], binary=True)
    spread = bootstrap_mean([0.1, 0.9, 0.4, 0.7])
    assert spread.low < spread.value < spread.high
    assert math.isnan(rate([], binary=True).value) and math.isnan(rate([], binary=False).value)
    with pytest.raises(ValueError, match="whole number"):
        wilson(1.5, 3)


def test_the_task_is_the_unit_when_tasks_have_several_samples():
    # 4 tasks x K = 3 samples: accuracy must not count 12 independent episodes (pseudo-replication)
    k3 = outcome_metrics(episodes([1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 1, 0], k=3), k=3)
    assert k3["accuracy"] == k3["pass@1"]
    assert k3["accuracy"]["n"] == 4 and k3["accuracy"]["ci"] == "bootstrap BCa"
    assert k3["accuracy"]["value"] == pytest.approx(0.5)
    # the method follows the metric, not the data: per-task fractions that happen to be 0 or 1 stay bootstrap
    same = outcome_metrics(episodes([1, 1, 0, 0, 1, 1, 0, 0], k=2), k=1)
    assert same["accuracy"]["ci"] == same["pass@1"]["ci"] == "bootstrap BCa" and same["accuracy"]["n"] == 4
    # one sample per task: episodes are the units and a binary score gets Wilson, for accuracy and pass@1 alike
    k1 = outcome_metrics(episodes([1, 0, 1, 1]))
    assert k1["accuracy"] == k1["pass@1"] and k1["accuracy"]["ci"] == "wilson" and k1["accuracy"]["n"] == 4
    # F1 is fractional by definition: bootstrap even when every episode scores 0 or 1; EM is binary: Wilson
    qa = episodes([1, 0, 1])
    for e in qa:
        e.outcome = {"em": e.outcome["correct"], "f1": e.outcome["correct"]}
    qm = outcome_metrics(qa)
    assert qm["f1"]["ci"] == "bootstrap BCa" and qm["em"]["ci"] == "wilson"


@pytest.mark.parametrize("correct", [[0] * 300, [1] * 300, [1], [0], [1, 0] * 5000])
def test_eval_report_is_written_on_edge_values(tmp_path, correct):
    eps = episodes(correct)
    res = summarise(eps, EvalSpec(env_id="turngym/MathCode-v0"), {"dataset": "d", "indices": list(range(len(eps)))}, 1.0)
    write_results(res, eps, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "Gemma 3 270M" in text and "split ``" not in text and "sha256 ``" not in text
    assert (tmp_path / "metrics.png").stat().st_size > 0 and (tmp_path / "behaviour.png").stat().st_size > 0
    acc = json.loads((tmp_path / "results.json").read_text())["metrics"]["accuracy"]
    assert acc["ci95"][0] <= acc["value"] <= acc["ci95"][1]


def test_comparison_and_credit_maps_draw_all_zero_values(tmp_path):
    import matplotlib.image as mpimg

    for name, correct in (("zero", [0, 0, 0]), ("one", [1, 1, 1])):
        eps = episodes(correct)
        write_results(summarise(eps, EvalSpec(env_id="turngym/MathCode-v0"), {"dataset": "d"}, 1.0), eps,
                      (tmp_path / name).mkdir() or tmp_path / name)
    compare_runs([tmp_path / "zero", tmp_path / "one"], tmp_path / "cmp.md")
    img = mpimg.imread(tmp_path / "cmp.png")[..., :3]
    # the all-zero run's bars are drawn: its colour (C0 blue) appears in the plot area
    blue = (abs(img[..., 0] - 0.12) < 0.08) & (abs(img[..., 1] - 0.47) < 0.08) & (abs(img[..., 2] - 0.71) < 0.08)
    assert blue.sum() > 20
    credit_heatmap({"a": [[0.0, 0.0], [0.0]], "b": [[1.0, -2.0], [0.5]]}, tmp_path / "maps.png")
    credit_heatmap({"a": [[0.0]]}, tmp_path / "one.png")
    assert (tmp_path / "maps.png").exists() and (tmp_path / "one.png").exists()


def tick_labels(axis):
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


@pytest.mark.parametrize("rows,width", [(1, 1), (1, 3), (2, 1), (5, 7), (32, 20), (40, 2)])
def test_credit_maps_tick_whole_episodes_and_turns_and_say_what_is_cut(rows, width):
    import matplotlib.pyplot as plt

    rewards = {"a": [[0.1 * i] + [0.2] * (width - 1) for i in range(rows)],
               "b": [[-1.0] * width for _ in range(rows)]}
    fig = credit_figure(rewards)
    fig.canvas.draw()
    for ax in fig.axes[:2]:  # the two panels (the third axes is the colour bar)
        xs, ys = tick_labels(ax.xaxis), tick_labels(ax.yaxis)
        assert xs and ys and all(re.fullmatch(r"[1-9][0-9]*", t) for t in xs + ys), (xs, ys)
        assert xs[0] == "1" and ys[0] == "1" and int(xs[-1]) <= width and int(ys[-1]) <= min(rows, 32)
    title = fig._suptitle.get_text() if fig._suptitle else ""
    assert (title == f"first 32 of {rows} episodes shown") == (rows > 32) and (rows > 32 or not title)
    plt.close(fig)
    assert integer_ticks(1, 8) == [1] and integer_ticks(20, 8) == [1, 4, 7, 10, 13, 16, 19]
    assert integer_ticks(8, 8) == list(range(1, 9)) and integer_ticks(10, 8) == [1, 3, 5, 7, 9]


def test_report_names_the_model_that_played_the_episodes(tmp_path):
    eps = episodes([1, 0])
    for e in eps:
        e.meta["model"] = "org/some-model-7b"
    res = summarise(eps, EvalSpec(env_id="turngym/MathCode-v0"), {"dataset": "d"}, 1.0)
    assert res["model"] == "org/some-model-7b"  # not the spec's "default" when a policy object played
    write_results(res, eps, tmp_path)
    assert "model: `org/some-model-7b`" in (tmp_path / "report.md").read_text()
