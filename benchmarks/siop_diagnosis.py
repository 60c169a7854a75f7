"""Why SIOP scored below chance on the planted benchmark: scorer, method, estimator or benchmark?

On the planted SearchQA sets (and MathCode's, ``--envs searchqa,mathcode``) of ``turngym creditbench``
(each search useful or useless by construction;
the random design, where useless searches sit mostly in failing episodes, and the contrast design, where
every episode holds one useful and one useless search in either order) this scores, side by side:

- **scorer**: the support for the gold answer itself, Δ log p(gold) across each turn, before and after
  the turn's observation (does the scorer see the evidence at all?);
- **method**: SIOP's per-turn rewards at its official scoring point (τ_t ends before turn t's
  observation) and with ``prefix="after_observation"`` (τ_t ends after it); raw rewards, on the turn and
  one turn later (where does the credit land?);
- **estimator**: the same rewards through SIOP's ``turn`` estimator, the unbiased ``turn_loo`` and
  episode-level ``grpo``;
- **benchmark**: pooled AUC against within-episode AUC (does the table measure "this turn mattered" or
  "this episode succeeded"?), beside the label-free baselines.

Writes ``siop_diagnosis.json`` and ``siop_diagnosis.md`` under ``--out``.
Usage: python benchmarks/siop_diagnosis.py [--envs searchqa] [--groups 8] [--k 4]
       [--scorer SPEC] [--out runs/siop-diag]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main() -> None:
    from turngym.credit.accuracy import credit_score, episode_pairs, labelled_pairs
    from turngym.credit.creditbench import BenchConfig, build
    from turngym.credit.table import baseline_scores, estimator_scores
    from turngym.episode import reward_view, turn_labels
    from turngym.rewards import get_reward
    from turngym.rewards.support import make_scorer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", default="searchqa", help="planted envs, comma-separated (searchqa, mathcode)")
    ap.add_argument("--designs", default="random,contrast", help="planted designs, comma-separated")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--scorer", default='{"model": "qwen2.5-coder-0.5b-instruct", "prefix_cache_tokens": 40000}',
                    help="scorer spec (as for ``--scorer`` of ablate); fp32")
    ap.add_argument("--out", default="runs/siop-diag")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cfg = BenchConfig(envs=tuple(args.envs.split(",")), groups=args.groups, k=args.k, designs=tuple(args.designs.split(",")))
    built = build(cfg)
    print(f"built {sum(len(g) for g in built.values())} groups in {time.perf_counter() - start:.0f} s", flush=True)
    scorer = make_scorer(args.scorer)
    # the scorer: Δ log p(gold) per turn (the SIOP repository's gold-reference IGPO reward), and SIOP itself,
    # each cut before and after each turn's observation (every scoring point is a prefix of the whole transcript,
    # so with ``prefix_cache_tokens`` in the scorer spec one forward per episode serves all four)
    by_name = {"scorer: Δ log p(gold), before the observation": get_reward("igpo_siop", scorer=scorer, tokens="text"),
                "siop (official: before the observation)": get_reward("siop", scorer=scorer, tokens="text"),
                "scorer: Δ log p(gold), after the observation": get_reward("igpo_siop", scorer=scorer, tokens="text",
                                                                           prefix="after_observation"),
                "siop, prefix=after_observation": get_reward("siop", scorer=scorer, tokens="text",
                                                             prefix="after_observation")}
    report: dict = {"scorer": args.scorer, "envs": args.envs, "groups": args.groups, "k": args.k, "sets": {}}
    for name, groups in built.items():
        labels = [[turn_labels(e, "planted") for e in g] for g in groups]
        rows = {}
        for wname, reward in by_name.items():
            rewards = [reward.score_group(reward_view(list(g))).rewards for g in groups]
            raw = credit_score([episode_pairs(r, lab) for r, lab in zip(rewards, labels, strict=True)]).to_dict()
            lag = credit_score([[labelled_pairs([x], [y], lag=1) for x, y in zip(r, lab, strict=True)]
                                for r, lab in zip(rewards, labels, strict=True)]).to_dict()
            est = estimator_scores(rewards, labels, ["turn", "turn_loo", "grpo"])
            rows[wname] = {"raw": raw, "raw_next_turn": lag, "advantage": est}
            print(f"{name:>18} {wname:<42} raw AUC {raw['auc']} (within {raw['within_auc']}), next turn "
                  f"{lag['auc']}; turn {est['turn'].get('auc')} / within {est['turn'].get('within_auc')}, turn_loo "
                  f"{est['turn_loo'].get('auc')} / {est['turn_loo'].get('within_auc')}, grpo {est['grpo'].get('auc')} "
                  f"[{time.perf_counter() - start:.0f} s]", flush=True)
        report["sets"][name] = {"rewards": rows, "baselines": baseline_scores([list(g) for g in groups], labels)}
    (out / "siop_diagnosis.json").write_text(json.dumps(report, indent=1, default=float))
    (out / "siop_diagnosis.md").write_text(markdown(report))
    print((out / "siop_diagnosis.md").read_text())


def _f(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def markdown(report: dict) -> str:
    lines = [f"SIOP diagnosis on planted {report.get('envs', 'searchqa')} ({report['groups']} groups × {report['k']}; scorer "
             f"`{report['scorer']}`). AUC pooled / within-episode.", "",
             "| set | SIOP scoring point | raw reward | raw, next turn | `turn` | `turn_loo` | `grpo` |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, s in report["sets"].items():
        for wname, r in s["rewards"].items():
            adv = r["advantage"]
            lines.append(f"| {name} | {wname} | {_f(r['raw']['auc'])} / {_f(r['raw']['within_auc'])} | "
                         f"{_f(r['raw_next_turn']['auc'])} | "
                         + " | ".join(f"{_f(adv[e].get('auc'))} / {_f(adv[e].get('within_auc'))}"
                                      for e in ("turn", "turn_loo", "grpo")) + " |")
        for b, v in s["baselines"].items():
            lines.append(f"| {name} | *label-free: {b}* | {_f(v['auc'])} / {_f(v['within_auc'])} | | | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
