"""The ``scribe`` reward: per-turn process rewards from skill-prototype rubrics, judged per step.

For each episode of a group: decompose it into ⟨subgoal, skill, step⟩ items with character
spans inside turns (:mod:`~turngym.rewards.scribe.decompose`: token-budget windows, a turn
may hold several steps, no step crosses a turn), route each step top-down through the
two-level library (skill family, then skill; fallback to the family; ``None`` when no
family clears its threshold), and judge each routed step against that prototype's rubric
only. Step values and the per-turn aggregate are defined in
:mod:`~turngym.rewards.scribe.scoring`: judged ``score / 3``, unmatched steps and judge
failures ``unmatched_value`` (default 0.5, neutral, counted); ``p_t`` = mean of the turn's
steps; ``r_t = (1 - w) * p_t`` plus ``w * outcome`` on the final turn. Every step's span,
route and verdict is kept in ``diagnostics["steps"]``.

Adaptive refresh: skill items from every scored group go into a bounded buffer. With no
library, one is built as soon as ``bootstrap_items`` items are buffered; afterwards the
trainer calls :meth:`ScribeReward.observe` each step and the library is re-clustered
from the buffer every ``refresh_every`` steps (SCRIBE: 1,000), as version + 1, saved to
``library_path`` when given. :meth:`ScribeReward.training_metrics` gives the trainer the
training-dynamics measures of :mod:`~turngym.rewards.scribe.dynamics`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from turngym.agents.policy import Policy
from turngym.episode import Episode
from turngym.rewards.base import GroupReward, GroupScores, outcome_score
from turngym.rewards.scribe.decompose import decompose
from turngym.rewards.scribe.dynamics import DynamicsRecorder
from turngym.rewards.scribe.embed import SentenceEmbedder
from turngym.rewards.scribe.library import SkillLibrary, build_library
from turngym.rewards.scribe.llm import JSONLLM
from turngym.rewards.scribe.scoring import NEUTRAL, StepRecord, check_scoring, group_scores, step_value
from turngym.rewards.scribe.steps import EmbeddingRouter, LLMRouter, judge_steps


def make_llm(llm: Any, base_url: str | None = None, **kwargs: Any) -> JSONLLM:
    """A :class:`JSONLLM` from a JSONLLM, a policy, or a model spec ("default", a directory, a hub id)."""
    if isinstance(llm, JSONLLM):
        return llm
    if isinstance(llm, str):
        if base_url:
            from turngym.agents.openai_compat import OpenAICompatPolicy

            policy: Any = OpenAICompatPolicy(model=llm, base_url=base_url)
        else:
            from turngym.agents.loading import load_hf_policy

            policy = load_hf_policy(llm, dtype="float32" if llm != "default" else "auto", device=None)
        return JSONLLM(policy, **kwargs)
    if isinstance(llm, Policy):
        return JSONLLM(llm, **kwargs)
    raise TypeError(f"llm must be a JSONLLM, a policy or a model name, got {type(llm).__name__}")


def judge_costs(llm: JSONLLM, library: SkillLibrary | None) -> dict[str, Any]:
    """An LLM-judged reward's costs for reports: the judge's call counts and the library it routes with."""
    lib = {"version": library.version, "prototypes": len(library.prototypes)} if library is not None \
        else {"version": None, "prototypes": 0}
    return {"llm": llm.stats.to_dict(), "library": lib}


@dataclass
class ScribeReward(GroupReward):
    # the SCRIBE paper says GRPO without saying how turn rewards enter and has no public code: the unbiased
    # turn-level estimator (returns-to-go minus a leave-one-out baseline; docs/estimators.md)
    estimator: ClassVar[str] = "turn_loo"
    needs_judge: ClassVar[bool] = True
    learns_library: ClassVar[bool] = True
    scores_single_episodes: ClassVar[bool] = True
    llm: Any = "default"
    library: SkillLibrary | str | None = None
    router: str = "embedding"
    embedder: Any = "default"
    outcome_weight: float = 0.5
    outcome_metric: str | None = None
    unmatched_value: float = NEUTRAL
    turn_aggregate: str = "mean"
    family_threshold: float = 0.35
    skill_threshold: float = 0.5
    window_tokens: int = 1024
    unlocated_steps: str = "drop"        # or "whole_turn": see turngym.rewards.scribe.decompose
    locate_steps: str = "exact"          # or "fuzzy" (paraphrased quotes): see turngym.rewards.scribe.decompose
    fuzzy_min_coverage: float = 0.6
    judge_tokens: int = 768
    observation_tokens: int = 192
    refresh_every: int = 1000
    bootstrap_items: int = 64
    buffer_size: int = 5000
    library_path: str | None = None
    min_cluster_size: int = 5
    family_similarity: float = 0.3
    llm_base_url: str | None = None
    guided_json: bool = False
    name: str = "scribe"
    refreshes: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_scoring(self.unmatched_value, self.turn_aggregate, self.outcome_weight)
        if self.router not in ("embedding", "llm"):
            raise ValueError(f"router must be 'embedding' or 'llm', got {self.router!r}")
        if self.refresh_every < 1:
            raise ValueError("refresh_every must be >= 1")
        self.llm = make_llm(self.llm, self.llm_base_url, guided_json=self.guided_json)
        if isinstance(self.library, str):
            self.library = SkillLibrary.load(self.library)
        self.embedder = SentenceEmbedder(self.embedder) if isinstance(self.embedder, str) else self.embedder
        self.step_router = (EmbeddingRouter(self.embedder, self.family_threshold, self.skill_threshold)
                        if self.router == "embedding" else LLMRouter(self.llm))
        self._buffer: deque = deque(maxlen=self.buffer_size)
        self._step = 0
        self._last_refresh = 0
        self.dynamics = DynamicsRecorder()

    # ------------------------------------------------------------------ library upkeep

    def observe(self, step: int, episodes: Sequence[Episode] | None = None) -> None:
        """Trainer hook, once per step: refresh the library every ``refresh_every`` steps."""
        self._step = int(step)
        if self.library is not None and self._step - self._last_refresh >= self.refresh_every and self._buffer:
            self.rebuild()

    def training_metrics(self) -> dict[str, float]:
        """Trainer hook, once per step: uncertainty and plan separability over the groups scored since."""
        return self.dynamics.metrics()

    def rebuild(self) -> SkillLibrary | None:
        version = self.library.version + 1 if isinstance(self.library, SkillLibrary) else 1
        lib, timings = build_library(list(self._buffer), self.embedder, self.llm, version=version, step=self._step,
                                     min_cluster_size=self.min_cluster_size, family_similarity=self.family_similarity)
        self._last_refresh = self._step
        record = {"step": self._step, "version": version, "items": len(self._buffer),
                  "prototypes": len(lib.prototypes), **timings}
        if lib.prototypes:  # an empty rebuild (every distillation failed) keeps the old library
            self.library = lib
            if self.library_path:
                lib.save(self.library_path)
        else:
            record["kept_previous"] = True
        self.refreshes.append(record)
        return self.library if isinstance(self.library, SkillLibrary) else None

    def decompose(self, episodes: Sequence[Episode]) -> list[Any]:
        return decompose(episodes, self.llm, self.window_tokens, self.observation_tokens, self.unlocated_steps,
                         self.locate_steps, self.fuzzy_min_coverage)

    def fit(self, episodes: Sequence[Episode]) -> SkillLibrary | None:
        """Build the library from these episodes' decompositions (cached, so scoring reuses them)."""
        for d in self.decompose(episodes):
            self._buffer.extend(d.items)
        return self.rebuild() if self._buffer else None

    # ------------------------------------------------------------------ scoring

    def costs(self) -> dict[str, Any]:
        return judge_costs(self.llm, self.library if isinstance(self.library, SkillLibrary) else None)

    def score_episode(self, episode: Episode) -> list[float]:
        return self.score_group([episode]).rewards[0]

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if not episodes:
            raise ValueError("score_group needs at least one episode")
        calls_before = self.llm.stats.calls
        decomps = self.decompose(episodes)
        for d in decomps:
            self._buffer.extend(d.items)
        if self.library is None and len(self._buffer) >= self.bootstrap_items:
            self.rebuild()
        lib: SkillLibrary | None = self.library if isinstance(self.library, SkillLibrary) else None
        flat = [(e, it) for e, d in zip(episodes, decomps, strict=True) for it in d.items]
        routes = self.step_router.route([it for _, it in flat], lib) if lib is not None else [None] * len(flat)
        jobs = [(e, it, lib.by_id(r)) for (e, it), r in zip(flat, routes, strict=True) if r is not None and lib is not None]
        verdicts = iter(judge_steps(jobs, self.llm, self.judge_tokens, self.observation_tokens) if jobs else [])
        steps: dict[str, list[StepRecord]] = {e.id: [] for e in episodes}
        for (e, it), r in zip(flat, routes, strict=True):
            j = next(verdicts) if r is not None else None
            status = "unmatched" if r is None else "judged" if j is not None and j.score is not None else "judge_failed"
            score = None if j is None else j.score
            steps[e.id].append(StepRecord(it.turn, it.start, it.end, it.subgoal, it.skill, status,
                                          step_value(score, status, self.unmatched_value), r, score,
                                          [] if j is None else j.violated))
        per_episode = [steps[e.id] for e in episodes]
        family_of = {} if lib is None else {p.id: p.parent or p.id for p in lib.prototypes}
        self.dynamics.add_group(per_episode, [outcome_score(e, self.outcome_metric) for e in episodes], family_of)
        return group_scores(episodes, decomps, per_episode, neutral=self.unmatched_value, aggregate=self.turn_aggregate,
                            outcome_weight=self.outcome_weight, outcome_metric=self.outcome_metric,
                            judge_calls=len(jobs), llm=self.llm, calls_before=calls_before,
                            library_version=lib.version if lib is not None else None)
