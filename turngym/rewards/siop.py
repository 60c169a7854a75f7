"""SIOP (verifier-free outcome potential) and IGPO (gold-reference information gain).

SIOP, per group: cluster the final answers (answered rollouts only) into modes c with
share m(c); evidence r(c) from the tool observations; q(c) ∝ m(c)·exp(η·r(c)) when the
group has more than one cluster, else q = 1; support p~_t(c) = Σ_y α_y p(y | τ≤t) over
the first N_ref distinct answers y of the rollout's cluster (equal α); potential
Φ_t = q(c)·log(p~_t + ε). Turn i's reward is Φ_{i+1} − Φ_i; the final turn gets
(1 − λ)·q(c). Unanswered rollouts get zeros; NaN/inf become 0.

IGPO is the same machinery with the gold answer as the only reference and q = 1; its
final turn gets (1 − λ) times the gold outcome.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from turngym.episode import Episode
from turngym.rewards.base import GroupScores, check_group, finite, outcome_score, register_reward
from turngym.rewards.equivalence import cluster_answers, make_equivalence
from turngym.rewards.evidence import cluster_evidence, make_evidence
from turngym.rewards.support import default_pseudo_answer, episode_prefix_ids, make_scorer


def _log(x: float) -> float:
    """log that gives -inf for 0 (support can underflow) and passes NaN through, for ``finite`` to catch."""
    return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)


@dataclass
class _PotentialMachinery:
    scorer: Any = None
    lam: float = 0.5
    eps: float = 1e-8
    prefix: str = "after_observation"
    pseudo_answer: str | None = None
    _scorer: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")

    def _get_scorer(self) -> Any:
        if self._scorer is None:
            self._scorer = make_scorer(self.scorer)
        return self._scorer

    def supports(self, episode: Episode, references: Sequence[str], weights: Sequence[float]) -> list[float]:
        """p~_t for every scoring point of ``episode``."""
        scorer = self._get_scorer()
        tok = scorer.tokenizer
        cue_text = self.pseudo_answer if self.pseudo_answer is not None else default_pseudo_answer(episode.env_id)
        cue = tok(cue_text, add_special_tokens=False)["input_ids"]
        refs = [tok(r, add_special_tokens=False)["input_ids"] for r in references]
        points = episode_prefix_ids(episode, tok, self.prefix)
        table = scorer.mean_logprobs(points, cue, refs)
        return [sum(a * math.exp(lp) for a, lp in zip(weights, row)) for row in table]

    def turn_rewards(self, n_turns: int, q: float, support: Sequence[float], final_bonus: float) -> tuple[list[float], list[float]]:
        """Rewards per turn and the potentials Φ_0..Φ_{T-1}."""
        phi = [q * _log(p + self.eps) for p in support]
        rewards = [finite(phi[i + 1] - phi[i]) for i in range(n_turns - 1)]
        if n_turns:
            rewards.append(finite(final_bonus))
        return rewards, phi


@register_reward("siop")
@dataclass
class SIOPReward(_PotentialMachinery):
    equivalence: Any = "auto"
    evidence: Any = "auto"
    eta: float = 1.0
    n_ref: int = 3
    name: str = "siop"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_ref < 1:
            raise ValueError(f"n_ref must be >= 1, got {self.n_ref}")

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        check_group(episodes)
        question = str(episodes[0].task.get("question", ""))
        cl = cluster_answers(question, [e.final_answer for e in episodes], make_equivalence(self.equivalence, episodes[0].env_id))
        evidence = make_evidence(self.evidence)
        k = len(cl.members)
        answers = [[str(episodes[i].final_answer).strip() for i in mem] for mem in cl.members]
        r = [cluster_evidence(evidence, question, answers[c][0], [episodes[i] for i in cl.members[c]]) for c in range(k)]
        m = [cl.share(c) for c in range(k)]
        if k > 1:
            raw = [m[c] * math.exp(self.eta * r[c]) for c in range(k)]
            q = [x / sum(raw) for x in raw]
        else:
            q = [1.0] * k
        refs = [list(dict.fromkeys(a))[: self.n_ref] for a in answers]
        rewards, potentials, supports = [], [], []
        for ep, lab in zip(episodes, cl.labels):
            if lab is None:
                rewards.append([0.0] * len(ep.turns))
                potentials.append(None)
                supports.append(None)
                continue
            weights = [1.0 / len(refs[lab])] * len(refs[lab])
            sup = self.supports(ep, refs[lab], weights) if len(ep.turns) > 1 else []
            rew, phi = self.turn_rewards(len(ep.turns), q[lab], sup, (1 - self.lam) * q[lab])
            rewards.append(rew)
            potentials.append(phi)
            supports.append(sup)
        diag = {"clusters": cl.to_dict(), "m": m, "r": r, "q": q, "references": refs,
                "potentials": potentials, "support": supports}
        return GroupScores(rewards, diag)


@register_reward("igpo")
@dataclass
class IGPOReward(_PotentialMachinery):
    metric: str | None = None
    name: str = "igpo"

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if not episodes:
            raise ValueError("score_group needs at least one episode")
        rewards, potentials = [], []
        for ep in episodes:
            golds = [str(a) for a in ep.task.get("answers", []) if str(a).strip()]
            if not golds:
                raise ValueError(f"igpo needs a gold answer; episode {ep.id} has none")
            sup = self.supports(ep, golds[:1], [1.0]) if len(ep.turns) > 1 else []
            rew, phi = self.turn_rewards(len(ep.turns), 1.0, sup, (1 - self.lam) * outcome_score(ep, self.metric))
            rewards.append(rew)
            potentials.append(phi)
        return GroupScores(rewards, {"potentials": potentials})
