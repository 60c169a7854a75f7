"""Judge reliability, as SCRIBE's paper reports it.

* Repeat consistency: each (span, rubric) is judged ``n`` times with sampling on and the
  cache off; the exact-agreement rate is the share of spans whose ``n`` scores are all
  equal (also reported: mean pairwise agreement and the score spread).
* Cross-instance consistency: spans routed to the same prototype whose first judgement
  named the same violated checklist items, from different episodes (the same skill and
  the same error on different problems), should get the same score; reported as the
  share of such groups whose scores agree exactly, and the mean within-group spread.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections import defaultdict
from typing import Any, Sequence

from turngym.episode import Episode
from turngym.rewards.scribe.library import SkillItem, SkillLibrary
from turngym.rewards.scribe.llm import JSONLLM
from turngym.rewards.scribe.steps import Judgement, judge_items

Job = tuple[Episode, SkillItem, Any]


def repeat_consistency(jobs: Sequence[Job], llm: JSONLLM, n: int = 5, temperature: float = 0.7) -> dict[str, Any]:
    if n < 2:
        raise ValueError("repeat consistency needs n >= 2 judgements per span")
    sampler = dataclasses.replace(llm, temperature=temperature, use_cache=False, cache_path=None,
                                  stats=type(llm.stats)())
    runs = [judge_items(jobs, sampler) for _ in range(n)]
    per_span = [[runs[r][i].score for r in range(n)] for i in range(len(jobs))]
    valid = [s for s in per_span if all(x is not None for x in s)]
    exact = [len(set(s)) == 1 for s in valid]
    pairs = [a == b for s in valid for a, b in itertools.combinations(s, 2)]
    return {"spans": len(jobs), "judged_every_time": len(valid), "repeats": n, "temperature": temperature,
            "exact_agreement": sum(exact) / len(exact) if exact else None,
            "pairwise_agreement": sum(pairs) / len(pairs) if pairs else None,
            "mean_score_range": statistics.mean(max(s) - min(s) for s in valid) if valid else None,
            "llm": sampler.stats.to_dict()}


def cross_instance_consistency(jobs: Sequence[Job], verdicts: Sequence[Judgement]) -> dict[str, Any]:
    groups: dict[tuple[str, tuple[str, ...]], dict[str, int]] = defaultdict(dict)
    for (ep, _, proto), v in zip(jobs, verdicts):
        if v.score is None or not v.violated:
            continue
        key = (proto.id, tuple(sorted(v.violated)))
        groups[key].setdefault(ep.id, v.score)  # one span per episode: different problems
    multi = {k: list(g.values()) for k, g in groups.items() if len(g) >= 2}
    agree = [len(set(s)) == 1 for s in multi.values()]
    return {"groups": len(multi), "spans": sum(len(s) for s in multi.values()),
            "exact_agreement": sum(agree) / len(agree) if agree else None,
            "mean_score_range": statistics.mean(max(s) - min(s) for s in multi.values()) if multi else None}


def routed_jobs(episodes: Sequence[Episode], library: SkillLibrary, llm: JSONLLM, router: Any) -> list[Job]:
    from turngym.rewards.scribe.steps import decompose

    decomps = decompose(episodes, llm)
    flat = [(e, it) for e, d in zip(episodes, decomps) for it in d.items]
    routes = router.route([it for _, it in flat], library)
    return [(e, it, library.by_id(r)) for (e, it), r in zip(flat, routes) if r is not None]
