"""The ``turngym`` agent loop: a registered turngym env played through verl's server manager.

verl's ``AgentLoopWorker`` makes one loop per trajectory (``hydra.utils.instantiate`` of the registered entry) and
awaits ``run(sampling_params, **row)``. This loop plays one episode the way turngym's rollout runner does
(:mod:`turngym.agents.runner`): the prompt's and every observation's ids come from the same
:class:`~turngym.agents.tokenization.ConversationTokenizer`, each reply is the server's token ids cut at the env's
first stop string (kept) or EOS, as the local policy cuts it, and the env records the episode's text. So the
episode (ids, actions, observations, rewards) is the one the runner records for the same replies, and verl trains on
exactly the ids the model saw: ``response_ids`` is every turn's prefill, reply and observation ids after the prompt,
``response_mask`` is 1 on reply tokens only.

What the env plays comes from the loop's config (an ``agent_loop_config_path`` entry's ``env_id``/``env_kwargs``,
else the run config's ``turngym.env_id``/``turngym.env_kwargs``), and per row from ``extra_info``: ``env_id``,
``env_kwargs``, ``index`` or ``task``, ``seed``. Limits are verl's: ``rollout.prompt_length`` (a longer env prompt is
refused: cutting it would train on ids the model never saw), ``rollout.response_length`` (each reply may use what
is left of it; an episode with nothing left ends truncated, as the runner's token budget ends one; an observation
that runs past it is cut in ``response_ids`` only, with mask 0), and ``multi_turn.max_assistant_turns`` (the env's
turn limit).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

from omegaconf import DictConfig, ListConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from turngym._version import __version__ as VERSION
from turngym.agents.hf import cut_generation
from turngym.agents.tokenization import ConversationTokenizer, tokenizer_fingerprint
from turngym.envs.base import outcome_reward
from turngym.episode import Episode, TokenLayout
from turngym.integrations.envs import full_env_id, make_turngym_env

END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>")  # as turngym.agents.hf.eos_ids_of reads them


def plain_config(value: Any) -> Any:
    """An OmegaConf node (hydra hands the loop's config entries over as DictConfig) as plain Python."""
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def eos_ids(tokenizer: Any) -> set[int]:
    """The ids that end a reply: the tokenizer's EOS and the chat end-of-turn tokens it knows."""
    ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    vocab = tokenizer.get_vocab()
    ids.update(int(vocab[t]) for t in END_OF_TURN_TOKENS if t in vocab)
    return ids


class EnvPool:
    """Free envs per (env id, arguments), kept for later trajectories in the same worker process: an env, its
    dataset and its retriever are made once, then reset for every episode (as the runner's ``env_pool``)."""

    def __init__(self) -> None:
        self.free: dict[str, list[Any]] = {}

    @staticmethod
    def key(env_id: str, env_kwargs: Mapping[str, Any]) -> str:
        return env_id + json.dumps(dict(env_kwargs), sort_keys=True, default=repr)

    def take(self, env_id: str, env_kwargs: Mapping[str, Any]) -> Any:
        free = self.free.get(self.key(env_id, env_kwargs))
        return free.pop() if free else make_turngym_env(env_id, **env_kwargs)

    def give(self, env_id: str, env_kwargs: Mapping[str, Any], env: Any) -> None:
        self.free.setdefault(self.key(env_id, env_kwargs), []).append(env)


@register("turngym")
class TurngymAgentLoop(AgentLoopBase):
    """One turngym episode per trajectory; the Episode, its turn spans and the env's return come back with it."""

    # per worker process: verl instantiates a loop per trajectory, so what outlives one lives here
    envs = EnvPool()
    _tokens: dict[int, tuple[Any, ConversationTokenizer, dict[str, Any], set[int]]] = {}

    def __init__(self, *args: Any, env_id: str | None = None, env_kwargs: Mapping[str, Any] | None = None,
                 max_tokens_per_turn: int | None = None, tools: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        section = plain_config(self.config.get("turngym")) or {}
        self.env_id = env_id or section.get("env_id")
        self.env_kwargs = dict(plain_config(env_kwargs) or section.get("env_kwargs") or {})
        self.max_tokens_per_turn = max_tokens_per_turn or section.get("max_tokens_per_turn")
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self.max_turns = self.rollout_config.multi_turn.max_assistant_turns
        entry = self._tokens.get(id(self.tokenizer))
        if entry is None:  # chat template probes, fingerprint and vocabulary read once per tokenizer, not per trajectory
            entry = self._tokens[id(self.tokenizer)] = (self.tokenizer, ConversationTokenizer(self.tokenizer),
                                                        tokenizer_fingerprint(self.tokenizer), eos_ids(self.tokenizer))
        self.tokens, self.tokenizer_id, self.eos = entry[1], entry[2], entry[3]
        self.model_name = str(self.config.actor_rollout_ref.model.path)

    def _env_spec(self, info: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        env_id = info.get("env_id") or self.env_id
        if not env_id:
            raise ValueError("the turngym agent loop needs an env: set turngym.env_id (or env_id in the agent loop "
                             "config, or extra_info.env_id in the data), e.g. Calculator-v0")
        kwargs = {**self.env_kwargs, **dict(info.get("env_kwargs") or {})}
        if self.max_turns:
            kwargs["max_turns"] = int(self.max_turns)
        return full_env_id(str(env_id)), kwargs

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        info = plain_config(kwargs.get("extra_info")) or {}
        if not isinstance(info, Mapping):
            raise ValueError(f"extra_info must be a mapping, got {type(info).__name__}")
        env_id, env_kwargs = self._env_spec(info)
        env = await self.loop.run_in_executor(None, lambda: self.envs.take(env_id, env_kwargs))
        try:
            return await self._play(env, sampling_params, info, str(kwargs.get("uid", "") or uuid4().hex))
        finally:
            self.envs.give(env_id, env_kwargs, env)

    async def _play(self, env: Any, sampling_params: dict[str, Any], info: Mapping[str, Any], uid: str) -> AgentLoopOutput:
        options: dict[str, Any] = {"group": uid, "episode_id": f"{uid}#{uuid4().hex[:8]}"}
        if info.get("task") is not None:
            options["task"] = dict(info["task"])
        elif info.get("index") is not None:
            options["index"] = int(info["index"])
        seed = None if info.get("seed") is None else int(info["seed"])
        await self.loop.run_in_executor(None, lambda: env.reset(seed=seed, options=options))
        raw = env.unwrapped
        ep: Episode = raw.episode
        prompt_ids = self.tokens.prompt_ids(ep.prompt, ep.tools)
        if len(prompt_ids) > self.prompt_length:
            raise ValueError(f"{raw.env_name} prompt of episode {ep.id} has {len(prompt_ids)} tokens, more than "
                             f"rollout.prompt_length={self.prompt_length}; raise data.max_prompt_length")
        # the run's identity as the runner records it; the tokenizer's fingerprint lets a scorer check the ids
        ep.add_run_record(prompt_ids=prompt_ids, meta={"model": self.model_name, "turngym": VERSION,
                                                       "tokenizer": self.tokenizer_id})
        ids, total, ended_outside = list(prompt_ids), 0.0, False
        timing = {"generate_sequences": 0.0, "tool_calls": 0.0}
        request_id, stop = uuid4().hex, list(raw.stop)
        while not ep.done:
            budget = self.response_length - (len(ids) - len(prompt_ids))
            if budget <= 0:  # as the runner's token budget: the episode ends truncated, graded
                raw.end_episode("episode_token_budget")
                ended_outside = True
                break
            prefill = raw.reply_prefill()
            prefill_ids = self.tokens.encode(prefill) if prefill else []
            if prefill and budget <= len(prefill_ids):  # no room to continue it: the reply stays free
                prefill, prefill_ids = "", []
            cap = budget - len(prefill_ids)
            if self.max_tokens_per_turn:
                cap = min(cap, int(self.max_tokens_per_turn))
            params = {**sampling_params, "max_tokens": cap,
                      "stop": list(dict.fromkeys(list(sampling_params.get("stop") or []) + stop))}
            start = time.perf_counter()
            out = await self.server_manager.generate(request_id=request_id, prompt_ids=ids + prefill_ids,
                                                     sampling_params=params)
            gen_s = time.perf_counter() - start
            action_ids, finish = cut_generation(self.tokenizer, list(out.token_ids), cap, stop, self.eos)
            logprobs = list(out.log_probs[: len(action_ids)]) if out.log_probs else None
            text_ids = action_ids[:-1] if action_ids and action_ids[-1] in self.eos else action_ids
            text = self.tokenizer.decode(text_ids, skip_special_tokens=False)
            start = time.perf_counter()
            _obs, reward, terminated, truncated, _info = await self.loop.run_in_executor(None, env.step, prefill + text)
            timing["generate_sequences"] += gen_s
            timing["tool_calls"] += time.perf_counter() - start
            total += float(reward)
            turn = ep.turns[-1]
            ep.add_run_record(turn.index, generate_ms=gen_s * 1000.0, finish_reason=finish,
                              prefill_ids=prefill_ids if prefill else None)
            obs_ids = None
            if not (terminated or truncated):
                role = turn.observation_role or raw.observation_role
                obs_ids = self.tokens.observation_ids(turn.observation or "", role, action_ids)
            ep.add_run_record(turn.index, action_ids=action_ids, action_logprobs=logprobs, observation_ids=obs_ids)
            ids += prefill_ids + action_ids + (obs_ids or [])
        if ended_outside:  # end_episode graded it; step never returned that reward
            total += outcome_reward(ep.outcome, raw.outcome_metric)
        return self._output(ep, total, timing, logprobs_wanted=bool(sampling_params.get("logprobs")))

    def _output(self, ep: Episode, total: float, timing: dict[str, float], logprobs_wanted: bool) -> AgentLoopOutput:
        layout = ep.token_layout()
        p, n = layout.prompt_end, self.response_length
        spans = turn_spans(ep, layout)
        observations = sum(t.observation is not None for t in ep.turns)
        extra = {
            "turngym_episode": ep.to_json(),
            "turn_spans": spans,
            "turn_metrics": [copy.deepcopy(t.metrics) for t in ep.turns],
            "turn_truth": [{k: v.value for k, v in t.truth.items()} for t in ep.turns],
            "turn_scores": [float(t.reward) for t in ep.turns],  # verl's own key: the env's reward of each step
            "turngym_outcome": copy.deepcopy(ep.outcome),
        }
        return AgentLoopOutput(
            prompt_ids=layout.ids[:p], response_ids=layout.ids[p:][:n], response_mask=layout.trained[p:][:n],
            response_logprobs=layout.logprobs[p:][:n] if logprobs_wanted else None, reward_score=float(total),
            num_turns=1 + len(ep.turns) + observations, metrics=AgentLoopMetrics(**timing), extra_fields=extra)


def turn_spans(episode: Episode, layout: TokenLayout | None = None) -> list[tuple[int, int]]:
    """Each turn's reply tokens as a half-open range over the response (the ids after the prompt); ``layout``:
    the episode's token layout, when already computed."""
    layout = layout or episode.token_layout()
    p = layout.prompt_end
    return [(end - len(t.action_ids or []) - p, end - p) for t, end in zip(episode.turns, layout.action_ends, strict=True)]
