"""``turngym scribe build-library|diagnose``: SCRIBE skill libraries and judge diagnostics (turngym.rewards.scribe)."""

from __future__ import annotations

import argparse
from typing import Any

COMMANDS = ("scribe",)


def add_parser(sub: Any) -> None:
    scribe = sub.add_parser("scribe", help="SCRIBE skill libraries and judge diagnostics").add_subparsers(
        dest="scribe_command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("episodes", help="episodes JSONL")
        sp.add_argument("--llm", default="default", help="decomposer/judge model: 'default', a directory, a hub id, "
                                                         "or a served model name with --base-url")
        sp.add_argument("--base-url", default=None, help="OpenAI-compatible server URL")
        sp.add_argument("--embedder", default="default", help="sentence-transformers model (default all-MiniLM-L6-v2)")
        sp.add_argument("--concurrency", type=int, default=8, help="LLM calls in flight")
        sp.add_argument("--cache", default=None, help="JSONL file caching LLM replies across runs")
        sp.add_argument("--window-tokens", type=int, default=1024, help="decomposer window (tokens)")

    b = scribe.add_parser("build-library", help="decompose episodes, cluster skills, distil prototypes")
    common(b)
    b.add_argument("--out", required=True, help="library JSON to write")
    b.add_argument("--min-cluster-size", type=int, default=5, help="HDBSCAN's smallest skill cluster")
    b.set_defaults(run=run)

    d = scribe.add_parser("diagnose", help="judge reliability of scribe and prm: repeat and cross-instance consistency")
    common(d)
    d.add_argument("--library", required=True, help="skill library JSON (scribe build-library)")
    d.add_argument("--router", choices=["embedding", "llm"], default="embedding", help="how a step is routed to a skill")
    d.add_argument("--repeats", type=int, default=5, help="judgements per step")
    d.add_argument("--temperature", type=float, default=0.7, help="judge sampling temperature")
    d.add_argument("--neighbour-threshold", type=float, default=0.8,
                   help="cosine similarity of step texts for cross-instance pairs")
    d.add_argument("--no-prm", action="store_true", help="judge with the rubric judge only")
    d.add_argument("--out", default=None, help="write the result JSON here too")
    d.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from turngym.progress import StageClock

    clock = StageClock()  # the first line comes before the heavy imports
    clock.stage(f"scribe {args.scribe_command}: importing the decomposer, embedder and judge…")
    from turngym.rewards.scribe.cli import cmd_build_library, cmd_diagnose

    return (cmd_build_library if args.scribe_command == "build-library" else cmd_diagnose)(args, clock)
