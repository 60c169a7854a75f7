"""Judge reliability, as SCRIBE's paper measures it, for the rubric judge and the PRM on the same steps.

Both judges grade the *same* steps: the episodes are decomposed once (SCRIBE's decomposer),
routed once (SCRIBE's router), and the routed steps are judged by the rubric judge
(``scribe``) and by the open-ended judge (``prm``) of the same model.

* **Repeat consistency**: each step is judged ``repeats`` times with sampling on
  (``temperature``) and the cache off. Reported: the share of steps whose scores all agree
  (exact agreement), the share of agreeing pairs of judgements (pairwise agreement), the
  mean score range and the mean per-step standard deviation.
* **Cross-instance consistency**: pairs of steps from different episodes that the router
  sent to the same prototype *and* whose texts are embedding neighbours (cosine similarity
  of their all-MiniLM-L6-v2 span embeddings >= ``neighbour_threshold``): the same skill
  done in nearly the same way on different problems. Neither criterion looks at a judge's
  output, so the grouping is not circular. Reported per judge, on its first (greedy)
  judgement: the share of pairs with equal scores and the mean absolute score difference.
  Pairs whose judge prompts are identical (the same step and task in copies of one episode,
  as when K samples coincide) agree by construction under greedy judging: they are counted
  (``identical_prompt_pairs``) and the agreement is also given over the distinct pairs alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from turngym.episode import Episode
from turngym.rewards.scribe.library import SkillItem, SkillLibrary
from turngym.rewards.scribe.llm import JSONLLM
from turngym.rewards.scribe.steps import judge_prompts, open_prompts

Job = tuple[Episode, SkillItem, Any]


def sampler_of(llm: JSONLLM, temperature: float, max_new_tokens: int | None = None) -> JSONLLM:
    return dataclasses.replace(llm, temperature=temperature, use_cache=False, cache_path=None,
                               stats=type(llm.stats)(), max_new_tokens=max_new_tokens or llm.max_new_tokens)


def repeat_consistency(prompts: Sequence[tuple[str, dict[str, Any]]], llm: JSONLLM, n: int = 5,
                       temperature: float = 0.7, max_new_tokens: int | None = None,
                       progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Judge every prompt ``n`` times with sampling; agreement of the scores. ``max_new_tokens``: what
    each repeat may generate (default: the judge's own). A local judge's score is drawn from its
    log-probabilities over 0-3 before anything is generated, so a small value changes no score, only
    the rest of the reply (violated items, reason), which repeat consistency does not use. ``progress``
    hears each repeat as it starts."""
    if n < 2:
        raise ValueError("repeat consistency needs n >= 2 judgements per step")
    sampler = sampler_of(llm, temperature, max_new_tokens)
    runs = []
    for r in range(n):
        if progress is not None:
            progress(f"repeat {r + 1}/{n} over {len(prompts)} steps…")
        runs.append(sampler.call_many(prompts))
    per_step = [[None if runs[r][i] is None else int(runs[r][i]["score"]) for r in range(n)]
                for i in range(len(prompts))]
    valid = [s for s in per_step if all(x is not None for x in s)]
    exact = [len(set(s)) == 1 for s in valid]
    pairs = [a == b for s in valid for a, b in itertools.combinations(s, 2)]
    return {"steps": len(prompts), "judged_every_time": len(valid), "repeats": n, "temperature": temperature,
            "exact_agreement": sum(exact) / len(exact) if exact else None,
            "pairwise_agreement": sum(pairs) / len(pairs) if pairs else None,
            "mean_score_range": statistics.mean(max(s) - min(s) for s in valid) if valid else None,
            "mean_score_std": statistics.mean(statistics.pstdev(s) for s in valid) if valid else None,
            "llm": sampler.stats.to_dict()}


def neighbour_pairs(jobs: Sequence[Job], embedder: Any, threshold: float = 0.8) -> list[tuple[int, int]]:
    """Index pairs of steps from different episodes, same prototype, span embeddings within ``threshold``."""
    if len(jobs) < 2:
        return []
    vecs = embedder.embed([it.span for _, it, _ in jobs])
    by_proto: dict[str, list[int]] = {}
    for k, (_, _, proto) in enumerate(jobs):
        by_proto.setdefault(proto.id, []).append(k)
    out = []
    for idx in by_proto.values():
        if len(idx) < 2:
            continue
        sims = vecs[idx] @ vecs[idx].T
        for a, b in zip(*np.nonzero(np.triu(sims >= threshold, k=1)), strict=True):
            i, j = idx[a], idx[b]
            if jobs[i][0].id != jobs[j][0].id:
                out.append((i, j))
    return sorted(out)


def _agreement(both: Sequence[tuple[int, int]]) -> tuple[float | None, float | None]:
    if not both:
        return None, None
    return sum(a == b for a, b in both) / len(both), float(np.mean([abs(a - b) for a, b in both]))


def cross_instance_consistency(pairs: Sequence[tuple[int, int]], scores: Sequence[int | None],
                               identical: Sequence[bool] | None = None) -> dict[str, Any]:
    """``identical``: per pair, whether the two judge prompts are the same (then also reported: how many
    are, and the agreement over the others)."""
    scored = [(k, (scores[i], scores[j])) for k, (i, j) in enumerate(pairs)
              if scores[i] is not None and scores[j] is not None]
    exact, diff = _agreement([b for _, b in scored])
    out: dict[str, Any] = {"pairs": len(pairs), "scored_pairs": len(scored), "exact_agreement": exact,
                           "mean_abs_difference": diff}
    if identical is not None:
        if len(identical) != len(pairs):
            raise ValueError(f"identical needs one flag per pair: {len(identical)} flags, {len(pairs)} pairs")
        distinct = [b for k, b in scored if not identical[k]]
        out["identical_prompt_pairs"] = sum(map(bool, identical))
        out["distinct_scored_pairs"] = len(distinct)
        out["distinct_exact_agreement"], out["distinct_mean_abs_difference"] = _agreement(distinct)
    return out


def routed_jobs(episodes: Sequence[Episode], library: SkillLibrary, decompositions: Sequence[Any],
                router: Any) -> list[Job]:
    flat = [(e, it) for e, d in zip(episodes, decompositions, strict=True) for it in d.items]
    routes = router.route([it for _, it in flat], library)
    return [(e, it, library.by_id(r)) for (e, it), r in zip(flat, routes, strict=True) if r is not None]


def reliability(episodes: Sequence[Episode], scribe: Any, repeats: int = 5, temperature: float = 0.7,
                neighbour_threshold: float = 0.8, with_prm: bool = True,
                repeat_max_new_tokens: int | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Repeat and cross-instance consistency of the rubric judge and (``with_prm``) the open judge,
    on the same routed steps of ``episodes``; ``scribe`` is a ``ScribeReward`` with a library.
    ``progress`` hears each stage's name as it starts."""
    if not isinstance(scribe.library, SkillLibrary):
        raise ValueError("reliability needs a SCRIBE reward with a skill library (fit it or load one)")
    say = progress or (lambda text: None)
    say(f"decomposing {len(episodes)} episodes into steps…")
    decomps = scribe.decompose(episodes)
    say(f"routing {sum(len(d.items) for d in decomps)} steps to the library's skills…")
    jobs = routed_jobs(episodes, scribe.library, decomps, scribe.step_router)
    say(f"embedding {len(jobs)} routed steps for cross-instance pairs…")
    pairs = neighbour_pairs(jobs, scribe.embedder, neighbour_threshold)
    out: dict[str, Any] = {"episodes": len(episodes), "steps": sum(len(d.items) for d in decomps),
                           "routed_steps": len(jobs), "neighbour_threshold": neighbour_threshold,
                           "judge": scribe.llm.name, "judges": {}}
    prompt_sets = {"scribe": judge_prompts(jobs, scribe.llm, scribe.judge_tokens, scribe.observation_tokens)}
    if with_prm:
        prompt_sets["prm"] = open_prompts([(e, it) for e, it, _ in jobs], scribe.llm, scribe.judge_tokens,
                                          scribe.observation_tokens)
    for name, prompts in prompt_sets.items():
        say(f"{name} judge: first judgement of {len(prompts)} steps…")
        first = scribe.llm.call_many(prompts) if prompts else []
        scores = [None if r is None else int(r["score"]) for r in first]
        out["judges"][name] = {
            "repeat": (repeat_consistency(prompts, scribe.llm, repeats, temperature, repeat_max_new_tokens,
                                          progress=None if progress is None else
                                          (lambda text, judge=name: progress(f"{judge} judge: {text}")))
                       if prompts else None),
            "cross_instance": cross_instance_consistency(pairs, scores, [prompts[i] == prompts[j] for i, j in pairs])}
    return out
