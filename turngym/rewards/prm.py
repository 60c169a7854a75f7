"""``prm``: the open-ended LLM-judge process reward, SCRIBE's PRM baseline.

The same decomposition into steps (same prompts, windows and spans as ``scribe``), the
same judge model and the same 0-3 scale, but no skill library and no rubric: each step is
graded on open-ended criteria ("is it correct, does it make progress"). Step values, the
per-turn aggregate and the outcome term are SCRIBE's (:mod:`turngym.rewards.scribe.scoring`),
so the two rewards differ only in what the judge is told: the paper's comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from turngym.episode import Episode
from turngym.rewards.base import GroupReward, GroupScores
from turngym.rewards.scribe.decompose import decompose
from turngym.rewards.scribe.reward import judge_costs, make_llm
from turngym.rewards.scribe.scoring import NEUTRAL, StepRecord, check_scoring, group_scores, step_value
from turngym.rewards.scribe.steps import judge_steps_open


@dataclass
class PRMReward(GroupReward):
    estimator: ClassVar[str] = "turn_loo"  # per-turn judge scores: the unbiased turn-level estimator
    needs_judge: ClassVar[bool] = True
    scores_single_episodes: ClassVar[bool] = True
    llm: Any = "default"
    outcome_weight: float = 0.5
    outcome_metric: str | None = None
    unmatched_value: float = NEUTRAL      # value of a step whose judgement failed (no valid JSON)
    turn_aggregate: str = "mean"
    window_tokens: int = 1024
    unlocated_steps: str = "drop"        # or "whole_turn": see turngym.rewards.scribe.decompose
    locate_steps: str = "exact"          # or "fuzzy" (paraphrased quotes): see turngym.rewards.scribe.decompose
    fuzzy_min_coverage: float = 0.6
    judge_tokens: int = 768
    observation_tokens: int = 192
    llm_base_url: str | None = None
    guided_json: bool = False
    name: str = "prm"

    def __post_init__(self) -> None:
        check_scoring(self.unmatched_value, self.turn_aggregate, self.outcome_weight)
        self.llm = make_llm(self.llm, self.llm_base_url, guided_json=self.guided_json)

    def decompose(self, episodes: Sequence[Episode]) -> list[Any]:
        return decompose(episodes, self.llm, self.window_tokens, self.observation_tokens, self.unlocated_steps,
                         self.locate_steps, self.fuzzy_min_coverage)

    def costs(self) -> dict[str, Any]:
        return judge_costs(self.llm, None)

    def score_episode(self, episode: Episode) -> list[float]:
        return self.score_group([episode]).rewards[0]

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if not episodes:
            raise ValueError("score_group needs at least one episode")
        calls_before = self.llm.stats.calls
        decomps = self.decompose(episodes)
        jobs = [(e, it) for e, d in zip(episodes, decomps, strict=True) for it in d.items]
        verdicts = iter(judge_steps_open(jobs, self.llm, self.judge_tokens, self.observation_tokens) if jobs else [])
        steps: dict[str, list[StepRecord]] = {e.id: [] for e in episodes}
        for e, it in jobs:
            j = next(verdicts)
            status = "judged" if j.score is not None else "judge_failed"
            steps[e.id].append(StepRecord(it.turn, it.start, it.end, it.subgoal, it.skill, status,
                                          step_value(j.score, status, self.unmatched_value), None, j.score))
        return group_scores(episodes, decomps, [steps[e.id] for e in episodes], neutral=self.unmatched_value,
                            aggregate=self.turn_aggregate, outcome_weight=self.outcome_weight,
                            outcome_metric=self.outcome_metric, judge_calls=len(jobs), llm=self.llm,
                            calls_before=calls_before)
