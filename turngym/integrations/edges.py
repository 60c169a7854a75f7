"""The edges of a rollout, written once for every adapter (TRL, SkyRL, verifiers, lm-eval, OpenEnv).

Each outward adapter plays turngym envs inside another stack's loop; what it does at the loop's edges is
the same everywhere and lives here, so the copies cannot drift:

- probing an env before any rollout (:func:`probe`, :func:`check_indices`): made once, checked as an env
  handle, closed; an unknown id, a bad argument or an index out of range is one message;
- turning a server's reply into the env's action (:func:`reply_action`): the stop string a spec-following
  server dropped put back when the reply ended at a stop string, then the text cut after the first one;
- for a stack that calls tools by name (TRL, verifiers' tool envs), the env's declared tools or one message
  saying why it has none (:func:`tools_of`), the task as such a model is asked it (:func:`task_text`), and one
  call of a declared tool played as the env's action (:func:`tool_step`);
- grouping episodes (:func:`turngym.episode.group_episodes`, by ``Episode.group_key``) and scoring the groups
  through the reward's declared estimator (:func:`score_groups`): per-turn rewards, per-turn advantages and
  totals, never an adapter's own baseline.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from turngym.agents.checker import check_env_handle
from turngym.agents.policy import restore_stop, trim_at_stop
from turngym.envs.tools import EnvTool
from turngym.episode import Episode, group_episodes, reward_view
from turngym.integrations.envs import make_turngym_env


@contextmanager
def probe(env_id: str, **env_kwargs: Any) -> Iterator[Any]:
    """The env ``env_id`` made with ``env_kwargs`` and checked as an env handle, yielded as the env itself
    (``unwrapped``) and closed after: what an adapter reads before its first rollout."""
    env = make_turngym_env(env_id, **env_kwargs)  # unknown ids: one line listing the registered envs
    try:
        check_env_handle(env)
        yield env.unwrapped
    finally:
        env.close()


def check_indices(indices: Sequence[Any], num_items: int, env_id: str) -> list[int]:
    """``indices`` as dataset positions of ``env_id``; the first that is not an int in range is one message."""
    for i in indices:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_items:
            raise ValueError(f"index {i!r} is out of range: {env_id} has {num_items} items")
    return list(indices)


def reply_action(text: str, finish_reason: str | None, stop: Sequence[str]) -> str:
    """The env's action for a server's reply. The stop string a spec-following server dropped is put back only
    when the server says a stop string ended the reply (``finish_reason`` "stop", or None: it did not say); a
    reply cut at the token limit keeps its tag open, and the env reports it unparsed. Then the text is cut
    after the first stop string."""
    if not stop:
        return text
    if (finish_reason or "stop") == "stop":
        text = restore_stop(text, stop)
    return trim_at_stop(text, stop)[0]


class UntypedToolsError(ValueError):
    """The env declares no tools a tool-calling stack can offer."""


def tools_of(raw: Any, env_id: str, role: str) -> tuple[EnvTool, ...]:
    """The tools the env ``raw`` declares (``TextEnv.declared_tools``), for a stack that offers them as ``role``
    (e.g. "a TRL environment_factory env"). An env whose tools differ from item to item (``static_tools_absent``)
    or that declares none is one :class:`UntypedToolsError` saying why; one made to force the start of replies
    (a reply prefill) is refused, since such a stack generates each reply itself."""
    if raw.static_tools_absent is not None:
        raise UntypedToolsError(f"{env_id} cannot be {role}: {raw.static_tools_absent}")
    tools = raw.declared_tools()
    if not tools:
        raise UntypedToolsError(f"{env_id} declares no tools for {role} (its actions are free text; "
                                "TextEnv.declared_tools)")
    if raw.prefills:
        raise ValueError(f"{env_id} was made to force the start of replies (a reply prefill); {role} generates each "
                         "reply itself, so make it without that option (force_first_search=False)")
    return tools


def task_text(episode: Episode) -> str:
    """The task as a model calling the env's declared tools is asked it: the item's question, else the prompt's
    last user message (the env's own prompt describes its text protocol, which such a model does not write)."""
    question = episode.task.get("question")
    if isinstance(question, str):
        return question
    users = [m["content"] for m in episode.prompt if m.get("role") == "user" and isinstance(m.get("content"), str)]
    return users[-1] if users else ""


def tool_step(env: Any, tool: EnvTool, arguments: Any) -> str:
    """One call of the declared ``tool`` on a rollout's Gymnasium env: written as the env's action by the
    declaration (a call it refuses is no turn) and sent to ``env.step``. The tool's result is the observation, or
    a line saying the episode ended with this call."""
    episode = env.unwrapped.episode
    if episode is None:
        raise RuntimeError("call reset before a tool")
    if episode.done:
        raise RuntimeError("the episode has ended; no further tool calls are taken")
    text, _reward, terminated, truncated, _info = env.step(tool.to_action(arguments))
    if terminated:
        return "The answer was recorded; the episode has ended."
    if truncated:
        return "The turn limit was reached; the episode has ended."
    return text.strip()


@dataclass(frozen=True)
class GroupScores:
    """Scores of episodes, in the order given: per-turn rewards, per-turn advantages from the estimator, and each
    episode's total reward."""

    rewards: list[list[float]]
    advantages: list[list[float]]
    totals: list[float]
    estimator: str


def score_groups(reward: Any, episodes: Sequence[Episode], estimator: str | None = None,
                 **estimator_kwargs: Any) -> GroupScores:
    """Group ``episodes`` by ``Episode.group_key``, score each group with ``reward`` (a turngym reward or its
    registered name) and turn its per-turn rewards into advantages with ``estimator`` (default: the one the
    reward declares). An estimator that needs more than the rewards (states, branches, entropy) is refused
    unless its input is given, instead of silently degrading."""
    from turngym.rewards import get_reward
    from turngym.training.advantages import get_estimator

    scorer = get_reward(reward) if isinstance(reward, str) else reward
    spec = get_estimator(estimator or scorer.estimator)
    given = {"states" if "states" in estimator_kwargs else "", "branches" if "mc" in estimator_kwargs else ""}
    if missing := sorted(spec.needs - {"rewards"} - given):
        raise ValueError(f"estimator {spec.name!r} needs {', '.join(missing)} beyond the rewards, which an adapter "
                         "does not have; pass states=/mc= or name an estimator that rewards alone determine")
    groups = group_episodes(episodes)
    if given - {""} and len(groups) > 1:
        raise ValueError("states=/mc= describe one group; score the groups one at a time")
    index = {id(ep): i for i, ep in enumerate(episodes)}
    rewards: list[list[float]] = [[] for _ in episodes]
    advantages: list[list[float]] = [[] for _ in episodes]
    for group in groups:
        per_turn = scorer.score_group(reward_view(list(group.episodes))).rewards
        for ep, r, a in zip(group.episodes, per_turn, spec(per_turn, **estimator_kwargs), strict=True):
            rewards[index[id(ep)]] = [float(x) for x in r]
            advantages[index[id(ep)]] = [float(x) for x in a]
    return GroupScores(rewards, advantages, [sum(r) for r in rewards], spec.name)
