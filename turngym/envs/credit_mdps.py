"""The exact-oracle MDPs (after AgentCreditBench, github hectopascal/agent-credit-bench, MIT) and their text envs.

- **DelayedEffect**: turn 0 chooses GOOD or BAD (reward 0), which sets the chance of the reward 1 paid
  at the last turn; the turns between offer distractor actions with identical effects (A^π = 0 exactly).
  Does an estimator leak the delayed reward onto the distractors?
- **Recovery**: GOOD ends the episode with reward 1; BAD leads to a mistake state where RECOVER pays
  1 − cost with probability q (else −cost) and GIVE_UP pays 0. Lengths 1 or 2: does the estimator blame
  the mistake and credit the repair?
- **VariableHorizon**: at each turn STOP (ends, pays ``stop_rewards[t]``) or CONTINUE (pays
  ``continue_rewards[t]``, a process reward, and moves on); the last turn must STOP. The agent decides
  how long the episode is; with dense process rewards the per-turn rewards vary.

Each env is registered with gymnasium as a text env (``turngym/DelayedEffect-v0``, ``turngym/Recovery-v0``,
``turngym/VariableHorizon-v0``): the agent replies with one action name; its turn metrics carry the
state key (``oracle_state``), the key GiGPO groups turns by.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from turngym.envs.base import ActionResult, TextEnv
from turngym.episode import RewardNeeds
from turngym.oracles.mdp import Node, Outcome, TabularMDP


def delayed_effect(horizon: int = 4, p_good: float = 0.8, p_bad: float = 0.2, distractors: int = 2) -> TabularMDP:
    if horizon < 2 or distractors < 1:
        raise ValueError("DelayedEffect needs horizon >= 2 and at least one distractor action")
    acts = tuple(f"NOTE_{k}" for k in range(distractors))
    nodes = [Node("start", 0, ("GOOD", "BAD"), ((Outcome(1.0, 0.0, 1),), (Outcome(1.0, 0.0, 2),)))]
    for t in range(1, horizon):
        for latent, p in (("good", p_good), ("bad", p_bad)):
            if t < horizon - 1:
                nxt = len(nodes) + 2  # the same latent state one turn later
                outs: tuple[Outcome, ...] = (Outcome(1.0, 0.0, nxt),)
            else:
                outs = tuple(o for o in (Outcome(p, 1.0), Outcome(1.0 - p, 0.0)) if o.prob > 0)
            nodes.append(Node(f"{latent}@{t}", t, acts, (outs,) * distractors))
    return TabularMDP("DelayedEffect", tuple(nodes), description=f"horizon {horizon}, P(reward) {p_good} after GOOD, "
                      f"{p_bad} after BAD, {distractors} distractor actions")


def recovery(q: float = 0.5, cost: float = 0.2) -> TabularMDP:
    if not 0 <= q <= 1:
        raise ValueError("Recovery needs 0 <= q <= 1")
    recover = tuple(o for o in (Outcome(q, 1.0 - cost), Outcome(1.0 - q, -cost)) if o.prob > 0)
    nodes = (Node("start", 0, ("GOOD", "BAD"), ((Outcome(1.0, 1.0),), (Outcome(1.0, 0.0, 1),))),
             Node("mistake", 1, ("RECOVER", "GIVE_UP"), (recover, (Outcome(1.0, 0.0),))))
    return TabularMDP("Recovery", nodes, description=f"P(recovery) {q}, recovery cost {cost}")


def variable_horizon(stop_rewards: Sequence[float] = (0.0, 2.0, 1.0, 3.0, 0.0),
                     continue_rewards: Sequence[float] | None = None) -> TabularMDP:
    h = len(stop_rewards)
    cont = [0.0] * (h - 1) if continue_rewards is None else [float(x) for x in continue_rewards]
    if h < 2 or len(cont) != h - 1:
        raise ValueError("VariableHorizon needs >= 2 stop rewards and one continue reward per turn but the last")
    nodes = []
    for t in range(h):
        stop = (Outcome(1.0, float(stop_rewards[t])),)
        if t == h - 1:
            nodes.append(Node(f"alive@{t}", t, ("STOP",), (stop,)))
        else:
            nodes.append(Node(f"alive@{t}", t, ("STOP", "CONTINUE"), (stop, (Outcome(1.0, cont[t], t + 1),))))
    dense = any(cont)
    return TabularMDP("VariableHorizon", tuple(nodes), description=f"stop rewards {tuple(stop_rewards)}, "
                      + (f"process rewards {tuple(cont)}" if dense else "no process rewards"))


# ------------------------------------------------------------------ text envs


class OracleTextEnv(TextEnv):
    """A :class:`TabularMDP` as a text env: the observation names the state and the legal actions, the
    action is one action name (case and surrounding space ignored); anything else ends the episode with
    reward 0 and a parse error (the MDP has no transition for it)."""

    env_name = "turngym/Oracle-v0"
    dataset_name = "oracle"
    observation_role = "user"
    reward_needs = RewardNeeds(answer_kind="none", answer_cue="answer_tag")  # no final answer, no tools
    outcome_metric = None  # the MDP's per-step rewards are the task (the default anchor state names the node)
    build: Callable[..., TabularMDP]

    def __init__(self, render_mode: str | None = None, **mdp_kwargs: Any):
        self.mdp = type(self).build(**mdp_kwargs)
        super().__init__(max_turns=self.mdp.horizon, render_mode=render_mode)
        self._node: int | None = None

    def num_items(self) -> int:
        return 1

    def get_item(self, index: int) -> dict[str, Any]:
        return {"dataset": self.dataset_name, "split": "test", "index": index, "id": f"{self.dataset_name}-{index}",
                "question": f"{self.mdp.name}: {self.mdp.description}.", "answers": []}

    def _describe(self, i: int) -> str:
        node = self.mdp.nodes[i]
        return f"Turn {node.t + 1}. State: {node.name}. Reply with one action: {', '.join(node.actions)}."

    def make_prompt(self, task: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"{task['question']}\n{self._describe(self.mdp.start)}"}]

    def on_reset(self, task: dict[str, Any]) -> None:
        self._node = self.mdp.start

    def act(self, action: str) -> ActionResult:
        node = self.mdp.nodes[self._node]
        name = action.strip().upper()
        if name not in node.actions:
            return ActionResult(observation=None, parse_error=f"not one of {list(node.actions)}", terminated=True,
                                metrics={"oracle_state": node.name})
        outs = node.outcomes[node.actions.index(name)]
        pick = int(self.np_random.choice(len(outs), p=[o.prob for o in outs]))
        out = outs[pick]
        metrics = {"oracle_state": node.name, "oracle_action": name}
        if out.next is None:
            return ActionResult(observation=None, reward=out.reward, terminated=True, metrics=metrics)
        self._node = out.next
        return ActionResult(observation=self._describe(out.next), reward=out.reward, metrics=metrics)

    def grade(self, episode) -> dict[str, Any]:
        return {"return": float(sum(t.reward for t in episode.turns))}


class DelayedEffectEnv(OracleTextEnv):
    env_name = "turngym/DelayedEffect-v0"
    dataset_name = "delayed_effect"
    build = staticmethod(delayed_effect)


class RecoveryEnv(OracleTextEnv):
    env_name = "turngym/Recovery-v0"
    dataset_name = "recovery"
    build = staticmethod(recovery)


class VariableHorizonEnv(OracleTextEnv):
    env_name = "turngym/VariableHorizon-v0"
    dataset_name = "variable_horizon"
    build = staticmethod(variable_horizon)
