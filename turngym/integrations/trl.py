"""turngym envs for TRL's ``GRPOTrainer(environment_factory=...)``.

TRL (1.16, ``trl/trainer/grpo_trainer.py``) makes one instance per rollout from a zero-argument
factory, calls ``reset(**row)`` before generation (a returned string is appended to the last user
message), exposes every public method except ``reset``/``get_reward`` as a tool (its JSON schema is
read from the method's type hints and Google-style docstring), calls those methods with the model's
native tool-call arguments, and calls ``get_reward()`` once per finished rollout.

:func:`environment_factory` returns such a factory for a registered turngym env. Each tool method
writes the call in the env's own action protocol (``<calc>…</calc>``, ``<search>…</search>``, a
```` ```python ```` block) and sends it to ``env.step``, so the rollout is an ordinary turngym
:class:`~turngym.episode.Episode` (turns, per-turn metrics and truth, outcome) kept on the instance
as ``episode``; every env has an ``answer`` tool that ends it. :func:`episode_reward_func` scores the
rollouts' episodes with any turngym reward (per-turn rewards summed per episode) as a TRL reward
function. Nothing here imports TRL: the contract is duck-typed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from turngym.envs.base import outcome_reward
from turngym.episode import Episode, reward_view
from turngym.integrations.envs import full_env_id, make_turngym_env

# reset(**row) receives the dataset row; these columns choose the episode (the rest, e.g. "prompt", are TRL's)
RESET_COLUMNS = ("index", "task", "group", "seed", "episode_id")


class TurngymToolEnv:
    """One rollout's turngym env seen as a TRL environment (subclassed per env with its tools).

    ``reset`` starts an episode on the row's ``index`` (or ``task``; a random item when neither) and
    returns the task text; each tool call is one turn; ``get_reward`` ends an episode the model left
    unanswered (truncated, graded as given) and returns the env's outcome reward (Calculator: 1.0 when
    correct). ``episode`` is the turngym record of the current rollout; ``on_episode`` (if given) is
    called with each finished one.
    """

    env_id: str = ""
    env_kwargs: dict[str, Any] = {}
    on_episode: Callable[[Episode], None] | None = None

    def __init__(self) -> None:
        self.env = make_turngym_env(self.env_id, **self.env_kwargs)
        self.raw = self.env.unwrapped
        self.episode: Episode | None = None
        self._reported = False

    def reset(self, **row: Any) -> str:
        options = {k: row[k] for k in ("index", "task", "group", "episode_id") if row.get(k) is not None}
        self.env.reset(seed=row.get("seed"), options=options)
        self.episode, self._reported = self.raw.episode, False
        self.episode.meta["trl"] = {"tool_calls": []}
        task = self.episode.task
        if isinstance(task.get("question"), str):
            return task["question"]
        users = [m["content"] for m in self.episode.prompt if m.get("role") == "user" and isinstance(m.get("content"), str)]
        return users[-1] if users else ""

    def get_reward(self) -> float:
        ep = self._require_episode()
        if not ep.done:
            self.raw.end_episode("the model stopped without calling answer")
        if not self._reported and self.on_episode is not None:
            self.on_episode(ep)
        self._reported = True
        return outcome_reward(ep.outcome, self.raw.outcome_metric)

    def _require_episode(self) -> Episode:
        if self.episode is None:
            raise RuntimeError("call reset before a tool")
        return self.episode

    def _step(self, tool: str, arguments: dict[str, Any], action: str) -> str:
        """Send one tool call (as the env's action text) to ``env.step``; the observation is the tool's result."""
        ep = self._require_episode()
        if ep.done:  # TRL turns a raised error into the tool's {"error": ...} result
            raise RuntimeError("the episode has ended; no further tool calls are taken")
        ep.meta["trl"]["tool_calls"].append({"name": tool, "arguments": arguments})
        text, _reward, terminated, truncated, _info = self.env.step(action)
        if terminated:
            return "The answer was recorded; the episode has ended."
        if truncated:
            return "The turn limit was reached; the episode has ended."
        return text.strip()


class CalculatorToolEnv(TurngymToolEnv):
    """Calculator-v0 with native tools: ``calculator`` and ``answer``."""

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression over numbers with + - * / and parentheses.

        Args:
            expression: The expression to evaluate, for example "84 * 63 + 51".
        """
        return self._step("calculator", {"expression": expression}, f"<calc>{expression}</calc>")

    def answer(self, answer: str) -> str:
        """Give the final answer to the question; this ends the episode.

        Args:
            answer: The final answer, a number.
        """
        return self._step("answer", {"answer": answer}, f"<answer>{answer}</answer>")


class SearchQAToolEnv(TurngymToolEnv):
    """SearchQA-v0 with native tools: ``search`` and ``answer``."""

    def search(self, query: str) -> str:
        """Search the corpus and return the top passages.

        Args:
            query: The search query.
        """
        if self.raw.tool_format == "native":
            action = "<tool_call>\n" + json.dumps({"name": "search", "arguments": {"query": query}}) + "\n</tool_call>"
        else:
            action = f"<search>{query}</search>"
        return self._step("search", {"query": query}, action)

    def answer(self, answer: str) -> str:
        """Give the final answer to the question; this ends the episode.

        Args:
            answer: The final answer, a short phrase.
        """
        return self._step("answer", {"answer": answer}, f"<answer>{answer}</answer>")


class MathCodeToolEnv(TurngymToolEnv):
    """MathCode-v0 with native tools: ``run_python`` (the episode's stateful sandbox) and ``answer``."""

    def run_python(self, code: str) -> str:
        """Run Python code in a sandboxed interpreter; variables persist between calls. Returns what it printed.

        Args:
            code: The Python code to run.
        """
        return self._step("run_python", {"code": code}, f"```python\n{code}\n```")

    def answer(self, answer: str) -> str:
        """Give the final answer to the problem; this ends the episode.

        Args:
            answer: The final answer, as a LaTeX expression (what would go inside \\boxed{}).
        """
        return self._step("answer", {"answer": answer}, f"\\boxed{{{answer}}}")


# env id -> the class whose methods are its tools
TOOL_ENVS: dict[str, type[TurngymToolEnv]] = {
    "turngym/Calculator-v0": CalculatorToolEnv,
    "turngym/SearchQA-v0": SearchQAToolEnv,
    "turngym/MathCode-v0": MathCodeToolEnv,
}

# why an env's tools cannot be typed as fixed methods
UNTYPED = {
    "turngym/BFCL-v0": "its functions differ from entry to entry while TRL reads one fixed set of tool methods per "
                       "environment class at the trainer's start, and its multi-turn entries send new user messages "
                       "between calls, which TRL's tool loop cannot",
}


class UntypedToolsError(ValueError):
    """The env has no fixed, typed tool set TRL can expose."""


def environment_factory(env_id: str, on_episode: Callable[[Episode], None] | None = None,
                        **env_kwargs: Any) -> Callable[[], TurngymToolEnv]:
    """The zero-argument callable ``GRPOTrainer(environment_factory=...)`` expects, for ``env_id``
    made with ``env_kwargs``. The env is made once here, so an unknown id or bad argument fails now."""
    full = full_env_id(env_id)
    if full in UNTYPED:
        raise UntypedToolsError(f"{full} cannot be a TRL environment_factory env: {UNTYPED[full]}")
    probe = make_turngym_env(full, **env_kwargs)  # unknown ids: one line listing the registered envs
    try:
        raw = probe.unwrapped
        if full not in TOOL_ENVS:
            raise UntypedToolsError(f"{full} has no typed tools for TRL's environment_factory (its actions are free text); "
                                    f"envs with tools: {', '.join(sorted(TOOL_ENVS))}")
        if raw.prefills:
            raise ValueError(f"{full} was made to force the start of replies (a reply prefill); TRL generates each reply "
                             "itself, so make it without that option (force_first_search=False)")
    finally:
        probe.close()
    base = TOOL_ENVS[full]
    cls = type(base.__name__, (base,), {"env_id": full, "env_kwargs": dict(env_kwargs),
                                        "on_episode": staticmethod(on_episode) if on_episode else None,
                                        "__doc__": base.__doc__})

    def factory() -> TurngymToolEnv:
        return cls()

    factory.env_class = cls  # type: ignore[attr-defined]
    return factory


def episode_reward_func(reward: str | Any, **reward_kwargs: Any) -> Callable[..., list[float]]:
    """A TRL reward function that scores the rollouts' turngym episodes with a turngym reward
    (:func:`turngym.rewards.get_reward`): episodes of one task form a group, and each rollout's
    reward is its per-turn rewards summed. TRL passes the rollouts' env instances as ``environments``."""
    from turngym.rewards import get_reward

    scorer = get_reward(reward, **reward_kwargs) if isinstance(reward, str) else reward

    def turngym_reward(environments: Sequence[TurngymToolEnv] | None = None, **_: Any) -> list[float]:
        if environments is None:
            raise ValueError("episode_reward_func needs TRL's environment_factory (it reads each rollout's episode)")
        episodes = []
        for env in environments:
            env.get_reward()  # ends an unanswered episode, so it can be graded
            episodes.append(env.episode)
        totals: list[float] = [0.0] * len(episodes)
        groups: dict[str, list[int]] = {}
        for i, ep in enumerate(episodes):
            groups.setdefault(json.dumps(ep.task, sort_keys=True, default=str), []).append(i)
        for members in groups.values():
            scores = scorer.score_group(reward_view([episodes[i] for i in members]))
            for i, total in zip(members, scores.totals(), strict=True):
                totals[i] = float(total)
        return totals

    turngym_reward.__name__ = f"turngym_{getattr(scorer, 'name', 'reward')}"
    return turngym_reward
