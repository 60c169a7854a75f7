"""Viewer cost at 10,000 episodes: generation time and HTML size, and time to first render and to filter
in headless Chromium.

Episodes are synthetic but shaped like SearchQA rollouts (K = 4 per query, 1–4 turns, ~1.5 kB
observations, token ids from a real tokenizer) with three rewards scored on them
(rewards plus three estimators' advantages each, as ``turngym ablate`` saves them). Baselines, in
the same process: reading the same episodes file with ``read_episodes``; and with ``--baseline-ref REF``
the page as the templates at git revision REF render the same embedded data, timed in turn with the
current page in the same browser (first render, outcome filter, first text search; ratios printed).

    python benchmarks/viewer.py [--episodes 10000] [--no-browser] [--baseline-ref main]
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from turngym.agents.tiny import tiny_model_dir
from turngym.episode import Episode, EpisodeWriter, Turn
from turngym.episode.reader import read_episodes
from turngym.training.scores import records_for, write_scores
from turngym.truth import TruthValue
from turngym.views.viewer import write_viewer

WORDS = ("the capital river season album director born founded population league county city war "
         "museum island author novel film bridge mountain university").split()


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def make_episodes(n: int, tok, model: str) -> list[Episode]:
    rng = random.Random(0)
    eps = []
    for g in range(n // 4):
        question = f"Q{g}: which {text(rng, 8)}?"
        prompt = [{"role": "system", "content": "Answer with <search>query</search> then <answer>…</answer>."},
                  {"role": "user", "content": question}]
        prompt_ids = tok(prompt[0]["content"] + question, add_special_tokens=False)["input_ids"]
        for k in range(4):
            turns = []
            for t in range(rng.randint(1, 4)):
                last = t == 3 or rng.random() < 0.3
                action = f"<answer>{rng.choice(WORDS)}</answer>" if last else f"<search>{text(rng, 6)}</search>"
                obs = None if last else "<information>" + " ".join(f"Doc {d}(Title: {text(rng, 3)}) {text(rng, 80)}"
                                                                  for d in range(3)) + "</information>"
                turns.append(Turn(index=t, action=action, observation=obs,
                                  truth={} if last else {"retrieval_hit": TruthValue(rng.random() < 0.4, "env")},
                                  action_ids=tok(action, add_special_tokens=False)["input_ids"],
                                  observation_ids=tok(obs, add_special_tokens=False)["input_ids"] if obs else None))
                if last:
                    break
            answer = turns[-1].action[8:-9] if turns[-1].action.startswith("<answer>") else None
            em = float(answer == "city")
            eps.append(Episode(id=f"q{g}#{k}", env_id="turngym/SearchQA-v0", group=f"q{g}",
                               task={"question": question, "answers": ["city"], "dataset": rng.choice(["nq", "hotpotqa"])},
                               prompt=prompt, prompt_ids=prompt_ids, turns=turns, final_answer=answer,
                               outcome={"em": em, "f1": em}, terminated=answer is not None,
                               truncated=answer is None, meta={"model": model}))
    return eps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=10_000)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--baseline-ref", default=None, help="git revision whose viewer templates are timed side by side")
    ap.add_argument("--repeats", type=int, default=2, help="browser runs per page, alternating (default: 2)")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    model = str(tiny_model_dir(chat=True))
    tok = AutoTokenizer.from_pretrained(model)
    work = Path(tempfile.mkdtemp(prefix="turngym-viewer-bench-"))
    try:
        eps = make_episodes(args.episodes, tok, model)
        path = work / "episodes.jsonl"
        with EpisodeWriter(path, fsync=False) as w:
            w.write_all(eps)
        rng = random.Random(1)
        per_turn = {"outcome": [[0.0] * (len(e.turns) - 1) + [e.outcome["em"]] for e in eps],
                    "ttrl": [[0.0] * (len(e.turns) - 1) + [float(rng.random() < 0.5)] for e in eps],
                    "siop": [[rng.gauss(0, 0.3) for _ in e.turns] for e in eps]}
        ablation = work / "ablation"
        ablation.mkdir()
        write_scores(ablation / "scores.jsonl", records_for(eps, per_turn))

        t0 = time.perf_counter()
        read_episodes(path)
        t_read = time.perf_counter() - t0
        t0 = time.perf_counter()
        html = write_viewer(path, work / "view.html", ablation_dir=ablation)
        t_gen = time.perf_counter() - t0
        jsonl_mb, html_mb = path.stat().st_size / 1e6, html.stat().st_size / 1e6
        turns = sum(len(e.turns) for e in eps)
        print(f"{len(eps)} episodes, {turns} turns, 3 rewards x (rewards + 3 estimators' advantages)")
        print(f"baseline read_episodes: {t_read:.2f} s; write_viewer: {t_gen:.2f} s ({t_gen / t_read:.1f}x the read)")
        print(f"episodes.jsonl {jsonl_mb:.1f} MB; view.html {html_mb:.1f} MB ({html_mb / jsonl_mb:.2f}x)")
        if not args.no_browser:
            pages = [("current", html)]
            if args.baseline_ref:
                pages.insert(0, (f"templates at {args.baseline_ref}", baseline_page(html, args.baseline_ref)))
            browser_figures(pages, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def timed(page, action) -> float:
    """Seconds from an action to the end of the render it causes."""
    n = int(page.locator("body").get_attribute("data-renders"))
    t0 = time.perf_counter()
    action()
    page.wait_for_selector(f"body[data-renders='{n + 1}']", timeout=120_000)
    return time.perf_counter() - t0


def baseline_page(html: Path, ref: str) -> Path:
    """The same embedded data rendered by the viewer templates at git revision ``ref``."""
    root = Path(__file__).resolve().parent.parent

    def asset(name: str) -> str:
        for folder in ("turngym/views/templates", "turngym/evals/templates"):  # the templates' folder before the views split
            shown = subprocess.run(["git", "show", f"{ref}:{folder}/{name}"], cwd=root, capture_output=True, text=True)
            if shown.returncode == 0:
                return shown.stdout
        raise FileNotFoundError(f"no viewer template {name} at git revision {ref}")

    text = html.read_text(encoding="utf-8")
    data = re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S).group(1)
    title = re.search(r"<title>(.*?)</title>", text, re.S).group(1)
    page = (asset("viewer.html").replace("/*TITLE*/", title).replace("/*CSS*/", asset("viewer.css"))
            .replace("/*JS*/", asset("viewer.js")))
    before, _, after = page.partition("/*DATA*/")  # str.replace would read backslashes in the data
    out = html.with_name("view-baseline.html")
    out.write_text(before + data + after, encoding="utf-8")
    return out


def browser_figures(pages: list[tuple[str, Path]], repeats: int = 2) -> None:
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        print("no chromium: browser figures skipped (apt-get install -y chromium)")
        return
    figures: dict[str, list[tuple[float, float, float]]] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        for run in range(repeats):  # the first run includes a cold browser cache
            for label, html in pages:  # in turn, so both see the same machine load
                page = browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                t0 = time.perf_counter()
                page.goto(html.as_uri())
                page.wait_for_selector("body[data-ready='1']", timeout=120_000)
                first = time.perf_counter() - t0
                in_page = page.evaluate("performance.now()")
                t_filter = timed(page, lambda page=page: page.select_option("#f-oc", "correct"))
                t_search = timed(page, lambda page=page: page.fill("#f-q", "museum bridge")) - 0.15  # minus the debounce
                status = page.locator("#status").inner_text()
                extra = ""
                if page.locator("#f-sort option[value='dis']").count():  # the comparison features, current page only
                    timed(page, lambda page=page: page.fill("#f-q", ""))
                    t_sort = timed(page, lambda page=page: page.select_option("#f-sort", "dis"))
                    page.fill("#f-dmin", "0.5")
                    t_dmin = timed(page, lambda page=page: page.dispatch_event("#f-dmin", "change"))
                    extra = f"; sort by disagreement {t_sort * 1000:.0f} ms; disagreement filter {t_dmin * 1000:.0f} ms"
                figures.setdefault(label, []).append((first, t_filter, t_search))
                print(f"{label}, chromium run {run + 1}: first render {first:.2f} s (page clock {in_page / 1000:.2f} s); "
                      f"outcome filter {t_filter * 1000:.0f} ms; first text search {t_search * 1000:.0f} ms "
                      f"({status}){extra}; page errors: {len(errors)}")
                page.close()
        browser.close()
    if len(pages) == 2:
        (base_label, _), (cur_label, _) = pages
        import statistics

        for k, name in enumerate(("first render", "outcome filter", "first text search")):
            b, c = (min(f[k] for f in figures[label]) for label in (base_label, cur_label))
            bm, cm = (statistics.median(f[k] for f in figures[label]) for label in (base_label, cur_label))
            print(f"{name}: current / baseline = {c / b:.2f}x best of {repeats} ({c:.3f} s vs {b:.3f} s), "
                  f"{cm / bm:.2f}x median ({cm:.3f} s vs {bm:.3f} s)")


if __name__ == "__main__":
    main()
