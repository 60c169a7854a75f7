"""``turngym scribe build-library|diagnose``: SCRIBE skill libraries and judge diagnostics (turngym.rewards.scribe).

Both say each stage on stderr from the first second, and the LLM's replies as they arrive with an ETA
(a local decomposer or judge takes minutes per batch on a CPU)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turngym.cli._common import attempt, fail
from turngym.progress import StageClock

if TYPE_CHECKING:
    from turngym.episode import Episode

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
        sp.add_argument("--unlocated", choices=["drop", "whole_turn"], default="drop",
                        help="a turn none of whose step quotes is found: drop its steps (SCRIBE's code) or make the "
                             "whole turn one step (docs/faithfulness.md)")
        sp.add_argument("--locate", choices=["exact", "fuzzy"], default="exact",
                        help="find a step's quote verbatim (SCRIBE's code) or, failing that, by word coverage")

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
    clock = StageClock()  # the first line comes before the heavy imports
    clock.stage(f"scribe {args.scribe_command}: importing the decomposer, embedder and judge…")
    return (build_library if args.scribe_command == "build-library" else diagnose)(args, clock)


def _episodes(path: str) -> list[Episode]:
    from turngym.episode.reader import load_episodes

    return attempt(lambda: load_episodes(path).episodes, ValueError)


def _llm(args: argparse.Namespace, clock: StageClock) -> Any:
    from turngym.rewards.scribe.reward import make_llm

    where = f"served at {args.base_url}" if args.base_url else "(a local model: loading it)"
    clock.stage(f"LLM {args.llm!r} {where}…")
    return make_llm(args.llm, args.base_url, max_concurrency=args.concurrency, cache_path=args.cache,
                    progress=clock.count)


def no_items_reason(decomps: list[Any], args: argparse.Namespace) -> str:
    """Why decomposition gave no step: windows without valid JSON, or steps whose quotes are not in the turn."""
    failed = sum(d.failed_windows for d in decomps)
    windows = sum(d.windows for d in decomps)
    dropped = sum(d.dropped for d in decomps)
    why = [f"{failed} of {windows} decomposer windows gave no valid JSON"]
    if dropped:
        options = [o for o, on in (("--locate fuzzy", args.locate == "fuzzy"),
                                   ("--unlocated whole_turn", args.unlocated == "whole_turn")) if not on]
        hint = f" ({' or '.join(options)} keep{'s' if len(options) == 1 else ''} such steps)" if options else ""
        why.append(f"{dropped} proposed step(s) were dropped: their quotes are not in the turn's text, or they name a "
                   f"turn outside their window{hint}")
    return f"no skill items from {len(decomps)} episode(s): " + "; ".join(why)


def build_library(args: argparse.Namespace, clock: StageClock) -> int:
    clock.stage(f"reading episodes from {args.episodes}…")
    from turngym.rewards.scribe.decompose import decompose
    from turngym.rewards.scribe.embed import SentenceEmbedder
    from turngym.rewards.scribe.library import build_library as build

    episodes = _episodes(args.episodes)
    llm = _llm(args, clock)
    t0 = time.perf_counter()
    clock.stage(f"decomposing {len(episodes)} episodes into steps…")
    decomps = decompose(episodes, llm, args.window_tokens, unlocated=args.unlocated, locate_steps=args.locate)
    items = [it for d in decomps for it in d.items]
    decompose_s = time.perf_counter() - t0
    if not items:
        fail(no_items_reason(decomps, args) + "\n" + json.dumps(llm.stats.to_dict()))
    lib, timings = build(items, SentenceEmbedder(args.embedder), llm, min_cluster_size=args.min_cluster_size,
                         progress=clock.stage)
    if not lib.prototypes:
        fail(f"every prototype distillation failed ({lib.failed_distillations}); nothing saved")
    path = lib.save(args.out)
    print(f"{len(items)} steps from {len(episodes)} episodes -> {lib.clustering['families']} skill families and "
          f"{lib.clustering['skills']} skills ({lib.clustering.get('method')}, {lib.failed_distillations} failed "
          "distillations)")
    print(json.dumps({"decompose_s": round(decompose_s, 2), **{k: round(v, 2) for k, v in timings.items()},
                      "llm": llm.stats.to_dict()}))
    print(f"library: {path}")
    return 0


def diagnose(args: argparse.Namespace, clock: StageClock) -> int:
    clock.stage(f"reading episodes from {args.episodes}…")
    from turngym.rewards import get_reward
    from turngym.rewards.scribe.diagnostics import reliability

    episodes = _episodes(args.episodes)
    scribe = attempt(lambda: get_reward("scribe", llm=_llm(args, clock), library=args.library, embedder=args.embedder,
                                        router=args.router, window_tokens=args.window_tokens,
                                        unlocated_steps=args.unlocated, locate_steps=args.locate),
                     FileNotFoundError, ValueError)
    result = reliability(episodes, scribe, repeats=args.repeats, temperature=args.temperature,
                         neighbour_threshold=args.neighbour_threshold, with_prm=not args.no_prm, progress=clock.stage)
    if not result["routed_steps"]:
        fail("no step was routed to a prototype; nothing to judge")
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0
