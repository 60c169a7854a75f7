"""turngym envs as verifiers environments: ``load_environment`` for verifiers' classic (v0) API.

:func:`load_environment` returns a ``verifiers.MultiTurnEnv`` whose rollouts are turngym episodes:
each rollout makes its own Gymnasium env, resets it on the dataset item its row names, sends every
model reply to ``env.step`` and answers with the observation; the rollout ends when the turngym env
terminates or truncates. Its rubric scores each group of rollouts (the K rollouts of one example,
verifiers' group) with a turngym reward from :func:`turngym.rewards.get_reward` on the finished
:class:`~turngym.episode.Episode` records, and writes the per-turn rewards onto verifiers'
trajectory steps (one step per turn). What a rollout does at its edges (its env, its record, the model check) is
:class:`TurngymRollouts`, which :mod:`.verifiers_tools` shares to play an env's declared tools natively.

This is the classic API of the ``verifiers`` 0.3 line (``verifiers.legacy``, reached as
``import verifiers as vf``); verifiers 0.4 keeps only its v1 API, which runs agents through a
uv-managed runtime, and pins an ``mcp`` release the ``openenv`` extra cannot share.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import verifiers as vf
from datasets import Dataset

if not hasattr(vf, "MultiTurnEnv"):
    raise ImportError(f"turngym.integrations.verifiers_env needs verifiers' classic API (the 0.3 line, the [verifiers] "
                      f"extra); verifiers {vf.__version__} has only its v1 API: use turngym.integrations.verifiers_v1 "
                      "(vf-eval turngym-taskset, docs/verifiers.md)")

from turngym.episode import Episode
from turngym.integrations.edges import check_indices, probe, reply_action, score_groups
from turngym.integrations.envs import full_env_id, make_turngym_env
from turngym.rewards import GroupReward, get_reward


class ModelNotServed(ValueError):
    """The evaluation names a model the server does not list. Uncaught, it prints as one ``error:``
    line (no traceback; :func:`_one_line_hook`) and the process exits 1, under ``vf-eval`` too."""


def _one_line_hook(previous):
    def hook(kind, value, tb):
        if issubclass(kind, ModelNotServed):
            print(f"error: {value}", file=sys.stderr)
            return
        previous(kind, value, tb)

    hook.turngym_one_line = True  # type: ignore[attr-defined]
    return hook


if not getattr(sys.excepthook, "turngym_one_line", False):
    sys.excepthook = _one_line_hook(sys.excepthook)


def _endpoints(client: Any) -> list[tuple[str, str | None]]:
    """(base URL, API key) of each endpoint of a verifiers ClientConfig or an OpenAI client."""
    if isinstance(client, vf.ClientConfig):
        configs = list(client.endpoint_configs) or [client]
        return [(c.api_base_url, os.environ.get(c.api_key_var)) for c in configs]
    base = getattr(client, "base_url", None)
    return [(str(base), getattr(client, "api_key", None))] if base is not None else []


def served_models(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> list[str] | None:
    """The model ids ``GET {base_url}/models`` lists, or None where the server does not answer that."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=timeout_s)
        resp.raise_for_status()
        return [str(m["id"]) for m in resp.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def check_model_served(client: Any, model: str) -> None:
    """Raise :class:`ModelNotServed` when an endpoint lists its models and ``model`` is not among them
    (every request would fail and each rollout score 0); a server without ``/models`` is not checked."""
    for base_url, key in _endpoints(client):
        served = served_models(base_url, key)
        if served is not None and model not in served:
            raise ModelNotServed(f"the server at {base_url} does not serve {model!r}; it serves: "
                                 f"{', '.join(served) or '(no models)'}")


EPISODE_KEY = "turngym_episode"  # the rollout's turngym Episode in verifiers' state
RECORD_KEY = "turngym_record"  # its record (Episode.to_dict), set when the rollout ends: a JSON state column
ENV_KEY = "turngym_env"  # the rollout's Gymnasium env, closed when the rollout ends
# the trajectory step each turn was made in, where a step makes other than one turn (a reply's tool calls:
# any number); absent, turn t is step t
TURN_STEPS_KEY = "turngym_turn_steps"


def message_text(message: Any) -> str:
    """The text of a chat message's content (a string or a list of text parts)."""
    content = message.get("content") if hasattr(message, "get") else getattr(message, "content", None)
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        text = part.get("text") if hasattr(part, "get") else getattr(part, "text", None)
        if text is None:
            raise ValueError(f"a model reply holds a non-text part ({part!r}); turngym envs take text actions")
        parts.append(text)
    return "".join(parts)


class TurngymRubric(vf.Rubric):
    """Scores a group of rollouts with one turngym reward, and gives each turn the advantage of the reward's
    declared estimator (:func:`turngym.integrations.edges.score_groups`). Errors propagate (verifiers' own reward
    functions would score a raising function 0, hiding a broken reward)."""

    def __init__(self, reward: GroupReward):
        super().__init__()
        self.reward = reward

    async def score_rollout(self, state: vf.State) -> None:
        await self.score_group([state])

    async def score_group(self, states: list[vf.State]) -> None:
        if not states:
            return
        episodes: list[Episode] = [s[EPISODE_KEY] for s in states]
        scores = score_groups(self.reward, episodes)
        name = f"turngym_{self.reward.name}"
        for state, per_turn, advantages, total in zip(states, scores.rewards, scores.advantages, scores.totals,
                                                      strict=True):
            state["reward"] = total
            state["advantage"] = advantages[0] if advantages else 0.0  # the first turn's: the whole episode's credit
            state["metrics"] = {name: total}
            steps = state["trajectory"]
            made_in = state.get(TURN_STEPS_KEY, range(len(per_turn)))
            # set whatever a rubric before it (verifiers' monitors) filled in: these are the turngym reward's
            if list(made_in) == list(range(len(steps))):  # one step per turn: per-turn rewards and advantages
                for step, r, a in zip(steps, per_turn, advantages, strict=True):
                    step["reward"], step["advantage"] = r, a
            else:
                for step in steps:
                    step["reward"], step["advantage"] = total, state["advantage"]


def loader_args(env_id: str, reward: str, indices: Sequence[int], env_kwargs: dict[str, Any],
                reward_config: dict | None = None) -> dict[str, Any]:
    """The arguments of a module's ``load_environment`` that build this env again: verifiers' env server rebuilds
    the env in a worker process as ``vf.load_environment(module, **args)`` (the env's own id would be imported as
    a module, "Calculator_v0")."""
    return {"turngym_env": full_env_id(env_id), "reward": reward, "reward_config": reward_config,
            "indices": list(indices), **env_kwargs}


def eval_rows(raw: Any, indices: Sequence[int], env_id: str, prompt: Callable[[Episode, int], list]) -> Dataset:
    """The eval dataset of ``raw``'s items ``indices``: each row the messages ``prompt(episode, index)`` gives for
    the item's fresh episode, and ``info["index"]``."""
    rows = []
    for i in check_indices(indices, raw.num_items(), env_id):
        raw.reset(options={"index": i})
        rows.append({"prompt": prompt(raw.episode, i), "answer": "", "info": {"index": i}})
    return Dataset.from_list(rows)


class TurngymRollouts:
    """A rollout's turngym env, for a verifiers ``MultiTurnEnv`` that mixes this in (first): each rollout makes its
    own Gymnasium env (``env_id``, ``env_kwargs``) and resets it on its row's item, verifiers' example id as the
    episode's group (the K rollouts of one example form one turngym group). When the rollout ends, an episode the
    env has not ended (verifiers stopped first: an error, a token budget, a model that stopped calling tools) is
    ended and graded as it stands, recorded in the state and its env closed. The model name is checked against
    the server before any rollout."""

    turngym_env_id: str
    env_kwargs: dict[str, Any]

    def add_rubric(self, rubric: Any) -> None:
        """Rubrics verifiers adds (its turn and tool-call monitors) score before the turngym rubric: a rubric group
        sums its members' rewards but keeps the last member's ``state["advantage"]``, which must be turngym's (a
        monitor after it set every rollout's advantage to 0)."""
        super().add_rubric(rubric)  # type: ignore[misc]
        if isinstance(self.rubric, vf.RubricGroup):  # type: ignore[attr-defined]
            self.rubric.rubrics.sort(key=lambda r: isinstance(r, TurngymRubric))  # type: ignore[attr-defined]

    async def generate(self, inputs: Any, client: Any, model: str, *args: Any, **kwargs: Any) -> Any:
        # evaluate, evaluate_sync and vf-eval all come here first: check the name before any rollout, so a
        # wrong one is one error, not a run of zero rewards
        check_model_served(client, model)
        return await super().generate(inputs, client, model, *args, **kwargs)  # type: ignore[misc]

    async def setup_state(self, state: vf.State) -> vf.State:
        env = make_turngym_env(self.turngym_env_id, **self.env_kwargs)
        state[ENV_KEY] = env
        env.reset(options={"index": state["info"]["index"], "group": str(state["example_id"])})
        state[EPISODE_KEY] = env.unwrapped.episode
        return state

    @vf.cleanup
    async def close_turngym_env(self, state: vf.State) -> None:
        env = state.get(ENV_KEY)
        episode = state.get(EPISODE_KEY)
        if env is not None and episode is not None and not episode.done:
            env.unwrapped.end_episode(f"the verifiers rollout ended first ({state.get('stop_condition')})")
        if episode is not None:
            state[RECORD_KEY] = episode.to_dict()
        if env is not None:
            env.close()
            state[ENV_KEY] = None


class TurngymVerifiersEnv(TurngymRollouts, vf.MultiTurnEnv):
    """A verifiers multi-turn env whose rollouts are episodes of the turngym env ``env_id``.

    Observations go back as chat messages: an env whose ``observation_role`` is ``None`` (the
    observation continues the assistant's text, Search-R1 style) sends it as a ``user`` message,
    since a chat API starts a new message after every reply. The model's reply is the action, with
    the stop string a spec-following server dropped put back where the server says a stop string
    ended it (as ``turngym eval`` does).
    """

    def __init__(self, env_id: str, reward: GroupReward, env_kwargs: dict[str, Any],
                 indices: Sequence[int], load_args: dict[str, Any] | None = None, **kwargs: Any):
        self.turngym_env_id = full_env_id(env_id)
        self.env_kwargs = dict(env_kwargs)
        with probe(self.turngym_env_id, **self.env_kwargs) as raw:
            if raw.observation_role not in (None, "user"):
                raise ValueError(f"{self.turngym_env_id} answers as {raw.observation_role!r} messages; this integration "
                                 "sends observations as user messages (tool messages need native tool calls)")
            self.stop = tuple(raw.stop)
            dataset = eval_rows(raw, indices, self.turngym_env_id, self.prompt_of)
        sampling = {"stop": list(self.stop)} if self.stop else {}
        load_args = load_args or loader_args(self.turngym_env_id, reward.name, indices, self.env_kwargs)
        super().__init__(eval_dataset=dataset, rubric=TurngymRubric(reward), sampling_args=sampling,
                         message_type="chat", env_id=__name__, env_args=dict(load_args), **kwargs)

    def prompt_of(self, episode: Episode, index: int) -> list:
        """An item's prompt, as the env renders it; an item with native tool schemas is refused."""
        if episode.tools:
            raise ValueError(f"{self.turngym_env_id} item {index} uses native tool calling; this integration plays "
                             "text-protocol envs (build the env with its text tool format, or play its declared "
                             "tools with turngym.integrations.verifiers_tools)")
        return copy.deepcopy(episode.prompt)

    def action_of(self, message: Any, finish_reason: str | None) -> str:
        """The turngym action for a model reply: its text, cut after the first stop string. The stop
        string a spec-following server dropped is put back only when the server says a stop string
        ended the reply (``finish_reason`` "stop", or None: it did not say), the rule ``turngym eval`` uses
        for a server that does not name the stop string (verifiers' replies carry no vLLM ``stop_reason``):
        a reply cut at the token limit keeps its tag open, and the env reports it unparsed."""
        return reply_action(message_text(message), finish_reason, self.stop)

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        env = state[ENV_KEY]
        reply = state["trajectory"][-1]["response"].message  # text and finish reason from this one reply
        text, _, terminated, truncated, _ = env.step(self.action_of(reply, reply.finish_reason))
        if terminated or truncated:
            state["final_env_response"] = []
            return []
        return [vf.UserMessage(content=text)]


def load_environment(env_id: str = "Calculator-v0", reward: str = "outcome", reward_config: dict | None = None,
                     num_examples: int | None = None, indices: Sequence[int] | None = None,
                     turngym_env: str | None = None, **env_kwargs: Any) -> TurngymVerifiersEnv:
    """A verifiers environment playing ``env_id`` and scored by the turngym reward ``reward``.

    ``env_kwargs`` go to ``gymnasium.make`` (e.g. ``dataset="nq"``); ``reward_config`` to
    :func:`turngym.rewards.get_reward`. The eval dataset is the env's items ``indices``, or its first
    ``num_examples`` (default: all of them). ``turngym_env`` names the env where ``env_id`` cannot be
    passed: ``vf.load_environment(module, **args)`` takes ``env_id`` as its own first argument.
    """
    return build_environment(TurngymVerifiersEnv, turngym_env or env_id, reward, reward_config, num_examples, indices,
                             env_kwargs)


def build_environment(cls: type, env_id: str, reward: str, reward_config: dict | None, num_examples: int | None,
                      indices: Sequence[int] | None, env_kwargs: dict[str, Any]) -> Any:
    """``cls`` (a :class:`TurngymRollouts` env) for a ``load_environment``'s arguments, read as
    :func:`load_environment` documents them."""
    if indices is not None and num_examples is not None:
        raise ValueError("pass either indices or num_examples, not both")
    scorer = get_reward(reward, **(reward_config or {}))
    with probe(env_id, **env_kwargs) as raw:  # made now, whatever the indices: an env that cannot serve fails here
        n = raw.num_items()
    if indices is None:
        indices = range(n if num_examples is None else min(num_examples, n))
    load_args = loader_args(env_id, reward, indices, env_kwargs, reward_config)
    return cls(env_id, scorer, env_kwargs, list(indices), load_args=load_args)
