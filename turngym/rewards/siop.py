"""SIOP (verifier-free outcome potential) and IGPO (gold-reference information gain).

Both score support at τ_0 (the prompt) and τ_1..τ_{T-1}; SIOP also at τ_T (the prefix ending
with the final assistant turn). Turn t's reward is the potential difference ΔΦ_t = Φ_t − Φ_{t−1};
the final turn gets its outcome term (SIOP: plus ΔΦ_T). A rollout with at most one assistant
turn gets only the outcome term. Non-finite support, as the official SIOP code
(``siop_process_reward.py`` ``_aggregate_p_hat``): a reference whose log-probability is NaN or
±inf is left out of p~_t; a point with no finite reference is unscorable and the gains that use it
are 0, the outcome term is kept; a gain that is still NaN/inf becomes 0.

SIOP, per group (defaults = the official code): cluster the final answers (answered
rollouts only) into modes c with share m(c); evidence r(c) from the tool results;
q(c) ∝ m(c)·exp(η·r(c)) when the group has more than one cluster, else q = 1; support
p~_t(c) = Σ_y α_y p(y | τ_t) over the first N_ref distinct answers y of the cluster (equal
α), τ_t ending with assistant turn t (before its observation); Φ_t = q(c)·log(p~_t + ε);
outcome term (1 − λ)·q(c). Unanswered rollouts get q = 0 and zero rewards.

IGPO (defaults = the repository GuoqingWang1/IGPO): the first gold answer is the only reference,
τ_t ends after turn t's observation, the information gain is the probability difference
(Φ_t = p_t) on turns 1..T−1, and the answer turn gets IGPO's F1 of the transcript's first answer tag
against the first gold answer only, or its format penalty (−2) when the lower-cased executed transcript's
tags are unbalanced or it has no answer tag. A rollout cut by the turn limit keeps its gains only when it has more than 10 chat
pieces (T + 1 > 10), as the repository's length check does. ``igpo_siop`` is the SIOP
repository's gold-reference IGPO baseline (SIOP's machinery with the gold answer as reference).
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from turngym.episode import Episode, EpisodeGroup, Turn
from turngym.rewards.base import GroupReward, GroupScores, finite, outcome_score
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
    prompt_sharing_scope,
    scoring_points,
)


def support_of(weights: Sequence[float], logprobs: Sequence[float]) -> float | None:
    """p~ = Σ α·exp(lp) over the references whose mean log-probability is finite; None when none is
    (official SIOP ``siop_process_reward.py`` ``_aggregate_p_hat``: the α are not renormalised)."""
    terms = [a * math.exp(lp) for a, lp in zip(weights, logprobs, strict=True) if math.isfinite(lp)]
    return sum(terms) if terms else None


def _log(x: float) -> float:
    """log that gives -inf for 0 (support can underflow) and passes NaN through, for ``finite`` to catch."""
    return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)


@dataclass
class _PotentialMachinery(GroupReward, abstract=True):
    scorer: Any = None  # a model (name, directory, mapping), a scorer object (e.g. shared by siop and igpo), or 'policy'
    lam: float = 0.5
    eps: float = 1e-8
    prefix: str = "before_observation"
    pseudo_answer: Any = "official"
    tokens: str = "ids"  # "ids": the policy's own ids (same tokenizer required); "text": re-tokenise
    final_turn_gain: bool = True  # score τ_T and give the final turn ΔΦ_T
    _scorer: Any = field(default=None, init=False, repr=False)
    needs_scorer: ClassVar[bool] = True
    _tok_cache: dict = field(default_factory=dict, init=False, repr=False)
    _unopened_scope: ExitStack | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")
        if self.prefix not in PREFIX_MODES:
            raise ValueError(f"prefix must be one of {PREFIX_MODES}, got {self.prefix!r}")
        if self.tokens not in TOKEN_MODES:
            raise ValueError(f"tokens must be one of {TOKEN_MODES}, got {self.tokens!r}")
        PseudoAnswer.make(self.pseudo_answer)

    def scores_with_policy(self) -> bool:
        return self.scorer == "policy"

    def bind_scorer(self, scorer: Any) -> None:
        """Use this scorer object (e.g. the live policy, or one model shared by several rewards)."""
        self._scorer = scorer
        self._tok_cache = {}

    def _get_scorer(self) -> Any:
        if self._scorer is None:
            self._scorer = make_scorer(self.scorer)
        return self._scorer

    @contextmanager
    def _group_scope(self) -> Iterator[None]:
        """One group's scoring: the scorer's prompt-sharing scope, opened by the group's first support (so a group
        with nothing to score loads no scorer) and closed with the group."""
        with ExitStack() as scope:
            self._unopened_scope = scope
            try:
                yield
            finally:
                self._unopened_scope = None

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
        if self._unopened_scope is not None:  # the group's first support
            self._unopened_scope.enter_context(prompt_sharing_scope(scorer))
            self._unopened_scope = None
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
        return [support_of(weights, row) for row in table]

    def potential(self, p: float, q: float) -> float:
        return q * _log(p + self.eps)

    def turn_rewards(self, n_turns: int, q: float, support: Sequence[float | None],
                     outcome_term: float) -> tuple[list[float], list[float | None]]:
        """Rewards per turn and the potentials: ΔΦ_t on turn t, plus the outcome term on the final turn.

        An unscorable point (support None) makes the gains next to it 0; the outcome term is kept."""
        if n_turns == 0:
            return [], []
        if n_turns == 1:
            return [finite(outcome_term)], []
        phi = [None if p is None else self.potential(p, q) for p in support]
        gains = [0.0 if phi[i] is None or phi[i + 1] is None else finite(phi[i + 1] - phi[i])
                 for i in range(len(phi) - 1)]
        rewards = gains[: n_turns - 1]
        final_gain = gains[n_turns - 1] if len(gains) >= n_turns else 0.0
        rewards.append(finite(final_gain) + finite(outcome_term))
        return rewards, phi


@dataclass
class SIOPReward(_PotentialMachinery):
    # recommended: the unbiased turn-level estimator. The official pairing, compute_siop_turn_level_advantage
    # (``turn``), is biased when lengths vary (docs/estimators.md); configs/train_searchqa_siop.yaml reproduces it
    estimator: ClassVar[str] = "turn_loo"
    official_estimator: ClassVar[str | None] = "turn"
    equivalence: Any = "auto"
    evidence: Any = "auto"
    eta: float = 1.0
    n_ref: int = 3
    evidence_source: str = "tool_responses"  # official: every non-empty tool response; "tool_results": no tool
    # errors; "observations": every observation
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
        with self._group_scope():
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
IGPO_CHAT_PIECES_KEPT = 10  # info_gain.py: a rollout whose gains miss a turn keeps them only if it has > 10 pieces
TURN_LIMIT_GAINS = ("repository", "keep")
F1_GOLDS = ("first", "all")
F1_ANSWERS = ("first_tag", "env")
FINAL_REWARDS = ("f1", "outcome", "constant")


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


def executed_action(turn: Turn) -> str:
    """The action as the env executed it: a call opened by the env's forced prefill (``Turn.prefill``) that
    the env accepted and ran (tool calls parsed, no parse error) counts as closed, so its missing closing
    tag is added (vLLM's Hermes parser reads such an open call, ``<tool_call>(.*)``, the same way)."""
    action = turn.action
    if turn.prefill and turn.tool_calls and not turn.parse_error:
        for tag in IGPO_FORMAT_TAGS:
            start, end = f"<{tag}>", f"</{tag}>"
            if start in turn.prefill and action.count(start) > action.count(end):
                action += end
    return action


def igpo_transcript(episode: Episode) -> str:
    """The response IGPO's format check and F1 read: each executed action followed by its observation, the
    tool output of a last turn cut by the turn limit included (IGPO's ``generation.py`` lines 481-501 append
    that tool message before the response is rendered)."""
    return "".join(executed_action(t) + (t.observation or t.unshown_observation or "") for t in episode.turns)


def igpo_first_answer(transcript: str) -> str | None:
    """IGPO's answer (``info_gain.py`` lines 71 and 84-86): the first ``<answer>…</answer>`` of the lower-cased
    response, stripped; None when there is none. Read with two ``find``s, linear in the transcript: the regex
    ``<answer>(.*?)</answer>`` finds the same span (when the first opening tag has no closing tag after it, no
    later one has), but backtracks quadratically over many unclosed tags."""
    low = transcript.lower()
    start = low.find("<answer>")
    end = low.find("</answer>", start + len("<answer>")) if start >= 0 else -1
    return low[start + len("<answer>"):end].strip() if end >= 0 else None


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


def hit_turn_limit(episode: Episode) -> bool:
    """The rollout was cut by the turn limit while still calling tools (IGPO's loop leaves such a rollout
    active: its last turn is an executed call, no answer), not ended by the env or by a full context."""
    if not episode.turns or not episode.truncated or episode.terminated or "truncation" in episode.meta:
        return False
    last = episode.turns[-1]
    return episode.final_answer is None and bool(last.tool_calls) and not last.parse_error


@dataclass
class IGPOReward(_PotentialMachinery):
    """IGPO, defaults = its repository (GuoqingWang1/IGPO); every other behaviour is an option.

    ``final_turn_gain``: False (repository: the answer turn gets the F1 only) or True (also ΔΦ_T,
    scored at τ_T, as SIOP). ``turn_limit_gains``: ``"repository"`` (a rollout cut by the turn limit
    with T + 1 ≤ 10 chat pieces gets the F1 alone, its gains dropped) or ``"keep"``. ``f1_golds``:
    ``"first"`` (repository training: the first gold answer) or ``"all"`` (best over the gold answers).
    ``f1_answer``: ``"first_tag"`` (repository: the first ``<answer>`` tag of the lower-cased transcript; none:
    the format penalty) or ``"env"`` (the env's final answer, its last tag). The format check reads the
    lower-cased transcript, the tool output of a turn cut by the turn limit included.
    ``final_reward``: ``"f1"``, ``"outcome"`` (the env's verdict, ``metric``) or ``"constant"`` (1, the
    SIOP repository's gold-reference baseline); weighted by (1 − λ).
    """

    estimator: ClassVar[str] = "igpo"  # the IGPO repository's GRPO: returns-to-go minus the per-position mean
    official_estimator: ClassVar[str | None] = "igpo"  # unbiased on the exact oracle, so also the recommendation
    lam: float = 0.0  # official: the outcome term is the F1 itself (weight 1)
    prefix: str = "after_observation"
    final_turn_gain: bool = False  # official: the answer turn gets the F1 only
    gain: str = "probability"  # official: p_t − p_{t−1}; "log_probability": log(p_t + ε) − log(p_{t−1} + ε)
    final_reward: str = "f1"  # official: IGPO's F1; "outcome": the env's gold verdict (``metric``); "constant": 1
    format_penalty: float | None = -2.0  # official; None: no format check
    turn_limit_gains: str = "repository"  # official length check; "keep": a turn-limit rollout keeps its gains
    f1_golds: str = "first"  # official training: the first gold answer; "all": the best over all of them
    f1_answer: str = "first_tag"  # official: the response's first <answer> tag; "env": the env's final answer (its last)
    metric: str | None = None
    name: str = "igpo"
    requires_gold: ClassVar[bool] = True  # every episode needs a gold answer (ablate scores it where they have one)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gain not in ("probability", "log_probability"):
            raise ValueError(f"gain must be 'probability' or 'log_probability', got {self.gain!r}")
        if self.final_reward not in FINAL_REWARDS:
            raise ValueError(f"final_reward must be one of {FINAL_REWARDS}, got {self.final_reward!r}")
        if self.turn_limit_gains not in TURN_LIMIT_GAINS:
            raise ValueError(f"turn_limit_gains must be one of {TURN_LIMIT_GAINS}, got {self.turn_limit_gains!r}")
        if self.f1_golds not in F1_GOLDS:
            raise ValueError(f"f1_golds must be one of {F1_GOLDS}, got {self.f1_golds!r}")
        if self.f1_answer not in F1_ANSWERS:
            raise ValueError(f"f1_answer must be one of {F1_ANSWERS}, got {self.f1_answer!r}")

    def potential(self, p: float, q: float) -> float:
        return q * p if self.gain == "probability" else q * _log(p + self.eps)

    def outcome(self, ep: Episode, golds: Sequence[str]) -> float:
        text = igpo_transcript(ep)
        answer = igpo_first_answer(text) if self.f1_answer == "first_tag" else ep.final_answer
        # info_gain.py line 71: the response is lower-cased before the tag check (line 75) and the answer search
        if self.format_penalty is not None and (answer is None or not igpo_tags_balanced(text.lower())):
            return float(self.format_penalty)
        if self.final_reward == "outcome":
            return outcome_score(ep, self.metric)
        if self.final_reward == "constant":
            return 1.0
        return igpo_f1(str(answer or ""), golds[:1] if self.f1_golds == "first" else golds)

    def drops_gains(self, ep: Episode) -> bool:
        """The repository's length check (info_gain.py): a turn-limit rollout's response has T + 1 chat pieces
        and one gain fewer; its gains are kept only when it has more than 10 pieces."""
        return (self.turn_limit_gains == "repository" and hit_turn_limit(ep)
                and len(ep.turns) + 1 <= IGPO_CHAT_PIECES_KEPT)

    def score_group(self, episodes: Sequence[Episode]) -> GroupScores:
        if not episodes:
            raise ValueError("score_group needs at least one episode")
        rewards, potentials, outcomes, dropped = [], [], [], []
        with self._group_scope():
            for ep in episodes:
                golds = [str(a).strip() for a in ep.task.get("answers", []) if str(a).strip()]
                if not golds:
                    raise ValueError(f"igpo needs a gold answer; episode {ep.id} has none")
                o = self.outcome(ep, golds)
                drop = self.drops_gains(ep)
                if drop:
                    rew, phi = [0.0] * (len(ep.turns) - 1) + [finite((1 - self.lam) * o)], []
                else:
                    sup = self.supports(ep, golds[:1], [1.0]) if len(ep.turns) > 1 else []
                    rew, phi = self.turn_rewards(len(ep.turns), 1.0, sup, (1 - self.lam) * o)
                rewards.append(rew)
                potentials.append(phi)
                outcomes.append(o)
                dropped.append(drop)
        return GroupScores(rewards, {"potentials": potentials, "outcome": outcomes, "gains_dropped": dropped})


@dataclass
class IGPOSIOPReward(IGPOReward):
    """The SIOP repository's IGPO baseline (dl-m9/SIOP, ``siop_use_gold_ref=True`` with ``adv_estimator=igpo``):
    SIOP's reward with the first gold answer as the only reference and q = 1. Log-probability gains with
    τ_t ending with assistant turn t (before its observation), the answer turn's ΔΦ_T, and (1 − λ)·1 on the
    answer turn (no F1, no format check: the F1 is only a validation metric there); every rollout is scored,
    turn-limit ones included. Paired with that repository's ``igpo`` estimator (``igpo_siop`` here)."""

    estimator: ClassVar[str] = "turn_loo"  # recommended; the official igpo_siop is biased with process rewards
    official_estimator: ClassVar[str | None] = "igpo_siop"
    lam: float = 0.5
    prefix: str = "before_observation"
    final_turn_gain: bool = True
    gain: str = "log_probability"
    final_reward: str = "constant"
    format_penalty: float | None = None
    turn_limit_gains: str = "keep"
    name: str = "igpo_siop"
