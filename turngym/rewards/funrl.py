"""Tool-call rewards: ``funrl`` (FunRL/EGPO's binary reward) and ``toolcall_dense`` (per-turn components).

``funrl`` is the reward the FunRL/EGPO paper defines: a strict, single-criterion binary signal,
1 on the final turn when the episode is well-formed *and* correct (BFCL's checker verdict, the
env's gold outcome elsewhere), else 0. Train it with the ``egpo`` estimator for EGPO.

``toolcall_dense`` is turngym's low-level per-turn reward (it was called ``funrl`` before the
paper's reward took the name). Each turn scores the mean of the components that apply to it:

* ``well_formed``: the action parsed (no ``parse_error``);
* ``executed``: the env ran the turn's calls without error, as the per-turn metric the env
  declares says (``RewardNeeds.tool_ok_metrics``: Calculator and BFCL ``tool_ok``, MathCode
  ``exec_ok``, SearchQA ``search_ok``); only for turns that made calls and on which the env
  recorded that metric (SearchQA's answer call has none). A turn that made calls in an episode
  whose env declares no such metric is an error, never a guess;
* ``checker``: the verdict of the checker the env declares (``RewardNeeds.checker_metric`` or
  ``checker_outcome``): BFCL's user-turn check on the step that closed a multi-turn user turn,
  its outcome verdict on the last (only) turn of a single-turn entry.

In a conversation with several user turns (the env declares ``RewardNeeds.user_turn_metric``,
as BFCL's multi-turn and memory categories do) a step that ends a user turn with plain text is a
reply, not a malformed call, so it is well-formed; one that starts a call (``[`` or
``<tool_call>``) and fails to decode is not. Rewards are in [0, 1]; no outcome term. The reward
reads no env's metric names: only the ones its episodes' env declares.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from turngym.episode import Episode, Turn
from turngym.rewards.base import GroupReward, GroupScores, final_turn_rewards, outcome_score


def executed(episode: Episode, turn: Turn) -> bool | None:
    """Whether the env ran the turn's calls without error, read from the metric its env declares;
    None for a turn that made no calls or on which the env recorded no verdict."""
    if not turn.tool_calls:
        return None
    needs = episode.needs("toolcall_dense reads whether a tool call ran from the metric the env declares.")
    if not needs.tool_ok_metrics:
        raise ValueError(f"toolcall_dense: turn {turn.index} of episode {episode.id} ({episode.env_id}) made tool calls, "
                         "but its env declares no per-turn metric saying whether they ran (RewardNeeds.tool_ok_metrics; "
                         "episodes of SearchQA-v0 written before it declared search_ok lack it): play them again "
                         "or score them with a reward that does not read tool execution")
    return needs.tool_succeeded(turn.metrics)


def well_formed(episode: Episode, turn: Turn) -> bool:
    """The action parsed; in a conversation with several user turns (declared by the env), a step that ends
    a user turn with plain text is a reply, not a malformed call."""
    if turn.parse_error is None:
        return True
    needs = episode.needs("A turn that did not parse is a reply to the user only where the env declares "
                          "user turns (RewardNeeds.user_turn_metric).", reads=("user_turn_metric",))
    attempt = turn.action.strip().startswith("[") or "<tool_call>" in turn.action
    return needs.is_reply(turn.metrics) and not turn.tool_calls and not attempt


def checker(episode: Episode, turn: Turn) -> bool | None:
    """The verdict of the checker the env declares on this turn; None where it gave none."""
    needs = episode.needs("toolcall_dense reads a checker's verdict from the metric or outcome the env declares.",
                          reads=("checker_metric", "checker_outcome"))
    return needs.checker_verdict(turn.metrics, episode.outcome, last=turn.index == len(episode.turns) - 1)


def turn_components(episode: Episode, turn: Turn) -> dict[str, float]:
    parts = {"well_formed": float(well_formed(episode, turn))}
    ok = executed(episode, turn)
    if ok is not None:
        parts["executed"] = float(ok)
    verdict = checker(episode, turn)
    if verdict is not None:
        parts["checker"] = float(verdict)
    return parts


@dataclass
class ToolCallDenseReward(GroupReward):
    estimator: ClassVar[str] = "turn_loo"  # per-turn rewards: the unbiased turn-level estimator (no official code)
    scores_single_episodes: ClassVar[bool] = True
    name: str = "toolcall_dense"

    def score_episode(self, episode: Episode) -> list[float]:
        out = []
        for t in episode.turns:
            parts = turn_components(episode, t)
            out.append(sum(parts.values()) / len(parts))
        return out

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if not episodes:
            raise ValueError("score_group needs at least one episode")
        comps: list[list[dict[str, Any]]] = [[turn_components(e, t) for t in e.turns] for e in episodes]
        return GroupScores([self.score_episode(e) for e in episodes], {"components": comps})


_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


@dataclass
class FunRLReward(GroupReward):
    """FunRL/EGPO's binary reward: 1 on the final turn iff every turn is well-formed and the outcome is correct.

    ``require_think``: the paper's format also asks for a non-empty ``<think>…</think>`` before
    the call; turngym's prompts do not ask for one, so it is off unless set.
    ``metric``: the outcome field that decides correctness (default: correct / em / bfcl_valid).
    """

    # a reward on the final turn only: GRPO, EGPO's base advantage (the paper pairs it with EGPO, ``egpo``, whose
    # entropy bonus changes the objective; no official code has been released)
    estimator: ClassVar[str] = "grpo"
    scores_single_episodes: ClassVar[bool] = True

    require_think: bool = False
    metric: str | None = None
    name: str = "funrl"

    def components(self, episode: Episode) -> dict[str, float]:
        formed = all(well_formed(episode, t) for t in episode.turns)
        if self.require_think:
            formed = formed and all(any(m.strip() for m in _THINK.findall(t.action)) for t in episode.turns)
        return {"format": float(bool(episode.turns) and formed),
                "correct": float(outcome_score(episode, self.metric) == 1.0)}

    def score_episode(self, episode: Episode) -> list[float]:
        parts = self.components(episode)
        return final_turn_rewards(episode, parts["format"] * parts["correct"])

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if not episodes:
            raise ValueError("score_group needs at least one episode")
        return GroupScores([self.score_episode(e) for e in episodes], {"components": [self.components(e) for e in episodes]})
