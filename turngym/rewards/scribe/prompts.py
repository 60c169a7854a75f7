"""Prompts and JSON schemas for SCRIBE's LLM roles (decompose, distill, route, judge) and the PRM judge."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from turngym.episode import Episode

SCALE = {
    "3": "rigorous: the step is correct and complete, every condition stated",
    "2": "correct with a minor slip (e.g. a boundary left implicit: c < 44.75 without stating c <= 44)",
    "1": "a major gap: the step is partly right but misses something the result depends on",
    "0": "wrong or premature: the step is incorrect, or taken before what it needs was established",
}

DECOMPOSE_SCHEMA = {
    "type": "object", "required": ["steps"],
    "properties": {"steps": {"type": "array", "maxItems": 32, "items": {
        "type": "object", "required": ["subgoal", "skill", "turn", "starts_with"],
        "properties": {"subgoal": {"type": "string", "maxLength": 400}, "skill": {"type": "string", "maxLength": 300},
                       "turn": {"type": "integer", "minimum": 0},
                       "starts_with": {"type": "string", "maxLength": 200}}}}},
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
PRM_SCHEMA = {
    "type": "object", "required": ["score"],
    "properties": {"score": {"type": "integer", "enum": [0, 1, 2, 3]},
                   "reason": {"type": "string", "maxLength": 600}},
}


def route_schema(ids: list[str]) -> dict[str, Any]:
    return {"type": "object", "required": ["prototype"],
            "properties": {"prototype": {"type": "string", "enum": ids + ["none"]}}}


def task_text(episode: Episode) -> str:
    q = episode.task.get("question")
    if q:
        return str(q)
    return "\n".join(m.get("content", "") for m in episode.prompt if m.get("role") == "user")[:2000]


def decompose_prompt(episode: Episode, window: Sequence[Any], counter: Any, observation_tokens: int) -> str:
    """One window of the trajectory: parts of turns (character ranges stated) and, after a turn's
    last part, the environment's reply, clipped to ``observation_tokens``."""
    lines = []
    for part in window:
        turn = episode.turns[part.turn]
        whole = part.start == 0 and part.end == len(turn.action)
        where = "" if whole else f", characters {part.start}-{part.end} of {len(turn.action)}"
        lines.append(f"[turn {part.turn}{where}] agent:\n{turn.action[part.start:part.end]}")
        if part.end == len(turn.action) and turn.observation:
            lines.append(f"[turn {part.turn}] environment:\n{counter.clip(turn.observation, observation_tokens)}")
    turns = sorted({p.turn for p in window})
    return (
        "Split the agent's work below into steps. A step is one move towards the answer: it pursues one subgoal with "
        "one skill. A turn may hold several steps; a step never continues into another turn. For each step give the "
        "subgoal, the general skill it uses (a short reusable description, not specific to this problem), the turn it "
        "is in, and starts_with: the first words of the step (about 5 to 10), copied exactly from the agent's text.\n\n"
        f"Task: {task_text(episode)}\n\nTrajectory (turns {turns[0]}-{turns[-1]}):\n" + "\n".join(lines) + "\n\n"
        'Reply with JSON only: {"steps": [{"subgoal": "...", "skill": "...", "turn": 0, "starts_with": "..."}]}')


def distill_prompt(examples: list[dict[str, str]]) -> str:
    shown = "\n".join(f"- skill: {e['skill']} | subgoal: {e['subgoal']}"
                      + (f" | step: {e['span'][:300]}" if e.get("span") else "")
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


def judge_prompt(task: str, subgoal: str, span: str, prototype: Any, reply: str = "") -> str:
    rubric = {"skill": prototype.name, "when_to_use": prototype.when_to_use, "checklist": prototype.checklist,
              "common_mistakes": prototype.pitfalls, "scale": prototype.scale}
    after = f"\n\nThe environment's reply after this step:\n{reply}" if reply else ""
    return (
        "Grade one step of an agent's work against the rubric below, and only against it.\n\n"
        f"Task: {task[:2000]}\nSubgoal of the step: {subgoal}\n\nThe step:\n{span}{after}\n\n"
        f"Rubric:\n{json.dumps(rubric, indent=1)}\n\n"
        "Reply with JSON only: the score (0, 1, 2 or 3) and the checklist items the step violates, copied exactly, "
        'e.g. {"score": 2, "violated": ["a checklist item"]}')


def prm_prompt(task: str, subgoal: str, span: str, reply: str = "") -> str:
    """The open-ended PRM judge: the same step and scale, no rubric."""
    after = f"\n\nThe environment's reply after this step:\n{reply}" if reply else ""
    return (
        "Grade one step of an agent's work: is it correct, and does it make progress towards solving the task?\n\n"
        f"Task: {task[:2000]}\nSubgoal of the step: {subgoal}\n\nThe step:\n{span}{after}\n\n"
        "Scale:\n" + "\n".join(f"{k}: {v}" for k, v in sorted(SCALE.items(), reverse=True)) + "\n\n"
        'Reply with JSON only: the score (0, 1, 2 or 3) and one sentence of reason, e.g. {"score": 2, "reason": "..."}')
