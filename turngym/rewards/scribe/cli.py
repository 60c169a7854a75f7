"""``turngym scribe build-library`` and ``turngym scribe diagnose`` (their parsers: turngym.cli.scribe).

Both say each stage on stderr from the first second, and the LLM's replies as they arrive with an ETA
(a local decomposer or judge takes minutes per batch on a CPU)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from turngym.envs.declared import load_episodes
from turngym.episode import Episode
from turngym.progress import StageClock


def _episodes(path: str) -> list[Episode]:
    try:
        return load_episodes(path).episodes
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


def _llm(args: argparse.Namespace, clock: StageClock) -> Any:
    from turngym.rewards.scribe.reward import make_llm

    where = f"served at {args.base_url}" if args.base_url else "(a local model: loading it)"
    clock.stage(f"LLM {args.llm!r} {where}…")
    return make_llm(args.llm, args.base_url, max_concurrency=args.concurrency, cache_path=args.cache,
                    progress=clock.count)


def cmd_build_library(args: argparse.Namespace, clock: StageClock) -> int:
    clock.stage(f"reading episodes from {args.episodes}…")
    from turngym.rewards.scribe.decompose import decompose
    from turngym.rewards.scribe.embed import SentenceEmbedder
    from turngym.rewards.scribe.library import build_library

    episodes = _episodes(args.episodes)
    llm = _llm(args, clock)
    t0 = time.perf_counter()
    clock.stage(f"decomposing {len(episodes)} episodes into steps…")
    decomps = decompose(episodes, llm, args.window_tokens)
    items = [it for d in decomps for it in d.items]
    decompose_s = time.perf_counter() - t0
    if not items:
        raise SystemExit(f"error: no skill items: {sum(d.failed for d in decomps)} of {len(episodes)} decompositions "
                         "failed to give valid JSON (see the llm stats below)\n" + json.dumps(llm.stats.to_dict()))
    lib, timings = build_library(items, SentenceEmbedder(args.embedder), llm, min_cluster_size=args.min_cluster_size,
                                 progress=clock.stage)
    if not lib.prototypes:
        raise SystemExit(f"error: every prototype distillation failed ({lib.failed_distillations}); nothing saved")
    path = lib.save(args.out)
    print(f"{len(items)} steps from {len(episodes)} episodes -> {lib.clustering['families']} skill families and "
          f"{lib.clustering['skills']} skills ({lib.clustering.get('method')}, {lib.failed_distillations} failed "
          "distillations)")
    print(json.dumps({"decompose_s": round(decompose_s, 2), **{k: round(v, 2) for k, v in timings.items()},
                      "llm": llm.stats.to_dict()}))
    print(f"library: {path}")
    return 0


def cmd_diagnose(args: argparse.Namespace, clock: StageClock) -> int:
    clock.stage(f"reading episodes from {args.episodes}…")
    from turngym.rewards import get_reward
    from turngym.rewards.scribe.diagnostics import reliability

    episodes = _episodes(args.episodes)
    try:
        scribe = get_reward("scribe", llm=_llm(args, clock), library=args.library, embedder=args.embedder,
                            router=args.router, window_tokens=args.window_tokens)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    result = reliability(episodes, scribe, repeats=args.repeats, temperature=args.temperature,
                         neighbour_threshold=args.neighbour_threshold, with_prm=not args.no_prm, progress=clock.stage)
    if not result["routed_steps"]:
        raise SystemExit("error: no step was routed to a prototype; nothing to judge")
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0
