"""Which SearchQA-v0 tool format and prompt make the embedded instruct model search?

Plays the same items (the first ``--limit`` of each dataset in file order; the main job's
SearchQA subset is the first items of HotpotQA dev) greedily under every arm, with one loaded
model. Arms: ``tags`` (Search-R1 ``<search>`` template) and ``native`` (search as a Hermes
function tool through the chat template), each with ``prompt=official`` and
``prompt=search_first`` (an added instruction to search before answering) or ``prompt=one_shot``
(one worked example of a search and an answer in the arm's format); a third field ``force``
adds ``force_first_search=True`` (the first reply is started with an opened search call that
the model completes, e.g. ``native:official:force``). Per arm and
dataset: episodes with at least one executed search (a query that reached the index),
episodes whose searches retrieved a passage holding a gold answer, retrieval hits over all
searches, answered rate, EM, F1, and answers that hold a tool call (a call put in ``<answer>``).
Usage: python benchmarks/searchqa_formats.py [--model qwen2.5-coder-0.5b-instruct] [--limit 4]
       [--datasets hotpotqa,nq] [--arms tags:official,native:one_shot,native:official:force,...] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium

import turngym  # noqa: F401
from turngym.agents.loading import load_policy, model_identity
from turngym.agents.policy import SamplingParams
from turngym.agents.runner import RolloutRunner

ARMS = ("tags:official,tags:search_first,native:official,native:search_first,tags:one_shot,native:one_shot,"
        "tags:official:force,native:official:force")


def executed_searches(ep) -> int:
    return sum(t.metrics.get("action") == "search" and "n_docs" in t.metrics for t in ep.turns)


def arm_row(eps) -> dict:
    n = len(eps)
    searches = [executed_searches(e) for e in eps]
    hits = [sum(bool(t.truth["retrieval_hit"].value) for t in e.turns if "retrieval_hit" in t.truth) for e in eps]
    return {"episodes": n, "searched": sum(s > 0 for s in searches), "searches": sum(searches),
            "episodes_with_hit": sum(h > 0 for h in hits), "hits": sum(hits),
            "answered": sum(e.final_answer is not None for e in eps),
            "call_in_answer": sum(e.final_answer is not None and ("\"name\"" in e.final_answer or "tool_call" in e.final_answer)
                                  for e in eps),
            "em": sum(e.outcome.get("em", 0.0) for e in eps) / n, "f1": sum(e.outcome.get("f1", 0.0) for e in eps) / n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--datasets", default="hotpotqa,nq")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--arms", default=ARMS)
    ap.add_argument("--json", default=None, help="also write the table as JSON here")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    policy = load_policy(args.model)
    ident = model_identity(args.model)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    rows = []
    print(f"model {ident.get('name')} sha256 {ident.get('sha256')}; greedy, {args.max_new_tokens} new tokens per turn, "
          f"max {args.max_turns} turns; items 0..{args.limit - 1} of each dataset", flush=True)
    print("| arm | dataset | episodes | searched ≥1 | searches | episodes with a gold hit | hits | answered "
          "| call inside <answer> | EM | F1 | wall s |\n|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for arm in args.arms.split(","):
        fmt, prompt, *rest = arm.split(":")
        if rest not in ([], ["force"]):
            raise SystemExit(f"an arm is format:prompt or format:prompt:force, got {arm!r}")
        for ds in args.datasets.split(","):
            def make():
                return gymnasium.make("turngym/SearchQA-v0", dataset=ds, tool_format=fmt, prompt=prompt,  # noqa: B023
                                      force_first_search=bool(rest), max_turns=args.max_turns)  # noqa: B023

            runner = RolloutRunner(policy, make, sampling, k=1, concurrency=8, run_tag=f"{arm}-{ds}")
            start = time.perf_counter()
            eps = runner.run(range(args.limit))
            row = {"arm": arm, "dataset": ds, **arm_row(eps), "wall_s": round(time.perf_counter() - start, 1),
                   "examples": [e.turns[0].action[:300] for e in eps[:2]],
                   "answers": [[e.final_answer, e.task.get("answers", [])[:3]] for e in eps]}
            rows.append(row)
            print(f"| {arm} | {ds} | {row['episodes']} | {row['searched']} | {row['searches']} | "
                  f"{row['episodes_with_hit']} | {row['hits']} | {row['answered']} | {row['call_in_answer']} | "
                  f"{row['em']:.3f} | {row['f1']:.3f} | {row['wall_s']:.0f} |", flush=True)
    for r in rows:
        print(f"{r['arm']} {r['dataset']} first turns:", *(repr(x) for x in r["examples"]), sep="\n  ")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": ident, "args": vars(args), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
