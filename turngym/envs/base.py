"""TextEnv: the reset/step contract every turngym environment shares.

A subclass supplies the dataset items, the prompt, and what one action does
(:meth:`TextEnv.act`). The base class owns the episode record, the turn limit,
seeding, and the deterministic ``info`` dict, so every env behaves the same way to
agents, the rollout runner and gymnasium's checker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sysconfig
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from turngym.envs.tools import EnvTool
from turngym.episode import EnvDeclarations, Episode, RewardNeeds, Turn, json_copy, plain_json, utf8_encodable
from turngym.truth import TruthValue, check_declared

MAX_TEXT_LENGTH = 1_000_000
log = logging.getLogger(__name__)

# What ``sample()`` draws from: ASCII printables plus a spread of non-Latin scripts and
# symbols. ``contains`` accepts any Unicode string, so agents are not limited to this.
_SAMPLE_CHARSET = (
    "".join(chr(c) for c in range(32, 127))
    + "\n\t"
    + "éüßçñøåæ"
    + "αβγδεθλμπσω∑∫√∞≤≥≠"
    + "абвгдежзий"
    + "的一是不了人我在有他"
    + "あいうえおカキクケコ"
    + "한국어"
    + "مرحبا"
    + "😀🚀✓"
)


class UnicodeText(spaces.Text):
    """A gymnasium ``Text`` space that admits any Unicode string up to ``max_length``."""

    def __init__(self, max_length: int = MAX_TEXT_LENGTH, min_length: int = 0, seed: Any = None):
        super().__init__(max_length=max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is None and probability is None:
            length = int(self.np_random.integers(self.min_length, min(self.max_length, 256) + 1))
            return super().sample(mask=(length, None))
        return super().sample(mask=mask, probability=probability)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


@dataclass
class ActionResult:
    """What one agent action did, as decided by a concrete env."""

    observation: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    parse_error: str | None = None
    reward: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    terminated: bool = False
    final_answer: str | None = None
    tool_ms: float = 0.0
    observation_role: str | None = None  # overrides the env's observation_role for this turn
    # per-turn truth (key -> value) for credit tables, under keys the env declares in ``truth_keys``;
    # stored in ``Turn.truth`` with source "env", never in ``metrics`` that rewards read
    truth: dict[str, Any] = field(default_factory=dict)


def describe_error(exc: BaseException) -> dict[str, str]:
    """What went wrong, for the turn record: the exception type, message and innermost frame outside the stdlib."""
    frames = traceback.extract_tb(exc.__traceback__)
    stdlib = sysconfig.get_paths()["stdlib"]
    outside = [f for f in frames if not f.filename.startswith(stdlib)]
    frame = (outside or frames or [None])[-1]  # the innermost frame outside the standard library
    where = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name}" if frame else ""
    return {"type": type(exc).__name__, "message": str(exc)[:2000], "where": where}


def as_encodable_text(text: str) -> str:
    """``text`` with surrogate code points made UTF-8 encodable: an adjacent high+low pair becomes
    the character it encodes, a lone one U+FFFD. What the model is shown must be text a tokenizer
    accepts (fast tokenizers raise on a lone surrogate, e.g. the agent's own one echoed back)."""
    if utf8_encodable(text):  # the common case, checked in C
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _check_serialisable(result: ActionResult) -> None:
    """Raise (ValueError/TypeError) if the turn could not be written as JSON (e.g. a 5,000-digit int).
    Text fields that are strings are not dumped: any string is JSON, and the observation is a turn's longest."""
    texts = [v for v in (result.final_answer, result.observation) if v is not None and type(v) is not str]
    record = [result.tool_calls, result.metrics, result.truth, texts]
    if not plain_json(record):  # only data of other types goes through the encoder (its first call was a fifth of a step)
        json.dumps(record)


class TextEnv(gym.Env, EnvDeclarations):
    """Base class for text environments with turn recording.

    Its public surface is what an env author writes and what a user calls, nothing else:

    * an author implements :meth:`num_items`, :meth:`get_item`, :meth:`make_prompt`, :meth:`act` and
      :meth:`grade`, declares the class attributes below (``reward_needs`` at least: what rewards need to
      know about its episodes, copied into every episode), may override the hooks (:meth:`make_tools`,
      :meth:`reply_prefill`, :meth:`on_reset`, :meth:`on_close_episode`, :meth:`check_ready`,
      :meth:`action_error`, :meth:`failed_outcome`, :meth:`normalise_task`, :meth:`anchor_state`,
      :meth:`declared_needs`) and calls :meth:`set_truth` from ``grade``;
    * a user calls Gymnasium's :meth:`reset`, :meth:`step`, :meth:`render`, :meth:`close`, and
      :meth:`end_episode` to end an episode from outside; ``episode`` is the record so far.

    What works on any env from outside lives in this module as functions: :func:`restore` (replay a
    recorded episode's prefix), :func:`outcome_reward` (the task's Gymnasium reward of an outcome),
    :func:`public_task` (a task without its labels). ``observation_role`` says how the runner feeds an
    observation back: ``None`` appends it to the assistant's text (Search-R1, ToRL),
    ``"user"`` / ``"tool"`` sends it as a new chat message.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    env_name: str = "turngym/TextEnv"
    dataset_name: str = ""
    observation_role: str | None = None
    stop: tuple[str, ...] = ()
    prefills: bool = False  # True when reply_prefill may return text (set per instance by an env option)
    manifest: Any = None  # the dataset file the items come from (a DatasetManifest), recorded in Episode.meta
    # the prompt styles its ``prompt_style`` argument takes (chat template or plain text for base models); ()
    # when it has no such argument and renders one way for every model. The run pipeline passes the
    # policy's style only to an env that declares it (turngym.run.pipeline)
    prompt_styles: tuple[str, ...] = ()
    reward_needs: RewardNeeds | None = None  # every env declares it (the contract checker requires it)
    # the per-turn truth keys the env writes into ``Turn.truth`` (source "env"); writing another is an error
    truth_keys: tuple[str, ...] = ()
    # the outcome field that is the task's score: ``env.step`` returns it as the reward of the step
    # that ends the episode (None: the env's per-step rewards already are the task, e.g. Digits-v0)
    outcome_metric: str | None = "correct"
    # task fields that hold labels: kept in the Episode record for graders, never put in ``info``
    gold_keys: tuple[str, ...] = ("answers", "answer", "golden_answers", "final_answer", "solution", "ground_truth")
    # why the env declares no tools although its actions call some (BFCL: each entry brings its own functions);
    # None where it declares them (declared_tools) or has none
    static_tools_absent: str | None = None

    def __init__(self, max_turns: int = 8, render_mode: str | None = None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.max_turns = int(max_turns)
        self.render_mode = render_mode
        self.observation_space = UnicodeText()
        self.action_space = UnicodeText()
        self.episode: Episode | None = None

    # -------------------------------------------------------------- subclass API

    @classmethod
    def declared_needs(cls, episode: Episode) -> RewardNeeds | None:
        """The declaration this env writes into an episode like ``episode``, for files written before
        episodes carried all of it; an env whose declaration depends on its configuration reads that
        configuration from the episode (None: it cannot tell)."""
        return cls.reward_needs

    def num_items(self) -> int:
        raise NotImplementedError

    def get_item(self, index: int) -> dict[str, Any]:
        """The task dict for the ``index``-th item in the dataset's own file order."""
        raise NotImplementedError

    def make_prompt(self, task: dict[str, Any]) -> list[dict[str, str]]:
        raise NotImplementedError

    def act(self, action: str) -> ActionResult:
        raise NotImplementedError

    def make_tools(self, task: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Tool schemas for a chat template's ``tools=`` (native tool calling), or None."""
        return None

    def declared_tools(self) -> tuple[EnvTool, ...]:
        """The env's tools for stacks that call tools by name (``turngym.envs.tools``): each one's typed
        parameters, how a call becomes this env's action, and which call ends the episode. () for none."""
        return ()

    def reply_prefill(self) -> str:
        """Text the agent's next reply must start with ('' for none), e.g. an opened tool call that
        forces a search (the token-level twin of a chat API's ``tool_choice="required"``). The rollout
        runner puts its ids after the generation prompt as prompt tokens (never trained), lets the model
        continue, and steps the env with prefill + continuation; a caller of ``step`` sends both itself.
        Only envs that set ``prefills`` return text here (a backend without token ids refuses them). The env
        records the prefix it chose on the turn (``Turn.prefill``) when the action it is sent starts with it."""
        return ""

    def grade(self, episode: Episode) -> dict[str, Any]:
        """The episode's ``outcome`` once it has ended."""
        return {}

    def on_reset(self, task: dict[str, Any]) -> None:
        """Hook to set up per-episode state (an interpreter, a backend instance)."""

    def on_close_episode(self) -> None:
        """Hook to release per-episode state."""

    def check_ready(self) -> None:
        """Raise if something the env needs outside itself (an index, a server) is missing, so a
        run fails before its first episode instead of scoring every episode as a tool error."""

    def action_error(self, action: str, exc: Exception) -> ActionResult:
        """What the agent sees when deciding, checking or running its action raised.

        The default keeps the episode going with an error observation; an env whose protocol
        ends after one action (single-turn BFCL) overrides this to end it.
        """
        return ActionResult(observation=f"Error: the environment could not process this action "
                                        f"({type(exc).__name__}: {str(exc)[:500]})")

    def failed_outcome(self, exc: Exception) -> dict[str, Any]:
        """The outcome when grading itself raised: the env's failing verdict (overridden per env)."""
        return {"correct": False}

    def normalise_task(self, task: dict[str, Any]) -> dict[str, Any]:
        """Validate an ad-hoc ``options={"task": ...}`` dict."""
        if not isinstance(task, dict):
            raise TypeError(f"options['task'] must be a dict, got {type(task).__name__}")
        if not isinstance(task.get("question"), str) or not task["question"].strip():
            raise ValueError("options['task'] needs a non-empty string 'question'")
        answers = task.get("answers", [])
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, (list, tuple)):
            raise TypeError("options['task']['answers'] must be a list of strings")
        return {**task, "answers": [str(a) for a in answers], "dataset": task.get("dataset", "adhoc")}

    # -------------------------------------------------------------- gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if self.episode is not None and not self.episode.done:
            self.on_close_episode()
        options = options or {}
        if "task" in options and "index" in options:
            raise ValueError("pass either options['index'] or options['task'], not both")
        if "task" in options:
            task = self.normalise_task(options["task"])
        else:
            n = self.num_items()
            if n <= 0:
                raise ValueError(f"{self.env_name} has no dataset items; pass options={{'task': ...}}")
            if "index" in options:
                index = options["index"]
                if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
                    raise TypeError(f"options['index'] must be an int, got {type(index).__name__}")
                if not 0 <= index < n:
                    raise IndexError(f"options['index']={index} is out of range: the dataset has {n} items")
            else:
                index = int(self.np_random.integers(0, n))
            task = self.get_item(int(index))
        prompt = [{**m, "content": as_encodable_text(m["content"])} if isinstance(m.get("content"), str) else m
                  for m in self.make_prompt(task)]
        tools = self.make_tools(task)
        self.episode = Episode(
            id=str(options.get("episode_id", f"{self.env_name}:{task.get('dataset', '')}:{task.get('index', 'adhoc')}")),
            env_id=self.env_name,
            task=json_copy(task),
            prompt=prompt,
            tools=tools,
            seed=seed,
            group=options.get("group"),
            reward_needs=self.reward_needs,
        )
        if self.manifest is not None:  # which file the item came from (a run's subset file lists all ids)
            m = self.manifest
            self.episode.meta["dataset"] = {"name": m.dataset, "split": m.split, "source": m.source, "sha256": m.sha256,
                                            "count": m.count}
        self.on_reset(task)
        return render_messages(prompt), self._info()

    def set_truth(self, turn: Turn, key: str, value: Any) -> None:
        """Record truth known only later (e.g. at grading) on a turn, under a declared key."""
        turn.truth.update(check_declared({key: TruthValue(value, "env")}, self.truth_keys, self.env_name))

    def step(self, action: str):
        if self.episode is None:
            raise RuntimeError("call reset() before step()")
        if self.episode.done:
            raise RuntimeError("episode has ended; call reset() to start a new one")
        if not isinstance(action, str):
            action = "" if action is None else str(action)
        start = time.perf_counter()
        prefill = self.reply_prefill()  # the start this reply was forced to take, if the action took it
        prefill = prefill if prefill and action.startswith(prefill) else None
        error: dict[str, str] | None = None
        try:
            result = self.act(action)
            _check_serialisable(result)
        except Exception as exc:  # noqa: BLE001 - one model output must never abort a run; recorded below
            error = describe_error(exc)
            log.warning("%s: action raised %s (%s); recorded on the turn as env_error", self.env_name,
                        error["type"], error["where"], exc_info=True)
            result = self.action_error(action, exc)
        tool_ms = result.tool_ms or (time.perf_counter() - start) * 1000.0
        if error is not None:
            result.metrics = {**result.metrics, "env_error": error}
            result.parse_error = result.parse_error or f"{error['type']}: {error['message']}"
        if result.observation is not None:
            result.observation = as_encodable_text(result.observation)
        ep = self.episode
        turn = Turn(
            index=len(ep.turns),
            action=action,
            tool_calls=result.tool_calls,
            parse_error=result.parse_error,
            observation=result.observation,
            observation_role=result.observation_role,
            reward=float(result.reward),
            metrics=result.metrics,
            latency_ms={"tool": round(tool_ms, 3)},
            truth=check_declared(result.truth, self.truth_keys, self.env_name),
            prefill=prefill,
        )
        ep.turns.append(turn)
        terminated = bool(result.terminated)
        truncated = not terminated and len(ep.turns) >= self.max_turns
        if result.final_answer is not None:
            ep.final_answer = result.final_answer
        if terminated or truncated:
            if truncated:
                turn.unshown_observation = turn.observation  # ran at the turn limit, never shown (IGPO reads it)
            turn.observation = None
            ep.terminated, ep.truncated = terminated, truncated
            ep.outcome = self._safe_grade(ep)
            turn.reward += outcome_reward(ep.outcome, self.outcome_metric)
            self.on_close_episode()
        obs = "" if turn.observation is None else turn.observation
        return obs, turn.reward, terminated, truncated, self._info()

    def end_episode(self, reason: str) -> None:
        """End the episode from outside (e.g. the model's context is full): truncated, graded.

        The last observation stays recorded: the agent was shown it.
        """
        ep = self.episode
        if ep is None or ep.done:
            return
        ep.truncated = True
        ep.meta["truncation"] = reason
        ep.outcome = self._safe_grade(ep)
        self.on_close_episode()

    def submit_reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Announce the next ``reset`` (the env handle's batched form, ``turngym.agents.env_handle``): an env in
        this process answers ``reset`` at once, so there is nothing to send ahead."""
        return None

    def submit_step(self, action: str) -> None:
        """Announce the next ``step(action)`` (the batched form); in process, nothing to send ahead."""
        return None

    def anchor_state(self, episode: Episode, t: int) -> str:
        """GiGPO's anchor state of turn ``t``: a key equal for turns that start from the same env state.
        Default: what the env showed right before the turn (the task's prompt for turn 0, else the
        previous turn's observation), so two rollouts that ran the same search or the same code share
        a state whatever they wrote around it. An env with a richer state (e.g. a backend) overrides it."""
        shown = episode.prompt if t == 0 else episode.turns[t - 1].observation
        return hashlib.sha1(json.dumps(shown, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()

    def _safe_grade(self, ep: Episode) -> dict[str, Any]:
        """``grade``, or the env's failing verdict plus the error if grading raised on this output."""
        try:
            outcome = self.grade(ep)
            json.dumps(outcome)  # NaN allowed, as written
            return outcome
        except Exception as exc:  # noqa: BLE001 - recorded in the outcome, never raised out of step
            log.warning("%s: grading raised %s; recorded as grading_error", self.env_name, type(exc).__name__,
                        exc_info=True)
            return {**self.failed_outcome(exc), "grading_error": describe_error(exc)}

    def close(self) -> None:
        if self.episode is not None and not self.episode.done:
            self.on_close_episode()
        super().close()

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.episode is None:
            return None
        return render_episode(self.episode)

    def _info(self) -> dict[str, Any]:
        ep = self.episode
        assert ep is not None
        info: dict[str, Any] = {"episode_id": ep.id, "task": public_task(ep.task, self.gold_keys), "turn_count": len(ep.turns)}
        if ep.turns:
            info["turn"] = ep.turns[-1].info_dict()
        if ep.done:
            info["outcome"] = json_copy(ep.outcome)
            info["final_answer"] = ep.final_answer
        return info


def outcome_reward(outcome: dict[str, Any], metric: str | None) -> float:
    """The Gymnasium reward for the task: ``outcome[metric]`` (an env's ``outcome_metric``) as a number
    (correct → 1.0), 0.0 where the env declares none or no verdict was reached (``outcome["graded"]`` is
    False, which ``info["outcome"]`` shows). ``step`` adds it on the step that ends an episode; a caller that
    ends one with ``end_episode`` reads the same reward here."""
    if metric is None or outcome.get("graded") is False:
        return 0.0
    value = outcome.get(metric, 0.0)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) else 0.0


def public_task(task: dict[str, Any], gold_keys: Sequence[str]) -> dict[str, Any]:
    """The task as agents see it (``info["task"]``): without the labels an env declares in ``gold_keys``."""
    return json_copy({k: v for k, v in task.items() if k not in gold_keys})


def restore(env: Any, episode: Episode, turns: int, seed: int | None = None, episode_id: str | None = None,
            group: str | None = None) -> list[int]:
    """Put ``env`` (a TextEnv, wrapped or not) in the state after the first ``turns`` turns of a recorded
    ``episode``: reset to the same task with the episode's seed, then replay the recorded actions (so
    MathCode re-runs the executed cells in a fresh sandbox session, BFCL calls fresh backends). Returns
    the indices of replayed turns whose observation differs from the record (flagged, not trusted); a
    prompt that differs (an env built with other options) is refused. ``seed`` then reseeds the env's
    random generator, so branches restored from one prefix continue independently. ``episode_id`` /
    ``group``: the new episode's (default: the recorded episode's).

    The env's own episode record holds the replayed turns (text, metrics, rewards recomputed); the
    caller copies the recorded token ids (the rollout runner does: nothing is re-tokenised)."""
    if not 0 <= turns <= len(episode.turns):
        raise ValueError(f"episode {episode.id} has {len(episode.turns)} turns; cannot restore after {turns}")
    task = episode.task
    adhoc = task.get("dataset") == "adhoc" or task.get("index") is None
    options = {"task": task} if adhoc else {"index": int(task["index"])}
    env.reset(seed=episode.seed, options={**options, "episode_id": episode.id if episode_id is None else episode_id,
                                          "group": episode.group if group is None else group})
    if env.unwrapped.episode.prompt != episode.prompt:
        raise ValueError(f"episode {episode.id}: this env renders another prompt for its task (built with "
                         "other options than the ones that recorded it?); it cannot be restored here")
    differ = []
    for turn in episode.turns[:turns]:
        obs, *_ = env.step(turn.action)
        if turn.observation is not None and turn.observation != obs:
            differ.append(turn.index)
    if seed is not None:
        env.unwrapped.np_random = np.random.default_rng(seed)
    return differ


def render_messages(messages: Sequence[dict[str, str]]) -> str:
    """The prompt as one readable string (the observation after ``reset``)."""
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


def render_episode(ep: Episode) -> str:
    lines = [render_messages(ep.prompt)]
    for t in ep.turns:
        forced = f"; reply started with the forced prefix {t.prefill!r}" if t.prefill else ""
        lines.append(f"--- turn {t.index} (agent{forced})\n{t.action}")
        if t.parse_error:
            lines.append(f"--- parse error: {t.parse_error}")
        if t.observation is not None:
            lines.append(f"--- turn {t.index} (env)\n{t.observation}")
    if ep.done:
        lines.append(f"--- final answer: {ep.final_answer!r}  outcome: {ep.outcome}")
    return "\n".join(lines)
