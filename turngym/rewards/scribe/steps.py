"""Decomposition, routing and judging: the three per-episode SCRIBE stages.

* :func:`decompose` asks the LLM for ⟨subgoal, skill, first/last turn⟩ items and keeps
  only items whose turn range lies inside the episode.
* Routers map an item to a prototype id or ``None`` ("no prototype"): by nearest
  centroid in embedding space (:class:`EmbeddingRouter`) or by asking the LLM
  (:class:`LLMRouter`).
* :func:`judge_items` scores each routed item's span against its prototype's rubric
  only: an integer 0-3 and the checklist items it violates (unknown items are dropped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from turngym.episode import Episode
from turngym.rewards.scribe.library import SkillItem, SkillLibrary
from turngym.rewards.scribe.prompts import (DECOMPOSE_SCHEMA, JUDGE_SCHEMA, decompose_prompt, judge_prompt,
                                            render_turns, route_prompt, route_schema, task_text)


@dataclass
class Decomposition:
    items: list[SkillItem]
    dropped: int = 0          # items with turn ranges outside the episode
    failed: bool = False      # the LLM never produced valid JSON


def decompose(episodes: Sequence[Episode], llm: Any) -> list[Decomposition]:
    replies = llm.call_many([(decompose_prompt(ep), DECOMPOSE_SCHEMA) for ep in episodes])
    out = []
    for ep, reply in zip(episodes, replies):
        if reply is None:
            out.append(Decomposition([], failed=True))
            continue
        items, dropped = [], 0
        n = len(ep.turns)
        for s in reply["steps"]:
            first, last = int(s["first_turn"]), int(s["last_turn"])
            if not 0 <= first <= last < n:
                dropped += 1
                continue
            items.append(SkillItem(s["subgoal"].strip(), s["skill"].strip(), first, last, ep.id,
                                   render_turns(ep, first, last)))
        out.append(Decomposition(items, dropped))
    return out


class Router(Protocol):
    def route(self, items: Sequence[SkillItem], library: SkillLibrary) -> list[str | None]:
        ...


@dataclass
class EmbeddingRouter:
    """Nearest prototype centroid by cosine similarity; below ``min_similarity``: no prototype."""

    embedder: Any
    min_similarity: float = 0.35

    def route(self, items: Sequence[SkillItem], library: SkillLibrary) -> list[str | None]:
        if not items or not library.prototypes:
            return [None] * len(items)
        sims = self.embedder.embed([it.text for it in items]) @ library.centroids().T
        best = np.argmax(sims, axis=1)
        return [library.prototypes[b].id if sims[i, b] >= self.min_similarity else None for i, b in enumerate(best)]


@dataclass
class LLMRouter:
    """The LLM picks a prototype id from the library's list, or "none"."""

    llm: Any

    def route(self, items: Sequence[SkillItem], library: SkillLibrary) -> list[str | None]:
        if not items or not library.prototypes:
            return [None] * len(items)
        ids = [p.id for p in library.prototypes]
        replies = self.llm.call_many([(route_prompt(it.subgoal, it.skill, library.prototypes), route_schema(ids))
                                      for it in items])
        return [None if r is None or r["prototype"] == "none" else r["prototype"] for r in replies]


@dataclass
class Judgement:
    score: int | None                      # 0-3; None when the judge never gave valid JSON
    violated: list[str] = field(default_factory=list)
    unknown_violations: int = 0            # listed items that are not on the checklist (dropped)


def judge_items(jobs: Sequence[tuple[Episode, SkillItem, Any]], llm: Any) -> list[Judgement]:
    """One judge call per (episode, item, prototype), all in one batch."""
    replies = llm.call_many([(judge_prompt(task_text(ep), it.subgoal, it.span, proto), JUDGE_SCHEMA)
                             for ep, it, proto in jobs])
    out = []
    for (_, _, proto), reply in zip(jobs, replies):
        if reply is None:
            out.append(Judgement(None))
            continue
        listed = reply.get("violated", [])
        known = [v for v in listed if v in proto.checklist]
        out.append(Judgement(int(reply["score"]), known, len(listed) - len(known)))
    return out
