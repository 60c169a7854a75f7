"""The ``scribe`` reward: per-turn process rewards from skill-prototype rubrics.

For each episode of a group: decompose it into ⟨subgoal, skill, turn span⟩ items, route
each item to a prototype of the library (or to none), and judge each routed item's span
against that prototype's rubric only.

Aggregation (per turn t): every judged item whose span covers t contributes score / 3
(so [0, 1]); the turn's process reward p_t is the mean of those contributions, 0 when no
judged item covers it (listed in diagnostics as ``unjudged_turns``). The reward is
``r_t = (1 - w) * p_t`` plus ``w * outcome`` on the final turn, with ``w =
outcome_weight`` (0 gives a pure process reward).

Adaptive refresh: skill items from every scored group go into a bounded buffer. With no
library, one is built as soon as ``bootstrap_items`` items are buffered; afterwards the
trainer calls :meth:`ScribeReward.observe` each step and the library is re-clustered
from the buffer every ``refresh_every`` steps (SCRIBE: 1,000), as version + 1, saved to
``library_path`` when given.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

from turngym.episode import Episode
from turngym.rewards.base import GroupScores, finite, outcome_score, register_reward
from turngym.rewards.scribe.embed import SentenceEmbedder
from turngym.rewards.scribe.library import SkillLibrary, build_library
from turngym.rewards.scribe.llm import JSONLLM
from turngym.rewards.scribe.steps import EmbeddingRouter, LLMRouter, decompose, judge_items


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
    if hasattr(llm, "generate"):
        return JSONLLM(llm, **kwargs)
    raise TypeError(f"llm must be a JSONLLM, a policy or a model name, got {type(llm).__name__}")


@register_reward("scribe")
@dataclass
class ScribeReward:
    llm: Any = "default"
    library: SkillLibrary | str | None = None
    router: str = "embedding"
    embedder: Any = "default"
    outcome_weight: float = 0.5
    outcome_metric: str | None = None
    refresh_every: int = 1000
    bootstrap_items: int = 64
    buffer_size: int = 5000
    library_path: str | None = None
    min_cluster_size: int = 5
    llm_base_url: str | None = None
    guided_json: bool = False
    name: str = "scribe"
    refreshes: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.0 <= self.outcome_weight <= 1.0:
            raise ValueError(f"outcome_weight must be in [0, 1], got {self.outcome_weight}")
        if self.router not in ("embedding", "llm"):
            raise ValueError(f"router must be 'embedding' or 'llm', got {self.router!r}")
        if self.refresh_every < 1:
            raise ValueError("refresh_every must be >= 1")
        self.llm = make_llm(self.llm, self.llm_base_url, guided_json=self.guided_json)
        if isinstance(self.library, str):
            self.library = SkillLibrary.load(self.library)
        self.embedder = SentenceEmbedder(self.embedder) if isinstance(self.embedder, str) else self.embedder
        self._router = EmbeddingRouter(self.embedder) if self.router == "embedding" else LLMRouter(self.llm)
        self._buffer: deque = deque(maxlen=self.buffer_size)
        self._step = 0
        self._last_refresh = 0

    # ------------------------------------------------------------------ library upkeep

    def observe(self, step: int, episodes: Sequence[Episode] | None = None) -> None:
        """Trainer hook, once per step: refresh the library every ``refresh_every`` steps."""
        self._step = int(step)
        if self.library is not None and self._step - self._last_refresh >= self.refresh_every and self._buffer:
            self.rebuild()

    def rebuild(self) -> SkillLibrary | None:
        version = self.library.version + 1 if isinstance(self.library, SkillLibrary) else 1
        lib, timings = build_library(list(self._buffer), self.embedder, self.llm, version=version, step=self._step,
                                     min_cluster_size=self.min_cluster_size)
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

    def fit(self, episodes: Sequence[Episode]) -> SkillLibrary | None:
        """Build the library from these episodes' decompositions (cached, so scoring reuses them)."""
        for d in decompose(episodes, self.llm):
            self._buffer.extend(d.items)
        return self.rebuild() if self._buffer else None

    # ------------------------------------------------------------------ scoring

    def score_episode(self, episode: Episode) -> list[float]:
        return self.score_group([episode]).rewards[0]

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if not episodes:
            raise ValueError("score_group needs at least one episode")
        calls_before = self.llm.stats.calls
        decomps = decompose(episodes, self.llm)
        for d in decomps:
            self._buffer.extend(d.items)
        if self.library is None and len(self._buffer) >= self.bootstrap_items:
            self.rebuild()
        lib: SkillLibrary | None = self.library if isinstance(self.library, SkillLibrary) else None
        flat = [(e, it) for e, d in zip(episodes, decomps) for it in d.items]
        routes = self._router.route([it for _, it in flat], lib) if lib is not None else [None] * len(flat)
        jobs = [(e, it, lib.by_id(r)) for (e, it), r in zip(flat, routes) if r is not None and lib is not None]
        verdicts = iter(judge_items(jobs, self.llm) if jobs else [])
        per_episode: dict[str, list[dict[str, Any]]] = {e.id: [] for e in episodes}
        for (e, it), r in zip(flat, routes):
            j = next(verdicts) if r is not None else None
            per_episode[e.id].append({"subgoal": it.subgoal, "skill": it.skill, "turns": [it.first_turn, it.last_turn],
                                      "prototype": r, "score": None if j is None else j.score,
                                      "violated": [] if j is None else j.violated})
        rewards, unjudged = [], []
        for e, d in zip(episodes, decomps):
            process = self._turn_process(len(e.turns), per_episode[e.id])
            r = [(1.0 - self.outcome_weight) * p for p in process]
            if r:
                r[-1] += self.outcome_weight * outcome_score(e, self.outcome_metric)
            rewards.append([finite(x) for x in r])
            unjudged.append([t for t in range(len(e.turns)) if not any(
                i["score"] is not None and i["turns"][0] <= t <= i["turns"][1] for i in per_episode[e.id])])
        diagnostics = {
            "items": [per_episode[e.id] for e in episodes],
            "decomposition_failed": [d.failed for d in decomps],
            "unjudged_turns": unjudged,
            "judge_calls": len(jobs),
            "llm_calls": self.llm.stats.calls - calls_before,
            "llm": self.llm.stats.to_dict(),
            "library_version": lib.version if lib is not None else None,
        }
        return GroupScores(rewards, diagnostics)

    @staticmethod
    def _turn_process(n_turns: int, items: list[dict[str, Any]]) -> list[float]:
        out = []
        for t in range(n_turns):
            scores = [i["score"] / 3.0 for i in items if i["score"] is not None and i["turns"][0] <= t <= i["turns"][1]]
            out.append(sum(scores) / len(scores) if scores else 0.0)
        return out
