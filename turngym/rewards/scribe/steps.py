"""Routing and judging steps (decomposition is in :mod:`turngym.rewards.scribe.decompose`).

* Routers map a step to a prototype id or ``None`` (unmatched), top-down through the
  library's two levels: the best skill family if it clears the family threshold, then its
  best skill if that clears the skill threshold, else the family itself (fallback to the
  parent). By cosine similarity to centroids (:class:`EmbeddingRouter`) or by asking the
  LLM at each level (:class:`LLMRouter`).
* :func:`judge_steps` scores each routed step against its prototype's rubric only: an
  integer 0-3 and the checklist items it violates (unknown items are dropped).
  :func:`judge_steps_open` is the PRM: the same step and scale, open-ended criteria.
  The judge sees the step's text (clipped to ``judge_tokens``, head and tail kept) and,
  for the last step of a turn, the environment's reply (clipped to ``observation_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from turngym.episode import Episode
from turngym.rewards.scribe.decompose import TokenCounter, counter_for
from turngym.rewards.scribe.library import SkillItem, SkillLibrary
from turngym.rewards.scribe.prompts import (
    JUDGE_SCHEMA,
    PRM_SCHEMA,
    judge_prompt,
    prm_prompt,
    route_prompt,
    route_schema,
    task_text,
)


@dataclass
class EmbeddingRouter:
    """Top-down by cosine similarity: family if >= ``family_threshold``, then its skill if >= ``skill_threshold``."""

    embedder: Any
    family_threshold: float = 0.35
    skill_threshold: float = 0.5

    def route(self, items: Sequence[SkillItem], library: SkillLibrary) -> list[str | None]:
        families = library.families()
        if not items or not families:
            return [None] * len(items)
        protos = library.prototypes
        sims = self.embedder.embed([it.text for it in items]) @ library.centroids().T
        col = {p.id: j for j, p in enumerate(protos)}
        out: list[str | None] = []
        for i in range(len(items)):
            fam = max(families, key=lambda p: sims[i, col[p.id]])
            if sims[i, col[fam.id]] < self.family_threshold:
                out.append(None)
                continue
            kids = library.children(fam.id)
            best = max(kids, key=lambda p: sims[i, col[p.id]]) if kids else None
            out.append(best.id if best is not None and sims[i, col[best.id]] >= self.skill_threshold else fam.id)
        return out


@dataclass
class LLMRouter:
    """The LLM picks a family (or "none"), then one of its skills (or "none": stay with the family)."""

    llm: Any

    def route(self, items: Sequence[SkillItem], library: SkillLibrary) -> list[str | None]:
        families = library.families()
        if not items or not families:
            return [None] * len(items)
        ids = [p.id for p in families]
        replies = self.llm.call_many([(route_prompt(it.subgoal, it.skill, families), route_schema(ids)) for it in items])
        out: list[str | None] = [None if r is None or r["prototype"] == "none" else r["prototype"] for r in replies]
        deeper = [i for i, r in enumerate(out) if r is not None and library.children(r)]
        if deeper:
            jobs = []
            for i in deeper:
                kids = library.children(out[i])  # type: ignore[arg-type]
                jobs.append((route_prompt(items[i].subgoal, items[i].skill, kids), route_schema([k.id for k in kids])))
            for i, r in zip(deeper, self.llm.call_many(jobs), strict=True):
                if r is not None and r["prototype"] != "none":
                    out[i] = r["prototype"]
        return out


@dataclass
class Judgement:
    score: int | None                      # 0-3; None when the judge never gave valid JSON
    violated: list[str] = field(default_factory=list)
    unknown_violations: int = 0            # listed items that are not on the checklist (dropped)


def step_view(ep: Episode, item: SkillItem, counter: TokenCounter, judge_tokens: int,
              observation_tokens: int) -> tuple[str, str]:
    """The step's text as the judge sees it, and the environment's reply when the step ends its turn."""
    turn = ep.turns[item.turn]
    reply = ""
    if item.end >= len(turn.action) and turn.observation:
        reply = counter.clip(turn.observation, observation_tokens)
    return counter.clip(item.span, judge_tokens), reply


def judge_prompts(jobs: Sequence[tuple[Episode, SkillItem, Any]], llm: Any, judge_tokens: int = 768,
                  observation_tokens: int = 192) -> list[tuple[str, dict[str, Any]]]:
    counter = counter_for(llm)
    out = []
    for ep, it, proto in jobs:
        span, reply = step_view(ep, it, counter, judge_tokens, observation_tokens)
        out.append((judge_prompt(task_text(ep), it.subgoal, span, proto, reply), JUDGE_SCHEMA))
    return out


def read_judgements(jobs: Sequence[tuple[Episode, SkillItem, Any]], replies: Sequence[Any]) -> list[Judgement]:
    out = []
    for (_, _, proto), reply in zip(jobs, replies, strict=True):
        if reply is None:
            out.append(Judgement(None))
            continue
        listed = reply.get("violated", [])
        known = [v for v in listed if v in proto.checklist]
        out.append(Judgement(int(reply["score"]), known, len(listed) - len(known)))
    return out


def judge_steps(jobs: Sequence[tuple[Episode, SkillItem, Any]], llm: Any, judge_tokens: int = 768,
                observation_tokens: int = 192) -> list[Judgement]:
    """One rubric judge call per (episode, step, prototype), all in one batch."""
    return read_judgements(jobs, llm.call_many(judge_prompts(jobs, llm, judge_tokens, observation_tokens)))


def open_prompts(jobs: Sequence[tuple[Episode, SkillItem]], llm: Any, judge_tokens: int = 768,
                 observation_tokens: int = 192) -> list[tuple[str, dict[str, Any]]]:
    counter = counter_for(llm)
    out = []
    for ep, it in jobs:
        span, reply = step_view(ep, it, counter, judge_tokens, observation_tokens)
        out.append((prm_prompt(task_text(ep), it.subgoal, span, reply), PRM_SCHEMA))
    return out


def judge_steps_open(jobs: Sequence[tuple[Episode, SkillItem]], llm: Any, judge_tokens: int = 768,
                     observation_tokens: int = 192) -> list[Judgement]:
    """The PRM judge: one open-ended call per (episode, step), all in one batch."""
    replies = llm.call_many(open_prompts(jobs, llm, judge_tokens, observation_tokens))
    return [Judgement(None) if r is None else Judgement(int(r["score"])) for r in replies]

