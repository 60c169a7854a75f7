"""The viewer's comparison features in headless Chromium: per-reward colour scales, the group grid, run
metrics, sorting and filtering by disagreement, deep links, two runs side by side, where a reward most
disagrees with the per-turn truth, and one item followed across training steps."""

import pytest

from test_viewer import browser, open_page  # noqa: F401 - the Chromium fixture and page opener
from turngym.episode import Episode, EpisodeWriter, Turn
from turngym.grading.metrics import outcome_metrics
from turngym.training.rollouts import RolloutSaver
from turngym.training.scores import ScoreRecord, write_scores
from turngym.truth import TruthValue
from turngym.views.viewer import write_viewer

N_GROUPS = 24  # more than a page (20 groups), so deep links must change page


def episode(g, k, hit, correct, *, task_key=None, run_tag=""):
    answer = "Paris" if correct else "Lyon"
    turns = [Turn(index=0, action=f"<search>q{g}</search>", observation="doc", truth={"hit": TruthValue(hit, "env")}),
             Turn(index=1, action=f"<answer>{answer}</answer>")]
    return Episode(id=f"{run_tag}g{g}#{k}", env_id="turngym/SearchQA-v0", group=f"{run_tag}g{g}",
                   task={"question": f"question {g}?", "answers": ["Paris"], "dataset": "nq"}, turns=turns,
                   final_answer=answer, outcome={"em": float(correct)}, terminated=True,
                   meta={"task_key": task_key if task_key is not None else str(g)})


def write(tmp_path, name, eps, rewards):
    path = tmp_path / f"{name}.jsonl"
    with EpisodeWriter(path, fsync=False) as w:
        w.write_all(eps)
    scores = tmp_path / f"{name}.scores.jsonl"
    write_scores(scores, [ScoreRecord(e.id, w, r[i]) for w, r in rewards.items() for i, e in enumerate(eps)])
    return path, scores


@pytest.fixture
def one_run(tmp_path):
    """24 groups of 2; outcome pays the answer turn (0/1); siop is small except two turns: -8.18 on g3#0's
    answer (which outcome pays 1: the largest disagreement) and -4 on g5#1's search turn (a hit: the turn siop
    most disagrees with the truth on)."""
    eps = [episode(g, k, hit=(g + k) % 2 == 0, correct=(g + k) % 3 == 0) for g in range(N_GROUPS) for k in range(2)]
    siop = [[0.1, 0.05] for _ in eps]
    by_id = {e.id: i for i, e in enumerate(eps)}
    siop[by_id["g3#0"]][1] = -8.18
    siop[by_id["g5#1"]][0] = -4.0
    assert eps[by_id["g3#0"]].outcome["em"] == 1.0 and eps[by_id["g5#1"]].turns[0].truth["hit"].value is True
    outcome = [[0.0, e.outcome["em"]] for e in eps]
    path, scores = write(tmp_path, "run", eps, {"outcome": outcome, "siop": siop})
    return eps, write_viewer(path, tmp_path / "view.html", scores_path=scores)


def shown_ids(page):
    return page.locator("section.episode").evaluate_all("s => s.map(x => x.dataset.id)")


def test_each_reward_has_its_own_colour_scale(browser, one_run):  # noqa: F811
    eps, html = one_run
    page, problems = open_page(browser, html)
    chip = page.locator("section.episode[data-id='g0#0'] .chip[data-reward='outcome']").nth(1)
    assert chip.get_attribute("data-value") == "1"
    # 1.0 is the top of outcome's own 0-1 scale: full red, not washed out by siop's 8.18
    assert chip.evaluate("c => getComputedStyle(c).backgroundColor") == "rgb(178, 24, 43)"
    assert "±1.000" in chip.get_attribute("title")
    siop = page.locator("section.episode[data-id='g0#0'] .chip[data-reward='siop']").first
    assert siop.evaluate("c => getComputedStyle(c).backgroundColor") != "rgb(178, 24, 43)"  # 0.1 of 8.18: pale
    legend = page.locator("#legend").inner_text()
    assert "outcome reward" in legend and "+8.180" in legend and "+1.000" in legend
    assert problems == []


def test_group_grid_run_metrics_and_deep_links(browser, one_run):  # noqa: F811
    eps, html = one_run
    page, problems = open_page(browser, html)
    assert page.locator("table.grid").count() == 0  # grids are built when opened
    page.locator("article.group[data-group='g0'] details.gridbox summary").click()
    grid = page.locator("article.group[data-group='g0'] table.grid[data-reward='siop']")
    grid.wait_for()  # built on the toggle event, after the click returns
    assert grid.locator("tr").count() == 1 + 2  # header + one row per episode
    assert grid.locator("a.cell").evaluate_all("cs => cs.map(c => Number(c.dataset.value))") == [0.1, 0.05, 0.1, 0.05]
    # run metrics on the page, with the interval the report gives
    m = outcome_metrics(eps)["em"]
    lo, hi = m["ci95"]
    assert f"em {m['value']:.3f} [{lo:.3f}, {hi:.3f}] (n={m['n']})" in page.locator("#metrics").inner_text()
    # a grid cell links to its turn
    outcome_grid = page.locator("article.group[data-group='g0'] table.grid[data-reward='outcome']")
    outcome_grid.locator("a.cell[data-ep='g0#1'][data-turn='1']").click()
    page.wait_for_selector("section.episode[data-id='g0#1'] li.turn[data-turn='1'].target")
    assert page.evaluate("location.hash") == "#ep=g0%231&t=1"
    page.close()
    # a link into page 2 opens there, with the turn marked
    page = browser.new_page()
    page.goto(html.as_uri() + "#ep=g22%230&t=0")
    page.wait_for_selector("section.episode[data-id='g22#0'] li.turn[data-turn='0'].target")
    assert page.locator("#page").inner_text() == "page 2 of 2"
    # a link to an episode the filters hide clears them
    page.select_option("#f-oc", "incorrect")
    page.evaluate("location.hash = '#ep=g0%230&t=1'")
    page.wait_for_selector("section.episode[data-id='g0#0'] li.turn[data-turn='1'].target")
    assert page.locator("#f-oc").input_value() == ""
    assert problems == []


def test_sort_and_filter_by_disagreement_and_truth(browser, one_run):  # noqa: F811
    _, html = one_run
    page, problems = open_page(browser, html)
    assert page.locator("article.group").first.get_attribute("data-group") == "g0"
    page.select_option("#f-sort", "dis")
    page.wait_for_function("document.querySelector('article.group').dataset.group === 'g3'")
    assert page.locator("section.episode[data-id='g3#0'] .badge.dis").inner_text() == "disagreement 2.00"
    page.fill("#f-dmin", "1.5")
    page.dispatch_event("#f-dmin", "change")
    page.wait_for_function("document.querySelectorAll('section.episode').length === 1")
    assert shown_ids(page) == ["g3#0"]
    page.fill("#f-dmin", "0")
    page.dispatch_event("#f-dmin", "change")
    page.select_option("#f-sort", "truth")
    page.wait_for_function("document.querySelector('article.group').dataset.group === 'g5'")
    # the truth panel lists siop's worst turn first, linked
    page.locator("#truth-panel summary").click()
    first = page.locator("#truth-panel ol[data-reward='siop'] li").first
    assert first.get_attribute("data-ep") == "g5#1" and first.get_attribute("data-turn") == "0"
    assert "truth ✓" in first.inner_text()
    first.locator("a").click()
    page.wait_for_selector("section.episode[data-id='g5#1'] li.turn[data-turn='0'].target")
    assert problems == []


def test_two_runs_side_by_side_on_the_same_items(browser, tmp_path):  # noqa: F811
    a = [episode(g, k, hit=True, correct=k == 0) for g in range(3) for k in range(2)]
    b = [episode(g, k, hit=True, correct=(g != 1 and k == 0) or (g == 1)) for g in range(3) for k in range(2)]
    assert [e.id for e in a] == [e.id for e in b]  # two evals of one subset: the same ids
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    pa, sa = write(tmp_path / "a", "episodes", a, {"outcome": [[0.0, e.outcome["em"]] for e in a]})
    pb, sb = write(tmp_path / "b", "episodes", b, {"outcome": [[0.0, e.outcome["em"]] for e in b]})
    html = write_viewer(pa, tmp_path / "view.html", scores_path=sa, compare_path=pb, compare_scores_path=sb)
    page, problems = open_page(browser, html)
    assert page.locator("#metrics .run-metrics").count() == 2
    assert "b: 6 episodes" in page.locator("#metrics .run-metrics[data-run='1']").inner_text()
    page.select_option("#f-view", "side")
    page.wait_for_selector("article.group.side")
    cards = page.locator("article.group.side")
    assert cards.count() == 3
    for n in range(3):
        cols = cards.nth(n).locator(".col")
        assert cols.count() == 2
        assert cols.nth(0).locator("section.episode").evaluate_all("s => s.map(x => x.dataset.id)") == [f"g{n}#0", f"g{n}#1"]
        assert cols.nth(1).locator("section.episode").evaluate_all("s => s.map(x => x.dataset.id)") == [f"b:g{n}#0", f"b:g{n}#1"]
    page.select_option("#f-sort", "runs")  # the item where the runs differ most comes first
    page.wait_for_function("document.querySelector('article.group.side h2').textContent === 'question 1?'")
    assert "outcome a 0.500 vs b 1.000" in cards.first.locator(".gmeta").inner_text()
    chips = cards.first.locator(".col[data-run='1'] .chip[data-reward='outcome']")
    assert chips.evaluate_all("cs => cs.map(c => Number(c.dataset.value))") == [0.0, 1.0, 0.0, 1.0]  # b's own scores
    assert problems == []


def test_following_one_item_across_training_steps(browser, tmp_path):  # noqa: F811
    saver = RolloutSaver(tmp_path / "rollouts", 1, "outcome", "turn")
    for step in range(3):
        eps = [episode(g, k, hit=True, correct=(step + k) % 2 == 0, task_key=str(g), run_tag=f"step{step}-call1|")
               for g in range(2) for k in range(2)]
        rewards = [[0.0, e.outcome["em"]] for e in eps]
        saver.save(step, eps, rewards, [[r[1] - 0.5, r[1] - 0.5] for r in rewards], k=2)
    html = write_viewer(tmp_path / "rollouts" / "episodes.jsonl", tmp_path / "view.html",
                        scores_path=tmp_path / "rollouts" / "scores.jsonl")
    page, problems = open_page(browser, html)
    assert page.locator("#metrics table.steps tr[data-step]").count() == 3
    assert page.locator("section.episode[data-id='step0-call1|g1#0'] .badge.step").inner_text() == "step 0"
    page.locator("section.episode[data-id='step0-call1|g1#0'] .followbtn").click()
    page.wait_for_function("document.querySelectorAll('section.episode').length === 6")
    assert shown_ids(page) == [f"step{s}-call1|g1#{k}" for s in range(3) for k in range(2)]
    assert "following one item" in page.locator("#f-qk").inner_text()
    page.locator("#f-qk-clear").click()
    page.wait_for_function("document.querySelectorAll('section.episode').length === 12")
    assert problems == []
