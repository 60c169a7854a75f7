"""IGPO's credit accuracy before and after its repository defaults, on real SearchQA episodes.

Scores recorded episodes (e.g. the main job's SearchQA stage, or ``turngym eval --env SearchQA-v0 ...``)
with IGPO in four configurations, side by side, and reports the AUC of each one's advantages against the
env-derived per-turn truth (``retrieval_hit``: the search returned a passage holding a gold answer):

- ``before``: turngym's earlier defaults: the answer turn also gets ΔΦ_T (``final_turn_gain=True``),
  turn-limit rollouts keep their gains, F1 against every gold answer, the format check reads the raw
  actions (a prefill-opened call the env ran counts as unclosed) and the ``igpo_separate`` estimator;
- ``format fix``: the same with the format check on the executed transcript;
- ``defaults``: the IGPO repository's computation, which is turngym's default now;
- ``defaults, igpo_separate``: today's rewards under the earlier estimator.

Also reports how many episodes each configuration gives the format penalty.
Writes ``igpo_credit_change.json`` and ``.md`` under ``--out``.
Real episodes rarely carry a useful search (on the main job's HotpotQA items most searches miss), so
``--planted G`` scores the planted SearchQA sets of ``turngym creditbench`` instead (G groups per design,
random and contrast; Search-R1 tags without a forced prefill, so there the format fix changes nothing:
the real episodes show it, through the count of format penalties).
Usage: python benchmarks/igpo_credit_change.py --episodes runs/sq/episodes.jsonl | --planted 4
       [--scorer qwen2.5-coder-0.5b-instruct]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from turngym.credit.table import baseline_scores, estimator_scores
from turngym.episode import Episode, group_episodes, reward_view, turn_labels
from turngym.episode.reader import read_episodes
from turngym.rewards.siop import IGPOReward, igpo_tags_balanced
from turngym.rewards.support import MemoSupportScorer, make_scorer


@dataclass
class RawActionFormatIGPO(IGPOReward):
    """IGPO whose format check reads the raw actions (turngym's check before the executed-transcript fix):
    kept here only to measure what the fix changed."""

    def outcome(self, ep: Episode, golds) -> float:
        raw = "".join(t.action + (t.observation or "") for t in ep.turns)
        if self.format_penalty is not None and (ep.final_answer is None or not igpo_tags_balanced(raw)):
            return float(self.format_penalty)
        return super().outcome(ep, golds)


def configurations(scorer, tokens: str) -> dict[str, tuple[IGPOReward, str]]:
    before = dict(scorer=scorer, tokens=tokens, final_turn_gain=True, turn_limit_gains="keep", f1_golds="all")
    today = dict(scorer=scorer, tokens=tokens)
    return {"before (raw-action format check, ΔΦ_T, all golds)": (RawActionFormatIGPO(**before), "igpo_separate"),
            "format fix only": (IGPOReward(**before), "igpo_separate"),
            "defaults (IGPO repository)": (IGPOReward(**today), "igpo"),
            "defaults, igpo_separate estimator": (IGPOReward(**today), "igpo_separate")}


def _f(x) -> str:
    return "–" if x is None else f"{x:.3f}"


def markdown(report: dict) -> str:
    lines = [f"IGPO on {report['episodes']} ({report['labelled']} labelled turns, {report['useful']} useful; truth "
             f"`{report['truth']}`; scorer `{report['scorer']}`)", "",
             "| configuration | estimator | AUC [95% CI] | within-episode AUC | format penalties |",
             "| --- | --- | --- | --- | --- |"]
    for name, r in report["rows"].items():
        ci = r.get("auc_ci95")
        interval = f" [{_f(ci[0])}, {_f(ci[1])}]" if ci else ""
        lines.append(f"| {name} | `{r['estimator']}` | {_f(r.get('auc'))}{interval} | {_f(r.get('within_auc'))} | "
                     f"{r['format_penalties']} |")
    for b, v in report["baselines"].items():
        lines.append(f"| *label-free: {b}* | | {_f(v.get('auc'))} | {_f(v.get('within_auc'))} | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--episodes", help="recorded episodes (JSONL) with per-turn truth")
    src.add_argument("--planted", type=int, help="groups per design of the planted SearchQA benchmark")
    ap.add_argument("--scorer", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--truth", default="retrieval_hit")
    ap.add_argument("--out", default="runs/igpo-change")
    ap.add_argument("--markdown-only", action="store_true", help="rewrite the .md from the saved .json and stop")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.markdown_only:
        (out / "igpo_credit_change.md").write_text(markdown(json.loads((out / "igpo_credit_change.json").read_text())))
        return
    start = time.perf_counter()
    tokens = "ids" if args.episodes else "text"  # planted episodes are text only: re-tokenised by the scorer
    if args.episodes:
        groups = [list(g) for g in group_episodes(read_episodes(args.episodes).episodes)]
        labels = [[turn_labels(e, args.truth) for e in g] for g in groups]
    else:
        from turngym.credit.creditbench import BenchConfig, build

        built = build(BenchConfig(envs=("searchqa",), groups=args.planted, k=4, designs=("random", "contrast")))
        groups = [list(g) for sets in built.values() for g in sets]
        labels = [[turn_labels(e, "planted") for e in g] for g in groups]
        args.episodes, args.truth = f"planted SearchQA, {args.planted} groups per design", "planted"
    n_lab = sum(x is not None for g in labels for e in g for x in e)
    n_pos = sum(x == 1 for g in labels for e in g for x in e)
    print(f"{sum(map(len, groups))} episodes in {len(groups)} groups; {n_lab} labelled turns ({n_pos} useful)", flush=True)
    scorer = MemoSupportScorer(make_scorer(args.scorer))
    report = {"episodes": args.episodes, "scorer": args.scorer, "truth": args.truth, "labelled": n_lab,
              "useful": n_pos, "rows": {}}
    for name, (reward, est) in configurations(scorer, tokens).items():
        scored = [reward.score_group(reward_view(g)) for g in groups]
        penalised = sum(o == reward.format_penalty for s in scored for o in s.diagnostics["outcome"])
        row = estimator_scores([s.rewards for s in scored], labels, [est])[est]
        row.update(estimator=est, format_penalties=penalised)
        report["rows"][name] = row
        print(f"{name:<52} {est:<14} AUC {row.get('auc')} within {row.get('within_auc')} "
              f"penalised {penalised} [{time.perf_counter() - start:.0f} s]", flush=True)
    report["baselines"] = baseline_scores(groups, labels)
    (out / "igpo_credit_change.json").write_text(json.dumps(report, indent=1, default=float))
    lines = markdown(report)
    (out / "igpo_credit_change.md").write_text(lines)
    print(lines)


if __name__ == "__main__":
    main()
