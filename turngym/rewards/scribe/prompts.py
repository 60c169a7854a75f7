"""Prompts and JSON schemas for SCRIBE's four LLM roles: decompose, distill, route, judge."""

from __future__ import annotations

import json
from typing import Any

from turngym.episode import Episode

SCALE = {
    "3": "rigorous: the step is correct and complete, every condition stated",
    "2": "correct with a minor slip (e.g. a boundary left implicit: c < 44.75 without stating c <= 44)",
    "1": "a major gap: the step is partly right but misses something the result depends on",
    "0": "wrong or premature: the step is incorrect, or taken before what it needs was established",
}
MAX_TURN_CHARS = 1200

DECOMPOSE_SCHEMA = {
    "type": "object", "required": ["steps"],
    "properties": {"steps": {"type": "array", "maxItems": 24, "items": {
        "type": "object", "required": ["subgoal", "skill", "first_turn", "last_turn"],
        "properties": {"subgoal": {"type": "string", "maxLength": 400}, "skill": {"type": "string", "maxLength": 300},
                       "first_turn": {"type": "integer", "minimum": 0}, "last_turn": {"type": "integer", "minimum": 0}}}}},
}
DISTILL_SCHEMA = {
    "type": "object", "required": ["name", "when_to_use", "checklist", "pitfalls"],
    "properties": {
        "name": {"type": "string", "maxLength": 120},
        "when_to_use": {"type": "string", "maxLength": 600},
        "checklist": {"type": "array", "minItems": 1, "maxItems": 8, "items": {"type": "string", "maxLength": 300}},
        "pitfalls": {"type": "array", "maxItems": 8, "items": {
            "type": "object", "required": ["mistake", "score"],
            "properties": {"mistake": {"type": "string", "maxLength": 300},
                           "score": {"type": "integer", "enum": [0, 1, 2]}}}},
    },
}
JUDGE_SCHEMA = {
    "type": "object", "required": ["score"],
    "properties": {"score": {"type": "integer", "enum": [0, 1, 2, 3]},
                   "violated": {"type": "array", "maxItems": 8, "items": {"type": "string", "maxLength": 300}}},
}


def route_schema(ids: list[str]) -> dict[str, Any]:
    return {"type": "object", "required": ["prototype"],
            "properties": {"prototype": {"type": "string", "enum": ids + ["none"]}}}


def render_turns(episode: Episode, first: int = 0, last: int | None = None) -> str:
    """The agent's actions and the environment's replies, turn by turn, clipped per turn."""
    last = len(episode.turns) - 1 if last is None else last
    lines = []
    for t in episode.turns[first:last + 1]:
        lines.append(f"[turn {t.index}] agent: {t.action[:MAX_TURN_CHARS]}")
        if t.observation:
            lines.append(f"[turn {t.index}] environment: {t.observation[:MAX_TURN_CHARS]}")
    return "\n".join(lines)


def task_text(episode: Episode) -> str:
    q = episode.task.get("question")
    if q:
        return str(q)
    return "\n".join(m.get("content", "") for m in episode.prompt if m.get("role") == "user")[:2000]


def decompose_prompt(episode: Episode) -> str:
    return (
        "Split this agent trajectory into steps. For each step give the subgoal it pursues, the general skill it "
        "uses (a short reusable description, not specific to this problem), and the first and last turn it spans.\n\n"
        f"Task: {task_text(episode)}\n\nTrajectory:\n{render_turns(episode)}\n\n"
        f"Turns are numbered 0 to {len(episode.turns) - 1}. Reply with JSON only: "
        '{"steps": [{"subgoal": "...", "skill": "...", "first_turn": 0, "last_turn": 0}]}')


def distill_prompt(examples: list[dict[str, str]]) -> str:
    shown = "\n".join(f"- skill: {e['skill']} | subgoal: {e['subgoal']}" + (f" | step: {e['span'][:300]}" if e.get("span") else "")
                      for e in examples)
    return (
        "These steps from different agent trajectories use the same skill. Write a rubric for that skill: a short "
        "name, when the skill applies, a checklist of what good execution looks like, and common mistakes, each with "
        "the score (0, 1 or 2) a step making that mistake deserves on this 0-3 scale:\n"
        + "\n".join(f"{k}: {v}" for k, v in sorted(SCALE.items(), reverse=True))
        + f"\n\nExamples:\n{shown}\n\nReply with JSON only: "
        '{"name": "...", "when_to_use": "...", "checklist": ["..."], "pitfalls": [{"mistake": "...", "score": 1}]}')


def route_prompt(subgoal: str, skill: str, prototypes: list[Any]) -> str:
    listed = "\n".join(f"- {p.id}: {p.name}. Use when: {p.when_to_use}" for p in prototypes)
    return (f"Which skill rubric applies to this step? Answer \"none\" if no rubric fits.\n\nStep subgoal: {subgoal}\n"
            f"Skill used: {skill}\n\nRubrics:\n{listed}\n\nReply with JSON only, e.g. {{\"prototype\": \"none\"}}")


def judge_prompt(task: str, subgoal: str, span: str, prototype: Any) -> str:
    rubric = {"skill": prototype.name, "when_to_use": prototype.when_to_use, "checklist": prototype.checklist,
              "common_mistakes": prototype.pitfalls, "scale": prototype.scale}
    return (
        "Grade one step of an agent's work against the rubric below, and only against it.\n\n"
        f"Task: {task[:2000]}\nSubgoal of the step: {subgoal}\n\nThe step:\n{span}\n\n"
        f"Rubric:\n{json.dumps(rubric, indent=1)}\n\n"
        "Reply with JSON only: the score (0, 1, 2 or 3) and the checklist items the step violates, copied exactly, "
        'e.g. {"score": 2, "violated": ["a checklist item"]}')
