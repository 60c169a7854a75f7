"""turngym envs as verifiers tool environments: the env's declared tools, called natively.

:mod:`.verifiers_env` plays an env's text protocol (each reply is an action); this module offers the same env to a
model that calls tools by name, built from the env's declaration (``TextEnv.declared_tools``,
:mod:`turngym.envs.tools`), so a tag renamed in the env is renamed here too. It is a module of its own because the
tool surface is a different verifiers base class (``StatefulToolEnv``) and a different entry point
(``vf.load_environment("turngym.integrations.verifiers_tools", ...)``), sharing the rollout's edges with
:mod:`.verifiers_env` (its env, its episode record, its rubric).

Each declared tool is one verifiers tool: named, typed and described as declared (verifiers writes its schema
from the callable's signature), plus a hidden argument verifiers fills with the rollout's state, where the
rollout's own turngym env lives. A call writes its arguments as the env's action by the declaration
(``EnvTool.to_action``) and steps that env; its result is the observation. The rollout ends when the turngym
episode does (the declared answering tool, or the env's turn limit) or when the model replies without a tool
call (the episode then ends unanswered, graded as it stands).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import verifiers as vf

from turngym.envs.tools import EnvTool
from turngym.episode import Episode
from turngym.integrations.edges import probe, task_text, tool_step, tools_of
from turngym.integrations.envs import full_env_id
from turngym.integrations.verifiers_env import (
    ENV_KEY,
    EPISODE_KEY,
    TURN_STEPS_KEY,
    TurngymRollouts,
    TurngymRubric,
    build_environment,
    eval_rows,
    loader_args,
)
from turngym.rewards import GroupReward

STATE_ARG = "turngym_state"  # the hidden argument that carries the rollout's state into a tool call


def tool_function(tool: EnvTool) -> Callable[..., str]:
    """The verifiers tool for ``tool``: its name, a keyword parameter per declared one (typed, described by its
    ``Annotated`` metadata, all required) and its description, plus :data:`STATE_ARG`, which the env hides from
    the schema and fills with the rollout's state. The call's arguments reach :meth:`EnvTool.to_action` as the
    model sent them, so a missing, unknown or mistyped one is the declaration's own message."""
    params = [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[p.type, p.description])
              for p in tool.params]
    signature = inspect.Signature([*params, inspect.Parameter(STATE_ARG, inspect.Parameter.KEYWORD_ONLY)],
                                  return_annotation=str)

    def call(**arguments: Any) -> str:
        state = arguments.pop(STATE_ARG)
        result = tool_step(state[ENV_KEY], tool, arguments)  # a refused call raises: verifiers answers its message
        state[TURN_STEPS_KEY].append(len(state["trajectory"]) - 1)  # a turn, made by the latest reply
        return result

    call.__name__ = call.__qualname__ = tool.name
    call.__doc__ = tool.description
    call.__signature__ = signature  # type: ignore[attr-defined]
    call.__annotations__ = {**{p.name: p.annotation for p in params}, "return": str}
    return call


class TurngymVerifiersToolEnv(TurngymRollouts, vf.StatefulToolEnv):
    """A verifiers tool env whose rollouts are episodes of the turngym env ``env_id``, played through its declared
    tools. Each row's prompt is the item's task as one user message (:func:`turngym.integrations.edges.task_text`:
    the env's own prompt describes its text protocol); each tool call is one ``env.step``. An env that declares no
    static tools (BFCL: ``static_tools_absent``) or none at all is refused with the reason."""

    def __init__(self, env_id: str, reward: GroupReward, env_kwargs: dict[str, Any], indices: Sequence[int],
                 load_args: dict[str, Any] | None = None, **kwargs: Any):
        self.turngym_env_id = full_env_id(env_id)
        self.env_kwargs = dict(env_kwargs)
        with probe(self.turngym_env_id, **self.env_kwargs) as raw:
            tools = tools_of(raw, self.turngym_env_id, "a verifiers tool env")
            dataset = eval_rows(raw, indices, self.turngym_env_id, self.prompt_of)
        load_args = load_args or loader_args(self.turngym_env_id, reward.name, indices, self.env_kwargs)
        # max_turns=-1: the turngym env's own turn limit ends the rollout (each tool call is one of its turns)
        super().__init__(tools=[], max_turns=-1, eval_dataset=dataset, rubric=TurngymRubric(reward),
                         message_type="chat", env_id=__name__, env_args=dict(load_args), **kwargs)
        self.env_tools = tools
        for t in tools:
            self.add_tool(tool_function(t), args_to_skip=[STATE_ARG])

    @staticmethod
    def prompt_of(episode: Episode, index: int) -> list:
        return [{"role": "user", "content": task_text(episode)}]

    async def setup_state(self, state: vf.State) -> vf.State:
        state = await super().setup_state(state)
        state[TURN_STEPS_KEY] = []
        return state

    def update_tool_args(self, tool_name: str, tool_args: dict, messages: vf.Messages, state: vf.State,
                         **kwargs: Any) -> dict:
        return {**tool_args, STATE_ARG: state}

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        results = await super().env_response(messages, state, **kwargs)
        if state[EPISODE_KEY].done:  # the answering tool or the turn limit ended the episode: the rollout ends
            state["final_env_response"] = results
        return results


def load_environment(env_id: str = "Calculator-v0", reward: str = "outcome", reward_config: dict | None = None,
                     num_examples: int | None = None, indices: Sequence[int] | None = None,
                     turngym_env: str | None = None, **env_kwargs: Any) -> TurngymVerifiersToolEnv:
    """A verifiers tool environment playing ``env_id`` through its declared tools, scored by the turngym reward
    ``reward``; the arguments are :func:`turngym.integrations.verifiers_env.load_environment`'s."""
    return build_environment(TurngymVerifiersToolEnv, turngym_env or env_id, reward, reward_config, num_examples,
                             indices, env_kwargs)
