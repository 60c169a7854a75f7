"""``turngym ablate``, ``report`` and ``view``: reading saved episodes (credit per reward, runs side by side, HTML)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from turngym.cli._common import add_reward_args, attempt, failed, log_trackers, reward_labels
from turngym.views.trackers import add_tracker_arguments

COMMANDS = ("ablate", "report", "view")


def add_parser(sub: Any) -> None:
    ab = sub.add_parser("ablate", help="score saved groups with several rewards and compare credit")
    ab.add_argument("--episodes", required=True, help="episodes JSONL (groups of k rollouts)")
    add_reward_args(ab, "outcome,ttrl,empo,siop,igpo")
    ab.add_argument("--scorer", default=None, help="support-scoring model for siop/igpo ('default', a directory, a hub id) "
                    "or JSON: {\"model\": ..., \"dtype\": ...} or {\"base_url\": ..., \"model\": ..., \"tokenizer\": ...}, "
                    "plus \"tokens\": \"text\" for a scorer of another model family")
    ab.add_argument("--scribe-llm", default="default", help="scribe's decomposer/judge model (or a served model name)")
    ab.add_argument("--scribe-base-url", default=None, help="OpenAI-compatible server for --scribe-llm")
    ab.add_argument("--scribe-library", default=None, help="a skill library JSON (default: built from the episodes)")
    ab.add_argument("--reliability-repeats", type=int, default=0,
                    help="N >= 2: add the judge-reliability table of scribe and prm (each step judged N times)")
    ab.add_argument("--truth", default=None, help="the per-turn truth key scored (Turn.truth; default: the one key "
                    "each episode carries)")
    ab.add_argument("--truth-map", default=None, help="truth value -> label, e.g. '+1:1,-1:0,0:skip' (needed for "
                    "non-binary truth such as human -1/0/+1 step labels)")
    ab.add_argument("--estimators", default="", help="score every reward under these estimators too (a,b,...), "
                    "besides its declared one")
    ab.add_argument("--out", required=True, help="output folder (ablation.md, scores.jsonl, view.html)")
    add_tracker_arguments(ab)
    ab.set_defaults(run=run)

    rp = sub.add_parser("report", help="runs side by side")
    rp.add_argument("dirs", nargs="+", help="eval run folders")
    rp.add_argument("--out", default="comparison.md", help="the comparison to write")
    rp.set_defaults(run=run)

    vw = sub.add_parser("view", help="write a self-contained HTML viewer of saved episodes and their per-turn credit")
    vw.add_argument("episodes", help="an episodes JSONL file")
    vw.add_argument("--ablation", default=None, help="a `turngym ablate` output folder (its scores.jsonl)")
    vw.add_argument("--scores", default=None, help="a per-turn scores JSONL file (format: turngym.training.scores)")
    vw.add_argument("--compare", default=None, metavar="EPISODES",
                    help="a second run's episodes JSONL (another model or checkpoint on the same items), shown side "
                         "by side item by item (default: none)")
    vw.add_argument("--compare-scores", default=None, metavar="FILE", help="per-turn scores of the --compare run (default: none)")
    vw.add_argument("--out", required=True, help="the HTML file to write")
    vw.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return {"ablate": _ablate, "report": _report, "view": _view}[args.command](args)


def _ablate(args: argparse.Namespace) -> int:
    from turngym.credit.ablate import run_ablation
    from turngym.credit.table import parse_estimators
    from turngym.progress import StageClock

    clock = StageClock()
    clock.stage("reading episodes and loading the rewards' models…")
    summary = attempt(lambda: run_ablation(
        args.episodes, reward_labels(args), args.out, scorer=args.scorer,
        scribe_llm=args.scribe_llm, scribe_library=args.scribe_library, scribe_base_url=args.scribe_base_url,
        reliability_repeats=args.reliability_repeats, truth=args.truth, truth_map=args.truth_map,
        estimators=parse_estimators(args.estimators), progress=clock.stage), FileNotFoundError, ValueError)
    for name, m in summary["rewards"].items():
        ca = m["credit_accuracy"]
        print(f"{name:8s} credit accuracy {'–' if ca is None else f'{ca:.3f}'}")
    for name, err in summary["errors"].items():
        print(f"{name:8s} FAILED: {err}")
    print(f"report: {Path(args.out) / 'ablation.md'}")
    log_trackers(args, args.out)
    return failed(summary["errors"], str(Path(args.out) / "ablation.md"))


def _report(args: argparse.Namespace) -> int:
    from turngym.views.report import compare_runs

    path = attempt(lambda: compare_runs(args.dirs, args.out), FileNotFoundError, KeyError, ValueError)
    print(f"report: {path}")
    return 0


def _view(args: argparse.Namespace) -> int:
    from turngym.views.viewer import write_viewer

    path = attempt(lambda: write_viewer(args.episodes, args.out, ablation_dir=args.ablation, scores_path=args.scores,
                                        compare_path=args.compare, compare_scores_path=args.compare_scores),
                   FileNotFoundError, ValueError, OSError)
    print(f"viewer: {path} ({path.stat().st_size / 1e6:.1f} MB); open it in a browser")
    return 0
