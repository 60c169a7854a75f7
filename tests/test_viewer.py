"""The HTML episode viewer: its embedded data, its scores file, and what a real Chromium renders.

The browser tests drive the system Chromium (Debian package ``chromium``, installed by
scripts/setup.sh when run as root) with Playwright; they skip, saying why, only where no
Chromium can be found or installed.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from turngym.episode import Episode, EpisodeWriter, Turn
from turngym.training.scores import ScoreRecord, ScoresFileError, read_scores, write_scores
from turngym.truth import TruthValue
from turngym.views.viewer import ViewerError, write_viewer

HOSTILE = "</script><script>window.__pwned = 1</script><!--"


def search_episode(i, group, answer, hits, gold="Paris", dataset="nq"):
    turns = [Turn(index=t, action=f"<search>q{t} of {i}</search>", tool_calls=[{"name": "search", "arguments": {"q": f"q{t}"}}],
                  observation=("Paris is the capital" if h else "nothing here") + ("\n... [output truncated]" if t == 0 else ""),
                  truth={"retrieval_hit": TruthValue(h, "env")}) for t, h in enumerate(hits)]
    turns.append(Turn(index=len(hits), action=f"<answer>{answer}</answer>"))
    return Episode(id=f"s{i}", env_id="turngym/SearchQA-v0", group=group,
                   task={"question": f"capital of {group}?", "answers": [gold], "dataset": dataset},
                   prompt=[{"role": "user", "content": f"capital of {group}?"}], turns=turns, final_answer=answer,
                   outcome={"em": float(answer == gold), "f1": float(answer == gold)}, terminated=True,
                   meta={"model": "nowhere/no-such-model"})


def hand_made():
    eps = [search_episode(0, "g1", "Paris", [True, False]), search_episode(1, "g1", "Lyon", [False]),
           search_episode(2, "g1", "Paris", []), search_episode(3, "g2", "Rome", [False, False, True], gold="Rome",
                                                                  dataset="hotpotqa"),
           search_episode(4, "g2", None, [True])]
    eps[1].turns[0].action = HOSTILE  # must show as text, never run
    eps[4].turns[-1].action = "I give up"
    eps[4].truncated, eps[4].terminated = True, False
    return eps


def rewards_of(eps, name):
    """Distinct hand-picked per-turn rewards: ``outcome`` pays the final turn, ``hits`` each turn's value."""
    if name == "outcome":
        return [[0.0] * (len(e.turns) - 1) + [e.outcome["em"]] for e in eps]
    return [[round(0.25 * (k + 1) - 0.5 * (i % 2), 3) for k in range(len(e.turns))] for i, e in enumerate(eps)]


@pytest.fixture
def viewer_files(tmp_path):
    eps = hand_made()
    path = tmp_path / "episodes.jsonl"
    with EpisodeWriter(path) as w:
        w.write_all(eps)
    records = [ScoreRecord(e.id, name, r, {"turn": [x * 2 for x in r]} if name == "outcome" else {},
                           "grpo" if name == "hits" else None)
               for name in ("outcome", "hits") for e, r in zip(eps, rewards_of(eps, name), strict=True)]
    ablation = tmp_path / "ablation"
    ablation.mkdir()
    write_scores(ablation / "scores.jsonl", records[:len(eps)])
    write_scores(tmp_path / "more.jsonl", records[len(eps):])
    out = write_viewer(path, tmp_path / "view.html", ablation_dir=ablation, scores_path=tmp_path / "more.jsonl")
    return eps, out


def payload(html_path):
    text = html_path.read_text()
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))


def test_viewer_embeds_exactly_the_files_turns_and_rewards(viewer_files):
    eps, out = viewer_files
    d = payload(out)
    assert [e["id"] for e in d["eps"]] == [e.id for e in eps]
    for row, ep in zip(d["eps"], eps, strict=True):
        assert [t["a"] for t in row["t"]] == [t.action for t in ep.turns]
        assert [t["o"] for t in row["t"]] == [t.observation for t in ep.turns]
        assert [t["gt"] for t in row["t"]] == [float(t.truth["retrieval_hit"].value) if t.truth else None for t in ep.turns]
    assert d["rewards"] == ["outcome", "hits"]
    assert d["r"]["outcome"] == rewards_of(eps, "outcome") and d["r"]["hits"] == rewards_of(eps, "hits")
    assert d["adv"]["outcome"]["turn"] == [[x * 2 for x in r] for r in rewards_of(eps, "outcome")]
    from turngym.training.advantages import grpo
    g1 = grpo(rewards_of(eps, "hits")[:3])
    assert d["adv"]["hits"]["grpo"][:3] == g1  # computed per group with the named estimator
    assert [g["eps"] for g in d["groups"]] == [[0, 1, 2], [3, 4]]
    assert [(e["cl"], e["clk"]) for e in d["eps"]] == [("A", "largest"), ("B", "other"), ("A", "largest"),
                                                       ("A", "largest"), ("", "none")]
    assert [e["oc"] for e in d["eps"]] == ["correct", "incorrect", "correct", "correct", "incorrect"]
    assert d["eps"][0]["t"][0]["ot"] is True and d["eps"][0]["t"][1]["ot"] is False
    assert d["tokenizer"]["status"] == "none"
    assert HOSTILE not in out.read_text()  # no raw </script> from the data reaches the page


def test_any_string_and_non_finite_metrics_reach_the_page_as_valid_json(tmp_path):
    from turngym.views.viewer import render_viewer

    ep = hand_made()[0]
    ep.turns[0].action = "lone \ud800 surrogate, emoji \U0001F600, nul \x00, " + HOSTILE
    ep.turns[0].metrics["score"] = float("nan")
    ep.outcome["f1"] = float("inf")
    d = payload(render_viewer([ep], tmp_path / "v.html"))
    assert d["eps"][0]["t"][0]["a"] == ep.turns[0].action
    assert d["eps"][0]["t"][0]["m"]["score"] == "nan" and d["eps"][0]["out"]["f1"] == "inf"
    (tmp_path / "v.html").read_text(encoding="utf-8")  # the file is valid UTF-8


def test_scores_errors_are_clear(tmp_path, viewer_files):
    ep_path = tmp_path / "episodes.jsonl"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"episode_id": "s0", "reward": "x", "turn_rewards": [1.0]}) + "\n")
    with pytest.raises(ViewerError, match="gives 1 turn rewards for episode 's0', which has 3 turns"):
        write_viewer(ep_path, tmp_path / "v.html", scores_path=bad)
    bad.write_text(json.dumps({"episode_id": "nope", "reward": "x", "turn_rewards": []}) + "\n")
    with pytest.raises(ViewerError, match="not in the episodes file"):
        write_viewer(ep_path, tmp_path / "v.html", scores_path=bad)
    bad.write_text('{"episode_id": "s0", "reward": "x", "turn_rewards": [NaN, 1, 2]}\n')
    with pytest.raises(ScoresFileError, match="bad.jsonl:1 turn_rewards: values must be finite"):
        read_scores(bad)
    bad.write_text('{"episode_id": "s0", "reward": "x", "turn_rewards": [0, 1, 2], "estimator": "nope"}\n')
    with pytest.raises(ScoresFileError, match="unknown estimator 'nope'"):
        read_scores(bad)
    with pytest.raises(FileNotFoundError, match="no scores.jsonl"):
        write_viewer(ep_path, tmp_path / "v.html", ablation_dir=tmp_path)
    cli = subprocess.run([sys.executable, "-m", "turngym.cli", "view", str(ep_path), "--scores", str(bad),
                          "--out", str(tmp_path / "v.html")], capture_output=True, text=True, timeout=120)
    assert cli.returncode != 0 and "unknown estimator" in cli.stderr and "Traceback" not in cli.stderr


def test_ablate_saves_per_turn_scores_and_writes_a_linked_viewer(tmp_path):
    from turngym.credit.ablate import ablate
    from turngym.rewards import get_reward

    eps = hand_made()
    ablate(eps, {"outcome": get_reward("outcome"), "ttrl": get_reward("ttrl")}, tmp_path)
    recs = read_scores(tmp_path / "scores.jsonl")
    assert {(r.episode_id, r.reward) for r in recs} == {(e.id, n) for e in eps for n in ("outcome", "ttrl")}
    by = {(r.episode_id, r.reward): r for r in recs}
    assert by[("s3", "outcome")].turn_rewards == [0.0, 0.0, 0.0, 1.0]
    from turngym.training.advantages import ESTIMATORS, get_estimator

    beyond = {n for n in ESTIMATORS if get_estimator(n).needs != {"rewards"}}  # declared: states, branches, entropy
    assert beyond == {"egpo", "gigpo", "vine"}
    assert set(by[("s3", "outcome")].advantages) == ESTIMATORS.keys() - beyond
    assert "(view.html)" in (tmp_path / "ablation.md").read_text()
    assert payload(tmp_path / "view.html")["r"]["ttrl"][0] == by[("s0", "ttrl")].turn_rewards


def test_egpo_from_rewards_alone_is_labelled_as_its_base_advantage(tmp_path):
    from turngym.training.advantages import egpo, grpo

    eps = hand_made()
    path = tmp_path / "episodes.jsonl"
    with EpisodeWriter(path) as w:
        w.write_all(eps)
    rewards = rewards_of(eps, "hits")
    write_scores(tmp_path / "s.jsonl", [ScoreRecord(e.id, "hits", r, {}, "egpo") for e, r in zip(eps, rewards, strict=True)])
    d = payload(write_viewer(path, tmp_path / "v.html", scores_path=tmp_path / "s.jsonl"))
    assert d["adv"]["hits"]["egpo"][:3] == egpo(rewards[:3]) == grpo(rewards[:3], eps=1e-6)
    assert d["partial_estimators"] == ["egpo"]
    assert any(n.startswith("egpo advantages here come from the rewards alone") and "entropies" in n for n in d["notes"])


def test_token_view_decodes_with_the_episodes_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from turngym.agents.tiny import tiny_model_dir

    model = str(tiny_model_dir(chat=True))
    tok = AutoTokenizer.from_pretrained(model)
    ep = hand_made()[0]
    ep.meta["model"] = model
    ep.prompt_ids = tok("capital?", add_special_tokens=False)["input_ids"]
    ep.turns[0].action_ids = tok("<search>x</search>", add_special_tokens=False)["input_ids"]
    ep.turns[0].observation_ids = tok("Paris", add_special_tokens=False)["input_ids"]
    path = tmp_path / "e.jsonl"
    with EpisodeWriter(path) as w:
        w.write(ep)
    d = payload(write_viewer(path, tmp_path / "v.html"))
    assert d["tokenizer"]["status"] == "decoded" and "not checked" in d["tokenizer"]["note"]
    assert "".join(d["vocab"][str(i)] for i in ep.turns[0].action_ids) == tok.decode(ep.turns[0].action_ids)
    # the recorded fingerprint is compared with the tokenizer that loads: a match decodes, a mismatch shows ids
    from turngym.agents.tokenization import tokenizer_fingerprint

    fp = tokenizer_fingerprint(tok)
    for name, recorded, status in (("same", fp, "decoded"), ("other", {**fp, "vocab_sha256": "0" * 16}, "ids")):
        ep.meta["tokenizer"] = recorded
        with EpisodeWriter(tmp_path / f"{name}.jsonl") as w:
            w.write(ep)
        d = payload(write_viewer(tmp_path / f"{name}.jsonl", tmp_path / f"{name}.html"))
        assert d["tokenizer"]["status"] == status, d["tokenizer"]
    assert "not the one that produced the ids (vocab_sha256 differ" in d["tokenizer"]["note"] and not d["vocab"]
    second = hand_made()[1]
    second.prompt_ids, second.meta = [1, 2], {"model": model, "tokenizer": fp}
    with EpisodeWriter(tmp_path / "mixed.jsonl") as w:
        w.write_all([ep, second])
    d = payload(write_viewer(tmp_path / "mixed.jsonl", tmp_path / "mixed.html"))
    assert d["tokenizer"]["status"] == "ids" and "2 different tokenizers" in d["tokenizer"]["note"]
    ep.meta.pop("tokenizer")
    ep.meta["model"] = "nowhere/no-such-model"
    with EpisodeWriter(tmp_path / "f.jsonl") as w:
        w.write(ep)
    d = payload(write_viewer(tmp_path / "f.jsonl", tmp_path / "w.html"))
    assert d["tokenizer"]["status"] == "ids" and "does not load offline" in d["tokenizer"]["note"] and not d["vocab"]


# --------------------------------------------------------------------------- real browser


def chromium_path():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="module")
def browser():
    must_run = os.geteuid() == 0 or bool(os.environ.get("CI"))  # CI runs as root, and set-up installs both
    path = chromium_path()
    if path is None:
        if must_run:
            pytest.fail("no Chromium found: scripts/setup.sh installs the Debian package `chromium` (run it as root)")
        pytest.skip("no Chromium and not root: install it with `sudo apt-get install -y chromium`, then rerun")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        (pytest.fail if must_run else pytest.skip)("Playwright is missing: pip install -e '.[test]'")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield b
        b.close()


def open_page(browser, html):
    page = browser.new_page()
    problems = []
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(html.as_uri())
    page.wait_for_selector("body[data-ready='1']")
    return page, problems


def test_browser_renders_turns_chips_and_filters(browser, viewer_files):
    from playwright.sync_api import expect

    eps, out = viewer_files
    page, problems = open_page(browser, out)
    for ep in eps:  # every turn of every episode, in order
        assert page.locator(f"section.episode[data-id='{ep.id}'] li.turn").count() == len(ep.turns)
    for name in ("outcome", "hits"):
        for ep, rewards in zip(eps, rewards_of(eps, name), strict=True):
            chips = page.locator(f"section.episode[data-id='{ep.id}'] .chip:not(.adv)[data-reward='{name}']")
            assert [float(v) for v in chips.evaluate_all("cs => cs.map(c => c.dataset.value)")] == rewards
            assert chips.first.inner_text() == f"{name} {rewards[0]:.3f}"
    # the reward switch shows one reward's chips only
    page.check("input[name='reward'][value='hits']")
    assert page.locator(".chip[data-reward='outcome']").count() == 0
    assert page.locator(".chip:not(.adv)[data-reward='hits']").count() == sum(len(e.turns) for e in eps)
    # the hostile action is shown as text and never ran
    assert page.locator("section.episode[data-id='s1'] pre.action").first.inner_text() == HOSTILE
    assert page.evaluate("window.__pwned") is None
    # filters change what is shown
    page.select_option("#f-oc", "incorrect")
    assert sorted(page.locator("section.episode").evaluate_all("s => s.map(x => x.dataset.id)")) == ["s1", "s4"]
    page.select_option("#f-oc", "")
    page.select_option("#f-ds", "hotpotqa")
    assert page.locator("section.episode").evaluate_all("s => s.map(x => x.dataset.id)") == ["s3"]
    page.select_option("#f-ds", "")
    page.select_option("#f-cl", "none")
    assert page.locator("section.episode").evaluate_all("s => s.map(x => x.dataset.id)") == ["s4"]
    page.select_option("#f-cl", "")
    page.fill("#f-q", "lyon")
    expect(page.locator("section.episode")).to_have_count(1)
    assert page.locator("section.episode").get_attribute("data-id") == "s1"
    page.fill("#f-q", "no such text anywhere")
    page.wait_for_selector(".empty")
    page.fill("#f-q", "")
    expect(page.locator("section.episode")).to_have_count(len(eps))
    # the observation is collapsible and marks the env's truncation; the token view says there are no ids
    obs = page.locator("section.episode[data-id='s0'] li.turn").first.locator("details.observation")
    assert "truncated by the env" in obs.locator("summary").inner_text() and not obs.locator("pre").is_visible()
    obs.locator("summary").click()
    assert obs.locator("pre").is_visible()
    page.locator("section.episode[data-id='s0'] .tokbtn").click()
    assert "no token ids" in page.locator("section.episode[data-id='s0'] .tokens").inner_text()
    assert problems == []
    page.close()


def test_browser_pages_through_groups_and_shows_trained_and_masked_tokens(browser, tmp_path):
    from transformers import AutoTokenizer

    from turngym.agents.tiny import tiny_model_dir

    model = str(tiny_model_dir(chat=True))
    tok = AutoTokenizer.from_pretrained(model)
    eps = [search_episode(i, f"g{i}", "Paris", [i % 2 == 0]) for i in range(45)]
    for ep in eps:
        ep.meta["model"] = model
        ep.prompt_ids = tok(ep.prompt[0]["content"], add_special_tokens=False)["input_ids"]
        for t in ep.turns:
            t.action_ids = tok(t.action, add_special_tokens=False)["input_ids"]
            t.observation_ids = tok(t.observation, add_special_tokens=False)["input_ids"] if t.observation else None
    path = tmp_path / "e.jsonl"
    with EpisodeWriter(path) as w:
        w.write_all(eps)
    page, problems = open_page(browser, write_viewer(path, tmp_path / "v.html"))
    assert page.locator("#page").inner_text() == "page 1 of 3" and page.locator("article.group").count() == 20
    page.click("#next")
    page.click("#next")
    assert page.locator("#page").inner_text() == "page 3 of 3"
    assert page.locator("article.group").evaluate_all("gs => gs.map(g => g.dataset.group)") == [f"g{i}" for i in range(40, 45)]
    page.click("#prev")
    assert page.locator("article.group").first.get_attribute("data-group") == "g20"
    sec = page.locator("section.episode[data-id='s20']")
    sec.locator(".tokbtn").click()
    ep = eps[20]
    assert sec.locator(".tokens .tok-prompt[title]").count() == len(ep.prompt_ids)
    assert sec.locator(".tokens .tok-action[title]").count() == sum(len(t.action_ids) for t in ep.turns)
    assert sec.locator(".tokens .tok-obs[title]").count() == sum(len(t.observation_ids or []) for t in ep.turns)
    shown = "".join(sec.locator(".tokens .tok-action[title]").evaluate_all("ts => ts.map(t => t.textContent)"))
    assert " " not in shown  # spaces are drawn as ·
    assert unmark(shown) == "".join(tok.decode(t.action_ids) for t in ep.turns)
    assert problems == []
    page.close()


def unmark(text):
    return text.replace("↵", "").replace("·", " ").replace("⇥", "\t")


def test_browser_makes_whitespace_only_actions_and_tokens_visible(browser, tmp_path):
    from transformers import AutoTokenizer

    from turngym.agents.tiny import tiny_model_dir

    model = str(tiny_model_dir(chat=True))
    tok = AutoTokenizer.from_pretrained(model)
    ep = search_episode(0, "g0", "Paris", [True])
    ep.meta["model"] = model
    ep.turns[0].action = "\n" * 24
    ep.turns[0].action_ids = tok(ep.turns[0].action, add_special_tokens=False)["input_ids"]
    ep.turns[1].action = " \t "
    path = tmp_path / "e.jsonl"
    with EpisodeWriter(path) as w:
        w.write(ep)
    page, problems = open_page(browser, write_viewer(path, tmp_path / "v.html"))
    turns = page.locator("section.episode[data-id='s0'] li.turn")
    assert turns.nth(0).locator(".wsnote").inner_text().startswith("whitespace-only action (24 newlines)")
    assert turns.nth(0).locator("pre.action").text_content() == "↵\n" * 24
    assert turns.nth(1).locator(".wsnote").inner_text().startswith("whitespace-only action (2 spaces, 1 tab)")
    assert turns.nth(1).locator("pre.action").text_content() == "·⇥·"
    assert page.locator("section.episode[data-id='s0'] .wsnote").count() == 2
    page.locator("section.episode[data-id='s0'] .tokbtn").click()
    trained = page.locator("section.episode[data-id='s0'] .tokens .tok-action[title]")
    texts = trained.evaluate_all("ts => ts.map(t => t.textContent)")
    assert len(texts) == len(ep.turns[0].action_ids) and all(t and set(t) <= {"↵", "\n"} for t in texts)
    assert "".join(texts).count("↵") == 24
    assert problems == []
    page.close()


def test_calls_answers_are_clustered_by_canonical_json(tmp_path):
    """A group whose env declares call answers (BFCL) is clustered by canonical JSON, not text."""
    from turngym.episode import RewardNeeds
    from turngym.views.viewer import render_viewer

    needs = RewardNeeds("calls", "answer_tag", tool_ok_metrics=("tool_ok",))
    answers = ['{"a": 1, "b": 2}', '{"b": 2, "a": 1}', '{"a": 3}']
    eps = [Episode(id=f"b{i}", env_id="turngym/BFCL-v0", group="g", task={"question": "q"}, reward_needs=needs,
                   turns=[Turn(index=0, action=a)], final_answer=a) for i, a in enumerate(answers)]
    d = payload(render_viewer(eps, tmp_path / "v.html"))
    clusters = [row["cl"] for row in d["eps"]]
    assert clusters[0] == clusters[1] != clusters[2]  # the same call with its arguments reordered is one answer
