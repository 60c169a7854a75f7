"""Continuous vs static batching on SearchQA-v0 with uneven turn lengths (episodes per second).

Both arms play the same SearchQA-v0 items with the same model, sampling and concurrency,
side by side in alternating repeats:
- static: one ``generate`` call per tick; each call runs to its longest row, and every turn
  re-reads its whole context;
- continuous: one decode loop; a row whose turn ended is stepped at once and its next turn
  (its KV cache kept, only the new ids read) or the next waiting episode takes the slot.
A random tiny model never writes a search or an answer, so every episode runs to the turn
limit; ``--extra-stop`` adds a stop string that random text hits now and then (default "p",
in about 5% of the tiny vocabulary's tokens), which makes turn lengths uneven (reported).
Three more arms play k greedy samples per item (identical at temperature 0: generated once),
against the static path as it was before (every sample generated).
Usage: python benchmarks/continuous_batching.py [--model tiny|default|DIR]
[--episodes 16] [--concurrency 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium

import turngym  # noqa: F401  (registers the envs)
from bench_setup import load_bench_policy
from turngym.agents.policy import SamplingParams
from turngym.agents.runner import RolloutRunner


class OldStaticRunner(RolloutRunner):
    """The static path as it was: every request generated, identical greedy ones too (the baseline)."""

    def _generate_once(self, requests, sampling):
        return self.policy.generate(requests, sampling)


def play(policy, batching: str, items: list[int], k: int, args, temperature: float, style: str) -> tuple[float, list]:
    stop = (args.extra_stop,) if args.extra_stop else ()
    cls = OldStaticRunner if batching == "old-static" else RolloutRunner
    runner = cls(policy, lambda: gymnasium.make("turngym/SearchQA-v0", dataset="nq", max_turns=args.max_turns,
                                                          prompt_style=style),
                           SamplingParams(max_new_tokens=args.max_new_tokens, temperature=temperature, seed=0, stop=stop),
                           k=k, concurrency=args.concurrency, batching="static" if batching == "old-static" else batching)
    start = time.perf_counter()
    eps = runner.run(items)
    return time.perf_counter() - start, eps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--extra-stop", default="p")
    ap.add_argument("--k", type=int, default=4, help="samples per item in the greedy arms")
    args = ap.parse_args()
    policy, style = load_bench_policy(args.model)
    items = list(range(args.episodes))
    play(policy, "continuous", items[:2], 1, args, 1.0, style)  # warm-up (index, JVM, model)
    wall: dict[str, list[float]] = {}
    turns: list[int] = []
    for rep in range(args.repeats):
        for batching in ("static", "continuous"):  # alternating arms
            w, eps = play(policy, batching, items, 1, args, 1.0, style)
            wall.setdefault(f"sampled/{batching}", []).append(w)
            if batching == "static" and rep == 0:
                turns = [len(t.action_ids) for e in eps for t in e.turns]
        for batching in ("old-static", "static", "continuous"):
            w, eps = play(policy, batching, items[: max(1, args.episodes // args.k)], args.k, args, 0.0, style)
            wall.setdefault(f"greedy-k{args.k}/{batching}", []).append(w)
        print(f"repeat {rep}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in wall.items()), flush=True)
    n_greedy = max(1, args.episodes // args.k) * args.k
    print(f"model={args.model} SearchQA-v0 nq, {args.episodes} episodes, concurrency {args.concurrency}, "
          f"max_new_tokens {args.max_new_tokens}, max_turns {args.max_turns}, extra stop {args.extra_stop!r}, "
          f"repeats {args.repeats}")
    q = statistics.quantiles(turns, n=10)
    print(f"turn lengths (tokens, static arm, repeat 0): mean {statistics.mean(turns):.1f}, p10 {q[0]:.0f}, "
          f"median {statistics.median(turns):.0f}, p90 {q[-1]:.0f}, n {len(turns)}")
    for arm in ("sampled", f"greedy-k{args.k}"):
        n = args.episodes if arm == "sampled" else n_greedy
        s = n / statistics.median(wall[f"{arm}/static"])
        c = n / statistics.median(wall[f"{arm}/continuous"])
        line = f"{arm:10s}: static {s:.3f} episodes/s, continuous {c:.3f} episodes/s, ratio {c / s:.2f}x"
        if arm != "sampled":
            o = n / statistics.median(wall[f"{arm}/old-static"])
            line += f"; static before (all k generated) {o:.3f} episodes/s: static {s / o:.2f}x, continuous {c / o:.2f}x of it"
        print(line)


if __name__ == "__main__":
    main()
