"""Rollout runner: many episodes at once, batched generation.

Each live episode keeps the exact token ids the model has seen. Two ways to batch:
``static`` (every backend): every tick all live episodes are continued in one
``policy.generate`` call, their envs are stepped with the returned text, and observation
ids are appended. ``continuous`` (backends that declare ``supports_stream``: the local
transformers policy, OpenAI-compatible servers): one decode loop; an episode's env is stepped
as soon as its turn ends and its next turn, or the next waiting episode, takes the slot while
the other rows keep decoding.
With greedy decoding (temperature 0) identical requests (the k samples of a group) are
generated once and the result copied. Finished episodes are appended to a JSONL file in
batches (flushed once full or ``flush_s`` old, and on exit, error and SIGTERM); a rerun skips
every episode id already in that file, so a run killed midway resumes with nothing lost and nothing
duplicated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym._version import __version__ as _VERSION
from turngym.agents.checker import check_env_factory, check_env_handle, check_policy
from turngym.agents.env_handle import (
    EnvBackendError,
    EnvFactory,
    EnvHandle,
    EnvRaised,
    end_with_env_error,
    env_factory,
)
from turngym.agents.options import BATCHING
from turngym.agents.policy import Generation, GenerationRequest, Policy, PolicyError, SamplingParams
from turngym.agents.tokenization import ChatTemplateError, ConversationTokenizer, plain_prompt, tokenizer_fingerprint
from turngym.envs.base import describe_error, restore
from turngym.episode import Episode, EpisodeWriter
from turngym.episode.reader import written_ids
from turngym.episode.store import sink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutTask:
    """One dataset item (or ad-hoc task) to play ``k`` times."""

    index: int | None = None
    task: dict[str, Any] | None = None
    k: int | None = None  # rollouts of this task; None: the runner's k
    slot: str | None = None  # tells apart two groups of the same task in one run
    first_k: int = 0  # number of the first rollout: a group split over processes numbers each share on
    # a branch: continue from the state after the first ``after`` turns of this recorded episode
    # (``turngym.envs.base.restore``), its token ids reused, rather than play the task from its start
    branch: Episode | None = field(default=None, compare=False, repr=False)
    after: int = 0

    def key(self) -> str:
        if self.branch is not None:
            base = f"branch:{self.branch.id}|after{self.after}"
        elif self.index is not None:
            base = str(self.index)
        else:
            base = "adhoc-" + hashlib.sha256(repr(sorted((self.task or {}).items())).encode()).hexdigest()[:12]
        return base if self.slot is None else f"{base}@{self.slot}"


@dataclass
class _Slot:
    env: EnvHandle
    episode: Episode
    ids: list[int] | None
    started: float
    prefill: tuple[str, list[int]] | None = None  # the forced start of the reply being generated: text, ids


def new_run_id() -> str:
    """A fresh run id (``RolloutRunner.run_id``): 8 hex digits, 4 random bytes, so two runs share one with
    probability 2^-32."""
    return secrets.token_hex(4)


def derive_seed(base_seed: int, *parts: Any) -> int:
    h = hashlib.sha256(repr((base_seed,) + parts).encode()).digest()
    return int.from_bytes(h[:4], "little")


@dataclass
class RolloutRunner:
    """Play tasks with a policy; ``env_factory`` makes one fresh env handle per concurrent slot (an
    :class:`~turngym.agents.env_handle.EnvFactory`, or a plain callable making in-process envs)."""

    policy: Policy
    env_factory: EnvFactory | Callable[[], EnvHandle]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    k: int = 1
    concurrency: int = 8
    seed: int = 0
    use_chat_template: bool | None = None
    run_tag: str = ""
    # the run these episodes belong to (``turngym.run``: stored in the output's run.json and kept by resume):
    # prefixed to every group and episode id so two runs never share an id, and recorded in ``meta["run"]`` with
    # the hash of the run's settings; sampling seeds do not depend on it (the same --seed plays the same episodes)
    run_id: str = ""
    run_settings: str = ""
    max_episode_tokens: int | None = None  # budget for all action + observation tokens of an episode
    batching: str = "static"  # "static" (one generate call per tick) | "continuous" (slots refilled as turns end)
    # free envs shared with later runners (e.g. the trainer's, one per rollout call): each env, and the dataset
    # it loaded, is made once and reset for every episode; None: this runner's own pool
    env_pool: list[Any] | None = None
    # finished episodes are written in batches (one fsync each): flushed at write_batch episodes or
    # when the next one finishes flush_s after the oldest; all before run() returns or raises (turngym.episode.store)
    write_batch: int = 64
    flush_s: float = 0.5

    def __post_init__(self) -> None:
        if self.k < 1 or self.concurrency < 1:
            raise ValueError("k and concurrency must be >= 1")
        self.env_factory = env_factory(self.env_factory)
        check_env_factory(self.env_factory)
        if self.env_factory.slots is not None:  # back-pressure: never more live episodes than the pool holds envs
            self.concurrency = min(self.concurrency, self.env_factory.slots)
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {self.batching!r}")
        check_policy(self.policy)  # the declaration is what the runner reads below: refuse one that lies
        if self.batching == "continuous" and not self.policy.supports_stream:
            raise ValueError(f"batching='continuous' needs a policy that streams (supports_stream: the local "
                             f"transformers policy, OpenAI-compatible servers); {type(self.policy).__name__} does "
                             f"not: use batching='static'")
        tok = self.policy.tokenizer
        self.tokens = ConversationTokenizer(tok, self.use_chat_template) if tok is not None else None
        self.tokenizer_id = tokenizer_fingerprint(tok) if tok is not None else None  # recorded with the ids
        self._free_envs: list[Any] = self.env_pool if self.env_pool is not None else []
        self._on_turn: Callable[[Episode], None] | None = None

    # ------------------------------------------------------------------ ids

    def group_id(self, env_id: str, dataset: str, task: RolloutTask) -> str:
        """The task's key in this runner, without the run id: what sampling seeds derive from."""
        tag = f"{self.run_tag}|" if self.run_tag else ""
        return f"{tag}{env_id}|{dataset}|{task.key()}"

    def in_run(self, group: str) -> str:
        """``Episode.group``: a group key (``group_id``) inside this run, shared by the k rollouts of one task."""
        return f"{self.run_id}|{group}" if self.run_id else group

    def episode_id(self, env_id: str, dataset: str, task: RolloutTask, k: int) -> str:
        """The id of rollout ``k`` of the task: its group in this run, then ``#k``."""
        return f"{self.in_run(self.group_id(env_id, dataset, task))}#{k}"

    # ------------------------------------------------------------------ main loop

    def run(self, tasks: Iterable[RolloutTask | int], out_path: str | Path | None = None,
            progress: Callable[[int, int], None] | None = None,
            on_turn: Callable[[Episode], None] | None = None) -> list[Episode]:
        """Play every task ``k`` times; returns the episodes finished by this call. ``progress(done, total)``
        follows finished episodes; ``on_turn(episode)`` is called once an episode has its prompt (no turns yet)
        and after every turn (its last turn is the new one), so a caller can stream an episode as it is played."""
        self._on_turn = on_turn
        tasks = [t if isinstance(t, RolloutTask) else RolloutTask(index=int(t)) for t in tasks]
        done_ids = written_ids(out_path) if out_path else set()
        write, writes = sink(EpisodeWriter(out_path) if out_path else None, self.write_batch, self.flush_s)
        pending = iter(self._jobs(tasks, done_ids))
        total = sum(t.k or self.k for t in tasks) - len(done_ids)
        finished: list[Episode] = []

        def finish(slot: _Slot) -> None:
            self._free_envs.append(slot.env)
            ep = slot.episode
            ep.add_run_record(meta={"wall_ms": round((time.perf_counter() - slot.started) * 1000.0, 1)})
            write(ep)
            finished.append(ep)
            if progress is not None:
                progress(len(finished), max(total, len(finished)))

        with writes:  # buffered episodes are flushed on exit, on error and on SIGTERM
            if self.batching == "continuous":
                self._run_continuous(pending, finish)
            else:
                self._run_static(pending, finish)
        return finished

    def _run_static(self, pending: Iterator[tuple[RolloutTask, int, str]], finish: Callable[[_Slot], None]) -> None:
        live: list[_Slot] = []
        while True:
            while len(live) < self.concurrency:
                jobs = list(itertools.islice(pending, self.concurrency - len(live)))
                if not jobs:
                    break
                for slot in self._start_many(jobs):
                    if slot.episode.done:  # a branch restored after the episode's last turn
                        finish(slot)
                    else:
                        live.append(slot)
            if not live:
                break
            for slot in self._tick(live):
                live.remove(slot)
                finish(slot)

    def _run_continuous(self, pending: Iterator[tuple[RolloutTask, int, str]], finish: Callable[[_Slot], None]) -> None:
        """Hand the policy's decode loop new episodes as slots free up, and step each env as its turn ends."""
        slots: dict[str, _Slot] = {}

        def feed(free: int) -> list[tuple[str, GenerationRequest]]:
            # never more live episodes than ``concurrency``, even where the policy counts rows that several
            # episodes share (greedy identical requests decoded once) as one
            free = min(free, self.concurrency - len(slots))
            out: list[tuple[str, GenerationRequest]] = []
            while len(out) < free:
                jobs = list(itertools.islice(pending, free - len(out)))
                if not jobs:
                    break
                for slot in self._start_many(jobs):
                    req = None if slot.episode.done else self._next_request(slot)
                    if req is None:
                        finish(slot)
                        continue
                    slots[slot.episode.id] = slot
                    out.append((slot.episode.id, req))
            return out

        def prepare(replies: Sequence[tuple[str, Generation]]) -> None:
            """Replies that landed together: remote envs get all their steps before any is awaited."""
            for key, gen in replies:
                slot = slots[key]
                slot.env.unwrapped.submit_step((slot.prefill[0] if slot.prefill else "") + gen.text)

        def deliver(key: str, gen: Generation) -> GenerationRequest | None:
            slot = slots[key]
            if self._step(slot, gen, gen.meta.get("wall_ms", 0.0)):
                del slots[key]
                finish(slot)
                return None
            req = self._next_request(slot)
            if req is None:
                del slots[key]
                finish(slot)
            return req

        self.policy.stream(feed, deliver, self._sampling_for(self._env_stop()), self.concurrency, prepare=prepare)

    def _env_stop(self) -> tuple[str, ...]:
        env = self._env()
        self._free_envs.append(env)
        return tuple(env.unwrapped.stop)

    def _sampling_for(self, env_stop: Sequence[str]) -> SamplingParams:
        """The user's sampling with the env's stop strings added (all slots share one env type)."""
        stops = tuple(dict.fromkeys(self.sampling.stop + tuple(env_stop)))
        return self.sampling if stops == self.sampling.stop else dataclasses.replace(self.sampling, stop=stops)

    def _next_request(self, slot: _Slot) -> GenerationRequest | None:
        """The slot's next generation request, or None after ending an episode out of token budget."""
        if self._out_of_budget(slot):
            return None
        return self._requests([slot])[0]

    def _out_of_budget(self, slot: _Slot) -> bool:
        """End the episode (saying why) when it may generate no more tokens."""
        budget = self._budget(slot)
        if budget is None or budget > 0:
            return False
        max_ctx = self.policy.max_context
        full = max_ctx is not None and len(slot.ids) >= max_ctx
        slot.env.unwrapped.end_episode("context_length" if full else "episode_token_budget")
        return True

    def _jobs(self, tasks: Sequence[RolloutTask], skip: set[str]) -> Iterator[tuple[RolloutTask, int, str]]:
        probe = self._env()
        check_env_handle(probe)  # the members read below and on every slot: refuse an env that lacks one
        env_id = probe.unwrapped.env_name
        self._free_envs.append(probe)
        if probe.unwrapped.prefills and self.tokens is None:
            raise PolicyError(
                f"{env_id} starts the agent's reply with a forced prefix (reply_prefill, e.g. SearchQA-v0's "
                f"force_first_search=True), which needs a backend that continues token ids; "
                f"{type(self.policy).__name__} {self.policy.name!r} has no tokenizer (a chat API "
                f"cannot be made to continue a started reply): unset the option, or use a local model or an "
                f"OpenAI-compatible server given a tokenizer")
        for task in tasks:
            dataset = self._dataset_name(probe, task)
            group = self.group_id(env_id, dataset, task)
            for k in range(task.first_k, task.first_k + (task.k or self.k)):
                if self.episode_id(env_id, dataset, task, k) not in skip:
                    yield task, k, group

    @staticmethod
    def _dataset_name(env: Any, task: RolloutTask) -> str:
        if task.branch is not None:
            return str(task.branch.task.get("dataset", "") or "")
        if task.task is not None:
            return str(task.task.get("dataset", "adhoc"))
        return str(env.unwrapped.dataset_name or "")

    def _env(self) -> Any:
        return self._free_envs.pop() if self._free_envs else self.env_factory()

    def _reset_args(self, task: RolloutTask, k: int, group: str) -> tuple[int, dict[str, Any]]:
        """The seed and options that reset an env to rollout ``k`` of ``task``."""
        options: dict[str, Any] = {"episode_id": f"{self.in_run(group)}#{k}", "group": self.in_run(group)}  # as episode_id()
        if task.task is not None:
            options["task"] = task.task
        else:
            options["index"] = task.index
        return derive_seed(self.seed, group, k), options

    def _start_many(self, jobs: Sequence[tuple[RolloutTask, int, str]]) -> list[_Slot]:
        """Slots for several jobs; every reset is announced (``submit_reset``) before any is awaited, so remote envs
        get them in one round of messages."""
        envs: list[Any] = []
        for task, k, group in jobs:
            env = None if task.branch is not None else self._env()
            if env is not None:
                seed, options = self._reset_args(task, k, group)
                env.unwrapped.submit_reset(seed=seed, options=options)
            envs.append(env)
        return [self._start(*job, env=env) for job, env in zip(jobs, envs, strict=True)]

    def _start(self, task: RolloutTask, k: int, group: str, env: Any = None) -> _Slot:
        if task.branch is not None:
            return self._start_branch(task, k, group)
        env = env if env is not None else self._env()
        seed, options = self._reset_args(task, k, group)
        env.reset(seed=seed, options=options)
        ep: Episode = env.unwrapped.episode
        ep.add_run_record(meta=self._run_meta(task, k))
        ids = None
        if self.tokens is not None:
            ids = self.tokens.prompt_ids(ep.prompt, tools=ep.tools)
            ep.add_run_record(prompt_ids=ids, meta={"tokenizer": self.tokenizer_id})
        if self._on_turn is not None:
            self._on_turn(ep)  # the prompt, before the first turn
        return _Slot(env=env, episode=ep, ids=ids, started=time.perf_counter())

    def _run_meta(self, task: RolloutTask, k: int) -> dict[str, Any]:
        meta: dict[str, Any] = {"model": self.policy.name, "k": k, "turngym": _VERSION, "task_key": task.key()}
        if self.run_id:
            meta["run"] = {"id": self.run_id, "settings": self.run_settings}
        return meta

    def _start_branch(self, task: RolloutTask, k: int, group: str) -> _Slot:
        """A slot in the state after ``task.after`` turns of ``task.branch``: the env restored by replay, the
        recorded token ids of the prefix reused (the model continues exactly what it saw)."""
        src, after = task.branch, task.after
        if self.tokens is not None and src.prompt_ids is None:
            raise PolicyError(f"episode {src.id} carries no token ids, so it cannot be continued on the ids the "
                              "policy saw; branch it with a text backend or from episodes with ids")
        env = self._env()
        differ = restore(env, src, after, seed=derive_seed(self.seed, group, k), episode_id=f"{self.in_run(group)}#{k}",
                         group=self.in_run(group))
        ep: Episode = env.unwrapped.episode
        ids = None
        if self.tokens is not None:  # the replayed turns' text is the env's; their ids are the recorded ones
            ep.add_run_record(prompt_ids=src.prompt_ids, meta={"tokenizer": self.tokenizer_id})
            for rec in src.turns[:after]:
                ep.add_run_record(rec.index, action_ids=rec.action_ids or [], action_logprobs=rec.action_logprobs,
                                  observation_ids=rec.observation_ids, prefill_ids=rec.prefill_ids)
            ids = ep.token_layout().ids
        ep.add_run_record(meta={**self._run_meta(task, k), "branch": {"of": src.id, "after": after, "replay_differs": differ}})
        return _Slot(env=env, episode=ep, ids=ids, started=time.perf_counter())

    def _budget(self, slot: _Slot) -> int | None:
        """Tokens this episode may still generate (context window and episode budget), or None."""
        caps = []
        max_ctx = self.policy.max_context
        if slot.ids is not None and max_ctx:
            caps.append(max_ctx - len(slot.ids))
        if slot.ids is not None and self.max_episode_tokens is not None:
            caps.append(self.max_episode_tokens - (len(slot.ids) - len(slot.episode.prompt_ids or [])))
        return min(caps) if caps else None

    def _requests(self, live: Sequence[_Slot]) -> list[GenerationRequest]:
        reqs = []
        for slot in live:
            self._open_prefill(slot)
            cap = self._budget(slot)
            if slot.ids is not None:
                reqs.append(GenerationRequest(prompt_ids=slot.ids, max_new_tokens=cap))
            elif self.policy.prompt_format == "text":
                reqs.append(GenerationRequest(prompt_text=self._plain_text(slot)))
            else:
                reqs.append(GenerationRequest(messages=self._messages(slot), tools=slot.episode.tools))
        return reqs

    def _open_prefill(self, slot: _Slot) -> None:
        """Append the env's forced start of the next reply (``reply_prefill``) to the slot's ids: prompt
        tokens the model continues from, recorded on the turn as untrained ``prefill_ids``."""
        text = slot.env.unwrapped.reply_prefill()
        slot.prefill = None
        if not text:
            return
        if slot.ids is None or self.tokens is None:
            raise PolicyError("a forced reply prefix needs token ids; this backend has none")
        ids = self.tokens.encode(text)
        budget = self._budget(slot)
        if budget is not None and budget <= len(ids):  # no room left to continue it: the reply stays free
            return
        slot.ids.extend(ids)
        slot.prefill = (text, ids)

    @staticmethod
    def _plain_text(slot: _Slot) -> str:
        """A base model's transcript for text-only backends: as the local path renders it without a chat
        template (contents joined by blank lines, then each action and observation as written)."""
        if slot.episode.tools:
            raise ChatTemplateError("native tool calling needs chat prompts; this policy sends plain text "
                                    "(prompt_format='text'): use tool_format='prompting' or prompt_format='chat'")
        return plain_prompt(slot.episode.prompt) + "".join(t.action + (t.observation or "") for t in slot.episode.turns)

    @staticmethod
    def _messages(slot: _Slot) -> list[dict[str, str]]:
        """A chat transcript for text-only backends (no token ids)."""
        env = slot.env.unwrapped
        msgs = [dict(m) for m in slot.episode.prompt]
        for t in slot.episode.turns:
            role = t.observation_role or env.observation_role
            if role is None:
                if msgs[-1]["role"] == "assistant":
                    msgs[-1]["content"] += t.action + (t.observation or "")
                else:
                    msgs.append({"role": "assistant", "content": t.action + (t.observation or "")})
            else:
                msgs.append({"role": "assistant", "content": t.action})
                if t.observation is not None:
                    msgs.append({"role": role, "content": t.observation})
        return msgs

    def _tick(self, live: list[_Slot]) -> list[_Slot]:
        """One batched generation for all live episodes, then one env step each."""
        ended = [slot for slot in live if self._out_of_budget(slot)]
        runnable = [slot for slot in live if slot not in ended]
        if not runnable:
            return ended
        sampling = self._sampling_for(runnable[0].env.unwrapped.stop)
        start = time.perf_counter()
        gens = self._generate_once(self._requests(runnable), sampling)
        gen_ms = (time.perf_counter() - start) * 1000.0
        for slot, gen in zip(runnable, gens, strict=True):  # remote envs: every step sent before any is awaited
            slot.env.unwrapped.submit_step((slot.prefill[0] if slot.prefill else "") + gen.text)
        results = [self._step(slot, gen, gen_ms) for slot, gen in zip(runnable, gens, strict=True)]
        ended.extend(slot for slot, is_done in zip(runnable, results, strict=True) if is_done)
        return ended

    def _generate_once(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        """``policy.generate``; with greedy decoding, identical token-id requests are generated once
        and the result copied (the k samples of a group are identical at temperature 0)."""
        if sampling.temperature != 0 or any(r.prompt_ids is None for r in requests):
            return self.policy.generate(requests, sampling)
        unique: dict[tuple, int] = {}
        first: list[GenerationRequest] = []
        which = []
        for r in requests:
            key = (tuple(r.prompt_ids), r.max_new_tokens)
            if key not in unique:
                unique[key] = len(first)
                first.append(r)
            which.append(unique[key])
        gens = self.policy.generate(first, sampling)
        return [dataclasses.replace(gens[j], token_ids=None if gens[j].token_ids is None else list(gens[j].token_ids),
                                    logprobs=None if gens[j].logprobs is None else list(gens[j].logprobs),
                                    meta=dict(gens[j].meta)) for j in which]

    def _step(self, slot: _Slot, gen: Generation, gen_ms: float) -> bool:
        prefill, slot.prefill = slot.prefill, None
        # the env is sent prefill + continuation and records the prefill on the turn; only the continuation
        # was generated, so the prefill's ids are prompt tokens before the action's
        action, before = (prefill[0] if prefill else "") + gen.text, len(slot.episode.turns)
        try:
            _, _, terminated, truncated, _ = slot.env.step(action)
        except EnvBackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - the env's own step raised: that episode's error record, not the run's
            error = exc.error if isinstance(exc, EnvRaised) else describe_error(exc)
            log.warning("episode %s: its env's step raised %s: %s (%s); recorded as an env_error turn and the "
                        "episode ends there; the run goes on", slot.episode.id, error["type"], error["message"][:200],
                        error["where"], exc_info=not isinstance(exc, EnvRaised))
            end_with_env_error(slot.env.unwrapped, action, error, before, "env_error")
            terminated, truncated = False, True
        ep, turn = slot.episode, slot.episode.turns[-1]
        ep.add_run_record(turn.index, generate_ms=gen_ms, finish_reason=gen.finish_reason,
                          prefill_ids=None if prefill is None else prefill[1])
        if gen.token_ids is not None and slot.ids is not None:
            obs_ids = None
            if not (terminated or truncated) and self.tokens is not None:
                role = turn.observation_role or slot.env.unwrapped.observation_role
                obs_ids = self.tokens.observation_ids(turn.observation or "", role, gen.token_ids)
            ep.add_run_record(turn.index, action_ids=gen.token_ids, action_logprobs=gen.logprobs, observation_ids=obs_ids)
            slot.ids.extend(gen.token_ids)
            slot.ids.extend(obs_ids or [])
        if self._on_turn is not None:
            self._on_turn(slot.episode)
        return terminated or truncated

