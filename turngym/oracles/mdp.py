"""Small finite-horizon MDPs under a tabular softmax policy: exact values, exact policy gradient, sampling.

States are time-indexed nodes (a node's successors come later in ``TabularMDP.nodes``), so a node is
visited at most once per episode and one backward pass gives V^π, Q^π and A^π exactly. The objective
is the undiscounted return J(θ) = E_τ[Σ_t r_t]; the policy is π(a|s) = softmax(θ_s)_a with one logit
per (node, action). Design after AgentCreditBench (github hectopascal/agent-credit-bench, MIT).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Outcome:
    """One possible result of an action: probability, reward, next node (None: the episode ends)."""

    prob: float
    reward: float
    next: int | None = None


@dataclass(frozen=True)
class Node:
    name: str
    t: int
    actions: tuple[str, ...]
    outcomes: tuple[tuple[Outcome, ...], ...]  # per action


@dataclass(frozen=True)
class TabularMDP:
    name: str
    nodes: tuple[Node, ...]
    start: int = 0
    description: str = ""

    def __post_init__(self) -> None:
        for i, n in enumerate(self.nodes):
            if not n.actions or len(n.actions) != len(n.outcomes):
                raise ValueError(f"{self.name}: node {n.name!r} needs one outcome list per action")
            for outs in n.outcomes:
                if abs(sum(o.prob for o in outs) - 1.0) > 1e-9:
                    raise ValueError(f"{self.name}: outcome probabilities of {n.name!r} do not sum to 1")
                for o in outs:
                    if o.next is not None and (o.next <= i or self.nodes[o.next].t != n.t + 1):
                        raise ValueError(f"{self.name}: {n.name!r} -> node {o.next} is not a later turn's node")

    @property
    def horizon(self) -> int:
        return max(n.t for n in self.nodes) + 1

    @property
    def offsets(self) -> np.ndarray:
        """Index of each node's first logit in the flat parameter vector."""
        return np.cumsum([0] + [len(n.actions) for n in self.nodes])[:-1]

    @property
    def num_params(self) -> int:
        return sum(len(n.actions) for n in self.nodes)


def softmax_probs(mdp: TabularMDP, logits: np.ndarray) -> np.ndarray:
    """π(·|node), padded with 0 to the widest node: shape (nodes, max actions)."""
    width = max(len(n.actions) for n in mdp.nodes)
    out = np.zeros((len(mdp.nodes), width))
    for i, (n, off) in enumerate(zip(mdp.nodes, mdp.offsets, strict=True)):
        z = logits[off:off + len(n.actions)]
        e = np.exp(z - z.max())
        out[i, :len(n.actions)] = e / e.sum()
    return out


@dataclass
class ExactValues:
    """V^π (nodes,), Q^π and A^π (nodes, max actions; 0 past a node's actions), visit probability (nodes,)
    and the exact policy gradient ∇_θ J (num_params,)."""

    v: np.ndarray
    q: np.ndarray
    a: np.ndarray
    visit: np.ndarray
    gradient: np.ndarray
    probs: np.ndarray = field(repr=False)


def solve(mdp: TabularMDP, logits: np.ndarray) -> ExactValues:
    """Backward induction for V, Q; forward pass for visit probabilities d; then
    ∂J/∂θ_{s,b} = d(s)·π(b|s)·A^π(s,b) (the softmax score e_b − π(·|s) against A^π, whose π-mean is 0)."""
    probs = softmax_probs(mdp, logits)
    n_nodes, width = probs.shape
    v, q = np.zeros(n_nodes), np.zeros((n_nodes, width))
    for i in range(n_nodes - 1, -1, -1):
        node = mdp.nodes[i]
        for k, outs in enumerate(node.outcomes):
            q[i, k] = sum(o.prob * (o.reward + (v[o.next] if o.next is not None else 0.0)) for o in outs)
        v[i] = float(probs[i] @ q[i])
    adv = np.where(probs > 0, q - v[:, None], 0.0)
    visit = np.zeros(n_nodes)
    visit[mdp.start] = 1.0
    for i, node in enumerate(mdp.nodes):
        for k, outs in enumerate(node.outcomes):
            for o in outs:
                if o.next is not None:
                    visit[o.next] += visit[i] * probs[i, k] * o.prob
    grad = np.concatenate([visit[i] * probs[i, :len(n.actions)] * adv[i, :len(n.actions)]
                           for i, n in enumerate(mdp.nodes)])
    return ExactValues(v, q, adv, visit, grad, probs)


@dataclass
class Trajectories:
    """N sampled episodes, padded to the horizon: node and action index, reward per turn; ``length`` (N,)."""

    node: np.ndarray  # (N, H) int, -1 past the end
    action: np.ndarray  # (N, H) int
    reward: np.ndarray  # (N, H) float, 0 past the end
    length: np.ndarray  # (N,) int

    def rewards(self, rows: range | slice) -> list[list[float]]:
        return [r[:n].tolist() for r, n in zip(self.reward[rows], self.length[rows], strict=True)]

    def states(self, rows: range | slice) -> list[list[int]]:
        return [s[:n].tolist() for s, n in zip(self.node[rows], self.length[rows], strict=True)]


def _tables(mdp: TabularMDP) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    width = max(len(n.actions) for n in mdp.nodes)
    depth = max(len(outs) for n in mdp.nodes for outs in n.outcomes)
    cum = np.ones((len(mdp.nodes), width, depth))  # cumulative outcome probabilities (1 past the last)
    rew, nxt = np.zeros_like(cum), -np.ones(cum.shape, dtype=int)
    for i, n in enumerate(mdp.nodes):
        for k, outs in enumerate(n.outcomes):
            cum[i, k, :len(outs)] = np.cumsum([o.prob for o in outs])
            rew[i, k, :len(outs)] = [o.reward for o in outs]
            nxt[i, k, :len(outs)] = [-1 if o.next is None else o.next for o in outs]
    return cum, rew, nxt


def sample(mdp: TabularMDP, logits: np.ndarray, n: int, rng: np.random.Generator) -> Trajectories:
    """``n`` independent episodes under π, all stepped together (vectorised over episodes)."""
    probs = softmax_probs(mdp, logits)
    cum_pi = np.cumsum(probs, axis=1)
    cum_pi[:, -1] = 1.0
    cum, rew, nxt = _tables(mdp)
    h = mdp.horizon
    node = -np.ones((n, h), dtype=int)
    action = np.zeros((n, h), dtype=int)
    reward = np.zeros((n, h))
    length = np.zeros(n, dtype=int)
    here = np.full(n, mdp.start)
    alive = np.arange(n)
    for t in range(h):
        if alive.size == 0:
            break
        s = here[alive]
        a = (rng.random(alive.size)[:, None] > cum_pi[s]).sum(axis=1)
        o = (rng.random(alive.size)[:, None] > cum[s, a]).sum(axis=1)
        node[alive, t], action[alive, t], reward[alive, t] = s, a, rew[s, a, o]
        length[alive] = t + 1
        here[alive] = nxt[s, a, o]
        alive = alive[nxt[s, a, o] >= 0]
    return Trajectories(node, action, reward, length)


def enumerate_trajectories(mdp: TabularMDP, logits: np.ndarray) -> list[tuple[float, list[tuple[int, int, float]]]]:
    """Every episode with its probability: (p, [(node, action, reward), ...]). For tests on small MDPs."""
    probs = softmax_probs(mdp, logits)
    out: list[tuple[float, list[tuple[int, int, float]]]] = []

    def walk(i: int, p: float, prefix: list[tuple[int, int, float]]) -> None:
        for k, outs in enumerate(mdp.nodes[i].outcomes):
            for o in outs:
                q = p * probs[i, k] * o.prob
                if q == 0:
                    continue
                steps = prefix + [(i, k, o.reward)]
                if o.next is None:
                    out.append((q, steps))
                else:
                    walk(o.next, q, steps)

    walk(mdp.start, 1.0, [])
    return out
