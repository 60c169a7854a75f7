"""SIOP (verifier-free outcome potential) and IGPO (gold-reference information gain).

Both score support at τ_0 (the prompt), τ_1..τ_{T-1} and τ_T (the prefix ending with the
final assistant turn); turn t's reward is the potential difference ΔΦ_t = Φ_t − Φ_{t−1},
and the final turn gets ΔΦ_T plus its outcome term. A rollout with at most one assistant
turn gets only the outcome term. NaN/inf rewards become 0.

SIOP, per group (defaults = the official code): cluster the final answers (answered
rollouts only) into modes c with share m(c); evidence r(c) from the tool results;
q(c) ∝ m(c)·exp(η·r(c)) when the group has more than one cluster, else q = 1; support
p~_t(c) = Σ_y α_y p(y | τ_t) over the first N_ref distinct answers y of the cluster (equal
α), τ_t ending with assistant turn t (before its observation); Φ_t = q(c)·log(p~_t + ε);
outcome term (1 − λ)·q(c). Unanswered rollouts get q = 0 and zero rewards.

IGPO (defaults = the official code): the first gold answer is the only reference, τ_t
ends after turn t's observation, the information gain is the probability difference
(Φ_t = p_t), and the outcome term is IGPO's F1 against the gold answers, or its format
penalty (−2) when the transcript's tags are unbalanced or there is no answer.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from turngym.episode import Episode, EpisodeGroup
from turngym.rewards.base import GroupScores, finite, outcome_score
from turngym.rewards.equivalence import cluster_answers, make_equivalence
from turngym.rewards.evidence import EVIDENCE_SOURCES, cluster_evidence, make_evidence
from turngym.rewards.support import (
    PREFIX_MODES,
    TOKEN_MODES,
    PseudoAnswer,
    check_tokenizer,
    continuation,
    end_of_turn_text,
    make_scorer,
    scoring_points,
)


def _log(x: float) -> float:
    """log that gives -inf for 0 (support can underflow) and passes NaN through, for ``finite`` to catch."""
    return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)


@dataclass
class _PotentialMachinery:
    scorer: Any = None  # a model (name, directory, mapping), a scorer object (e.g. shared by siop and igpo), or 'policy'
    lam: float = 0.5
    eps: float = 1e-8
    prefix: str = "before_observation"
    pseudo_answer: Any = "official"
    tokens: str = "ids"  # "ids": the policy's own ids (same tokenizer required); "text": re-tokenise
    final_turn_gain: bool = True  # score τ_T and give the final turn ΔΦ_T
    _scorer: Any = field(default=None, init=False, repr=False)
    _tok_cache: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")
        if self.prefix not in PREFIX_MODES:
            raise ValueError(f"prefix must be one of {PREFIX_MODES}, got {self.prefix!r}")
        if self.tokens not in TOKEN_MODES:
            raise ValueError(f"tokens must be one of {TOKEN_MODES}, got {self.tokens!r}")
        PseudoAnswer.make(self.pseudo_answer)

    def bind_scorer(self, scorer: Any) -> None:
        """Use this scorer object (e.g. the live policy, or one model shared by several wrappers)."""
        self._scorer = scorer
        self._tok_cache = {}

    def _get_scorer(self) -> Any:
        if self._scorer is None:
            self._scorer = make_scorer(self.scorer)
        return self._scorer

    def _tokenizer_facts(self, tok: Any) -> dict[str, Any]:
        """End-of-turn text and fingerprint of the scorer's tokenizer (computed once)."""
        if id(tok) not in self._tok_cache:
            from turngym.agents.tokenization import tokenizer_fingerprint

            fp = tokenizer_fingerprint(tok) if self.tokens == "ids" and hasattr(tok, "convert_ids_to_tokens") else None
            self._tok_cache[id(tok)] = {"eot": end_of_turn_text(tok), "fingerprint": fp}
        return self._tok_cache[id(tok)]

    def supports(self, episode: Episode, references: Sequence[str], weights: Sequence[float]) -> list[float]:
        """p~_t at every scoring point τ_0..τ_T of ``episode`` (τ_T dropped when ``final_turn_gain`` is off)."""
        scorer = self._get_scorer()
        tok = scorer.tokenizer
        facts = self._tokenizer_facts(tok)
        if self.tokens == "ids" and episode.prompt_ids is not None and facts["fingerprint"] is not None:
            check_tokenizer(episode, tok, facts["fingerprint"])
        pseudo = PseudoAnswer.for_episode(self.pseudo_answer, episode)
        conts = [continuation(tok, pseudo, r, facts["eot"]) for r in references]
        points = scoring_points(episode, tok, self.prefix, self.tokens)
        if not self.final_turn_gain:
            points = points[:-1]
        table = scorer.mean_logprobs(points, conts)
        return [sum(a * math.exp(lp) for a, lp in zip(weights, row, strict=True)) for row in table]

    def potential(self, p: float, q: float) -> float:
        return q * _log(p + self.eps)

    def turn_rewards(self, n_turns: int, q: float, support: Sequence[float],
                     outcome_term: float) -> tuple[list[float], list[float]]:
        """Rewards per turn and the potentials: ΔΦ_t on turn t, plus the outcome term on the final turn."""
        if n_turns == 0:
            return [], []
        if n_turns == 1:
            return [finite(outcome_term)], []
        phi = [self.potential(p, q) for p in support]
        gains = [phi[i + 1] - phi[i] for i in range(len(phi) - 1)]
        rewards = [finite(g) for g in gains[: n_turns - 1]]
        final_gain = gains[n_turns - 1] if len(gains) >= n_turns else 0.0
        rewards.append(finite(final_gain + outcome_term))
        return rewards, phi


@dataclass
class SIOPReward(_PotentialMachinery):
    # its paired estimator: SIOP's compute_siop_turn_level_advantage (biased when lengths vary: docs/estimators.md)
    estimator: ClassVar[str] = "turn"
    equivalence: Any = "auto"
    evidence: Any = "auto"
    eta: float = 1.0
    n_ref: int = 3
    evidence_source: str = "tool_results"  # or "observations": every observation counts
    premise_chars: int | None = 2000
    name: str = "siop"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_ref < 1:
            raise ValueError(f"n_ref must be >= 1, got {self.n_ref}")
        if self.evidence_source not in EVIDENCE_SOURCES:
            raise ValueError(f"evidence_source must be one of {EVIDENCE_SOURCES}, got {self.evidence_source!r}")

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        group = EpisodeGroup.of(episodes)
        question = group.question
        cl = cluster_answers(question, [e.final_answer for e in group], make_equivalence(self.equivalence, group.episodes))
        evidence = make_evidence(self.evidence)
        k = len(cl.members)
        answers = [[str(episodes[i].final_answer).strip() for i in mem] for mem in cl.members]
        r = [cluster_evidence(evidence, question, answers[c][0], [episodes[i] for i in cl.members[c]],
                              self.evidence_source, self.premise_chars) for c in range(k)]
        m = [cl.share(c) for c in range(k)]
        if k > 1:
            raw = [m[c] * math.exp(self.eta * r[c]) for c in range(k)]
            q = [x / sum(raw) for x in raw]
        else:
            q = [1.0] * k
        refs = [list(dict.fromkeys(a))[: self.n_ref] for a in answers]
        rewards, potentials, supports = [], [], []
        for ep, lab in zip(episodes, cl.labels, strict=True):
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


IGPO_FORMAT_TAGS = ("code", "tool_call", "think", "answer")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def igpo_tags_balanced(text: str) -> bool:
    """IGPO's format check: every tag of IGPO_FORMAT_TAGS opened as often as closed, each opening closed after it."""
    for tag in IGPO_FORMAT_TAGS:
        start, end = f"<{tag}>", f"</{tag}>"
        if text.count(start) != text.count(end):
            return False
        pos = text.find(start)
        while pos != -1:
            close = text.find(end, pos)
            if close == -1:
                return False
            pos = text.find(start, close + 1)
    return True


def igpo_normalize(text: str) -> str:
    """IGPO's answer normalisation: lower case, punctuation to spaces, whitespace collapsed (articles kept)."""
    text = text.lower()
    for ch in string.punctuation:
        text = text.replace(ch, " ")
    return " ".join(text.split())


def igpo_f1(answer: str, golds: Sequence[str]) -> float:
    """IGPO's F1: over sets of words (not multisets), the best over the gold answers."""
    pred = set(igpo_normalize(answer).split())
    best = 0.0
    for g in golds:
        gold = set(igpo_normalize(str(g)).split())
        common = len(pred & gold)
        if pred and gold and common:
            p, r = common / len(pred), common / len(gold)
            best = max(best, 2 * p * r / (p + r))
    return best


@dataclass
class IGPOReward(_PotentialMachinery):
    estimator: ClassVar[str] = "igpo_separate"  # its paired estimator (outcome and process rewards z-scored apart)
    lam: float = 0.0  # official: the outcome term is the F1 itself (weight 1)
    prefix: str = "after_observation"
    gain: str = "probability"  # official: p_t − p_{t−1}; "log_probability": log(p_t + ε) − log(p_{t−1} + ε)
    final_reward: str = "f1"  # official: IGPO's F1; "outcome": the env's gold verdict (``metric``)
    format_penalty: float | None = -2.0  # official; None: no format check
    metric: str | None = None
    name: str = "igpo"
    requires_gold: ClassVar[bool] = True  # every episode needs a gold answer (ablate scores it where they have one)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gain not in ("probability", "log_probability"):
            raise ValueError(f"gain must be 'probability' or 'log_probability', got {self.gain!r}")
        if self.final_reward not in ("f1", "outcome"):
            raise ValueError(f"final_reward must be 'f1' or 'outcome', got {self.final_reward!r}")

    def potential(self, p: float, q: float) -> float:
        return q * p if self.gain == "probability" else q * _log(p + self.eps)

    def outcome(self, ep: Episode, golds: Sequence[str]) -> float:
        if self.format_penalty is not None:
            transcript = "".join(t.action + (t.observation or "") for t in ep.turns)
            if ep.final_answer is None or not igpo_tags_balanced(transcript):
                return float(self.format_penalty)
        if self.final_reward == "outcome":
            return outcome_score(ep, self.metric)
        return igpo_f1(str(ep.final_answer or ""), golds)

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if not episodes:
            raise ValueError("score_group needs at least one episode")
        rewards, potentials, outcomes = [], [], []
        for ep in episodes:
            golds = [str(a) for a in ep.task.get("answers", []) if str(a).strip()]
            if not golds:
                raise ValueError(f"igpo needs a gold answer; episode {ep.id} has none")
            sup = self.supports(ep, golds[:1], [1.0]) if len(ep.turns) > 1 else []
            o = self.outcome(ep, golds)
            rew, phi = self.turn_rewards(len(ep.turns), 1.0, sup, (1 - self.lam) * o)
            rewards.append(rew)
            potentials.append(phi)
            outcomes.append(o)
        return GroupScores(rewards, {"potentials": potentials, "outcome": outcomes})
