"""Digits-v0: a two-turn task whose right behaviour is known (answer with digits only).

It exists to check that training moves rewards: the outcome is the share of digit
characters in the agent's replies, a dense signal that even a tiny random model can learn
from on a CPU in minutes. The per-turn ``digit_share`` metric is the turn's own ground truth.
"""

from __future__ import annotations

from typing import Any

from turngym.envs.base import ActionResult, TextEnv
from turngym.envs.tools import EnvTool, ToolParam
from turngym.episode import RewardNeeds

PROMPT = "Reply with digits only. Turn {turn}:"


def digit_share(text: str) -> float:
    chars = [c for c in text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


class DigitsEnv(TextEnv):
    env_name = "turngym/Digits-v0"
    dataset_name = "digits"
    outcome_metric = None  # its per-turn rewards (digit shares) already are the task
    observation_role = None
    reward_needs = RewardNeeds(answer_kind="none", answer_cue="answer_tag")  # no final answer, no tools

    def __init__(self, max_turns: int = 2, render_mode: str | None = None):
        super().__init__(max_turns=max_turns, render_mode=render_mode)

    def num_items(self) -> int:
        return 1000

    def declared_tools(self) -> tuple[EnvTool, ...]:
        return (EnvTool("reply", "Send this turn's reply; the episode ends after its last turn.",
                        (ToolParam("text", str, "The reply, digits only."),), lambda args: args["text"]),)

    def get_item(self, index: int) -> dict[str, Any]:
        return {"dataset": "digits", "split": "train", "index": index, "id": f"digits-{index}",
                "question": f"{PROMPT.format(turn=1)} (#{index})", "answers": []}

    def make_prompt(self, task: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": task["question"]}]

    def act(self, action: str) -> ActionResult:
        share = digit_share(action)
        turn = len(self.episode.turns) + 1
        return ActionResult(observation=f"\n{PROMPT.format(turn=turn + 1)}\n", reward=share,
                            metrics={"digit_share": share})

    def grade(self, episode) -> dict[str, Any]:
        shares = [t.metrics.get("digit_share", 0.0) for t in episode.turns]
        return {"correct": sum(shares) / len(shares) if shares else 0.0}
