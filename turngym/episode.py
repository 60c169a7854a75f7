"""Turn-structured episodes: the one record every turngym stage exchanges.

Plain dataclasses (no framework types) plus a JSONL store whose writes are whole
lines: a process killed mid-write leaves at most a torn *tail*, which the next
writer moves aside (never deletes) before appending.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.truth import TruthError, TruthMap, TruthValue, binary_label

# the record's format: bumped, with a migration in turngym.envs.reader.MIGRATIONS, whenever the record changes
SCHEMA_VERSION = 4
# the longest action any parser reads (answer extraction, tool calls); a longer one is refused unread, so no
# action costs more than a linear pass over this many characters
MAX_ACTION_CHARS = 200_000

# A surrogate code point that is not the first or second half of an adjacent high+low pair.
_LONE_SURROGATE = re.compile("[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")


@dataclass
class Turn:
    """One agent action and what the environment answered."""

    index: int
    action: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    parse_error: str | None = None
    observation: str | None = None
    observation_role: str | None = None  # None: the env's default role
    reward: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)
    action_ids: list[int] | None = None
    action_logprobs: list[float] | None = None
    observation_ids: list[int] | None = None
    # a forced start of the reply (the env's ``reply_prefill``, e.g. an opened tool call): ``action`` begins
    # with it; its ids were part of the prompt the model continued, so they sit before ``action_ids``, untrained
    prefill: str | None = None
    prefill_ids: list[int] | None = None
    # what the turn was worth (key -> TruthValue), for credit tables only: rewards never see it
    # (turngym.truth.reward_view empties it); absent from files written before it existed
    truth: dict[str, TruthValue] = field(default_factory=dict)
    # the env's answer to the last turn of an episode cut by the turn limit: the call ran, its output is
    # recorded here and never shown to the policy (``observation`` is None); absent from older files
    unshown_observation: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def info_dict(self) -> dict[str, Any]:
        """The turn as exposed in ``info["turn"]``: no timing, so info stays deterministic, and no truth
        (labels derived from gold answers stay out of what a policy may see, like the env's gold keys)."""
        # the fields copied one level down (the containers a caller might mutate), not dataclasses.asdict's
        # recursive walk, which was 5% of a busy client's CPU; every value in a turn is plain JSON data
        d = _fields_of(self)
        del d["latency_ms"], d["truth"]
        return json_copy(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Turn:
        kwargs = _known_fields(cls, d)
        truth = kwargs.get("truth") or {}
        if not isinstance(truth, dict):
            raise ValueError(f"a turn's truth must be a mapping of key to {{'value', 'source'}}, got {type(truth).__name__}")
        kwargs["truth"] = {str(k): TruthValue.from_any(v) for k, v in truth.items()}
        return cls(**kwargs)


ANSWER_KINDS = ("math", "qa_text", "calls", "none")
ANSWER_CUES = ("answer_tag", "boxed")


@dataclass(frozen=True)
class RewardNeeds:
    """What rewards need to know about an env's episodes, declared by the env that played them,
    so that no reward guesses it from the env id.

    - ``answer_kind``: how two final answers are compared: ``math`` (math-verify), ``qa_text``
      (SQuAD-normalised text), ``calls`` (function calls as canonical JSON), ``none`` (the env
      has no final answer).
    - ``answer_cue``: how the env asks for the final answer, the cue SIOP / IGPO's pseudo-answer
      uses under ``pseudo_answer="auto"``: ``answer_tag`` (``<answer>y</answer>``, the official
      pseudo-answer) or ``boxed`` (``\\boxed{y}``).
    - ``tool_ok_metrics``: the per-turn metrics that say a turn's tool calls ran (True) or failed
      (False); the env records one on every turn whose calls it ran (None or absent: no verdict,
      e.g. SearchQA's answer call). ``toolcall_dense`` reads them (:meth:`tool_succeeded`); an env
      whose turns make tool calls must declare at least one.
    - which observations are tool results (evidence): the observation of a turn that made tool
      calls and parsed, unless one of ``tool_ok_metrics`` is False or one of
      ``tool_error_metrics`` holds an error in the turn's metrics (then it is an error message).
    - a checker's verdict, at most one of: ``checker_metric``, the per-turn metric holding the
      verdict on the turns the env checked (True / False; absent or None: not checked), or
      ``checker_outcome``, the outcome field holding one verdict on the whole episode, which counts
      on its last turn. ``toolcall_dense`` reads it (:meth:`checker_verdict`).
    - ``user_turn_metric``: the per-turn metric an env records on every step of a conversation
      with several user turns; there a step that makes no call attempt is a reply to the user, so
      it is well-formed though it parsed no call (:meth:`is_reply`).

    ``predates`` lists the fields above that the file this declaration was read from did not have
    (written by an older turngym); a reward that reads one of them refuses the episode
    (:meth:`Episode.needs`) rather than read "none declared" into it.
    """

    answer_kind: str
    answer_cue: str
    tool_ok_metrics: tuple[str, ...] = ()
    tool_error_metrics: tuple[str, ...] = ()
    checker_metric: str | None = None
    checker_outcome: str | None = None
    user_turn_metric: str | None = None
    predates: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.answer_kind not in ANSWER_KINDS:
            raise ValueError(f"answer_kind must be one of {ANSWER_KINDS}, got {self.answer_kind!r}")
        if self.answer_cue not in ANSWER_CUES:
            raise ValueError(f"answer_cue must be one of {ANSWER_CUES}, got {self.answer_cue!r}")
        for name in ("tool_ok_metrics", "tool_error_metrics"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(m, str) and m for m in value):
                raise ValueError(f"{name} must be a sequence of metric names, got {value!r}")
            object.__setattr__(self, name, tuple(value))  # lists read back from JSON
        for name in ("checker_metric", "checker_outcome", "user_turn_metric"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"{name} must be a metric name or None, got {value!r}")
        if self.checker_metric is not None and self.checker_outcome is not None:
            raise ValueError("declare checker_metric (a verdict per checked turn) or checker_outcome (one verdict "
                             "on the episode, counted on its last turn), not both")
        unknown = sorted(set(self.predates) - set(LATER_NEEDS))
        if unknown:
            raise ValueError(f"predates names fields of the declaration: {LATER_NEEDS}, got {unknown}")
        object.__setattr__(self, "predates", tuple(self.predates))

    def tool_succeeded(self, metrics: dict[str, Any]) -> bool | None:
        """The declared verdict on a turn's tool calls: True when every declared ``tool_ok_metrics`` the
        turn records is true, False when one is false, None when it records none of them."""
        verdicts = [bool(metrics[m]) for m in self.tool_ok_metrics if metrics.get(m) is not None]
        return all(verdicts) if verdicts else None

    def tool_failed(self, metrics: dict[str, Any]) -> bool:
        """The turn's metrics say its tool call failed (its observation is an error, not a result)."""
        return self.tool_succeeded(metrics) is False or any(bool(metrics.get(m)) for m in self.tool_error_metrics)

    def checker_verdict(self, turn_metrics: dict[str, Any], outcome: dict[str, Any], last: bool) -> bool | None:
        """The declared checker's verdict on a turn (``last``: the episode's last turn); None: no verdict on it."""
        if self.checker_metric is not None:
            verdict = turn_metrics.get(self.checker_metric)
            return None if verdict is None else bool(verdict)
        if self.checker_outcome is not None and last and self.checker_outcome in outcome:
            return bool(outcome[self.checker_outcome])
        return None

    def is_reply(self, turn_metrics: dict[str, Any]) -> bool:
        """The turn is a step of a conversation with several user turns (where plain text replies to the user)."""
        return self.user_turn_metric is not None and self.user_turn_metric in turn_metrics

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RewardNeeds:
        if not isinstance(d, dict):
            raise ValueError(f"reward_needs must be a mapping, got {type(d).__name__}")
        kwargs = _known_fields(cls, d)
        kwargs["predates"] = tuple(sorted(set(kwargs.get("predates", ())) | {f for f in LATER_NEEDS if f not in d}))
        return cls(**kwargs)


# the declaration's fields added after episodes first carried it: a file without them predates them
LATER_NEEDS = ("checker_metric", "checker_outcome", "user_turn_metric")


# What an episode built in code (not played by an env) declares unless given its own: text answers
# in answer tags, tool failures marked by any of the failure metrics turngym's envs record.
DEFAULT_REWARD_NEEDS = RewardNeeds(answer_kind="qa_text", answer_cue="answer_tag",
                                   tool_ok_metrics=("tool_ok", "exec_ok", "search_ok"),
                                   tool_error_metrics=("retrieval_error",))


class MissingRewardNeeds(ValueError):
    """An episode read from a file written before episodes carried ``reward_needs``, scored by a
    reward that needs the declaration."""


# what a rollout runner may record in ``Episode.meta`` (:meth:`Episode.add_run_record`): the policy's name,
# the rollout number in its group, turngym's version, the task's key, the tokenizer's fingerprint, the wall
# time, for a branched episode what it branched from, and the run it belongs to (``run``: its id and the digest
# of its settings, turngym.run.identity)
RUN_META_KEYS = ("model", "k", "turngym", "task_key", "tokenizer", "wall_ms", "branch", "ray", "run")


@dataclass
class Episode:
    """The K rollouts of one query share ``group``; ``task`` says which item was played."""

    id: str
    env_id: str
    task: dict[str, Any] = field(default_factory=dict)
    prompt: list[dict[str, str]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    final_answer: str | None = None
    outcome: dict[str, Any] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    seed: int | None = None
    group: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    prompt_ids: list[int] | None = None
    tools: list[dict[str, Any]] | None = None  # tool schemas given to the chat template, if any
    # declared by the env; None only in files written before episodes carried it
    reward_needs: RewardNeeds | None = DEFAULT_REWARD_NEEDS

    @property
    def group_key(self) -> str:
        """The group this episode is scored in: ``group``, or its own id when it has none (a group of one)."""
        return self.group or self.id

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def ungraded(self) -> bool:
        """No verdict: the grader itself failed, not because of the answer (a refused or timed-out answer is
        wrong). Left out of metrics (counted) and of its group's advantages (advantage 0)."""
        return self.outcome.get("graded") is False

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["reward_needs"] is not None and not d["reward_needs"]["predates"]:
            del d["reward_needs"]["predates"]  # written only for a declaration read from an older file
        d["schema_version"] = SCHEMA_VERSION
        return d

    def add_run_record(self, turn: int | None = None, *, prompt_ids: Sequence[int] | None = None,
                       meta: dict[str, Any] | None = None, action_ids: Sequence[int] | None = None,
                       action_logprobs: Sequence[float] | None = None, observation_ids: Sequence[int] | None = None,
                       prefill_ids: Sequence[int] | None = None, generate_ms: float | None = None,
                       finish_reason: str | None = None) -> None:
        """The one way a rollout runner writes on an episode the env recorded.

        The env alone writes the text: prompt, actions, observations, tool calls, metrics, truth, outcome,
        and the reply prefill it chose (``Turn.prefill``). The runner adds what only it knows: token ids,
        log-probabilities, generation time and finish reason of ``turn`` (an index), and, with ``turn``
        None, the prompt's ids and the run's identity in ``meta`` (keys in ``RUN_META_KEYS``).
        """
        if turn is None:
            if any(x is not None for x in (action_ids, action_logprobs, observation_ids, prefill_ids, generate_ms,
                                           finish_reason)):
                raise ValueError("a turn's ids, log-probs and timings need the turn's index")
            unknown = sorted(set(meta or {}) - set(RUN_META_KEYS))
            if unknown:
                raise ValueError(f"a runner records no episode meta {unknown}; its keys are {RUN_META_KEYS}")
            if prompt_ids is not None:
                self.prompt_ids = list(prompt_ids)
            self.meta.update(meta or {})
            return
        if prompt_ids is not None or meta is not None:
            raise ValueError("prompt ids and run meta belong to the episode, not to a turn: pass turn=None")
        t = self.turns[turn]
        if prefill_ids is not None and t.prefill is None:
            raise ValueError(f"episode {self.id} turn {turn}: prefill ids for a turn the env recorded no prefill on")
        if action_ids is not None:
            t.action_ids = list(action_ids)
            t.action_logprobs = None if action_logprobs is None else list(action_logprobs)
        if observation_ids is not None:
            t.observation_ids = list(observation_ids)
        if prefill_ids is not None:
            t.prefill_ids = list(prefill_ids)
        if generate_ms is not None:
            t.latency_ms["generate"] = round(float(generate_ms), 3)
        if finish_reason is not None:
            t.metrics.setdefault("finish_reason", finish_reason)

    def needs(self, purpose: str, reads: Sequence[str] = ()) -> RewardNeeds:
        """The env's declaration, or a clear error saying what needs it (``purpose``) and what to do;
        ``reads``: the declaration's fields the caller reads, refused when the episode's file predates them."""
        if self.reward_needs is None:
            raise MissingRewardNeeds(
                f"episode {self.id} ({self.env_id}) does not declare what rewards need: it was written by a turngym "
                f"from before episodes carried 'reward_needs'. {purpose}")
        older = [f for f in reads if f in self.reward_needs.predates]
        if older:
            raise MissingRewardNeeds(
                f"episode {self.id} ({self.env_id}) was written by a turngym from before envs declared "
                f"{', '.join(older)} (RewardNeeds): play it again. {purpose}")
        return self.reward_needs

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Episode:
        """The record as it is, of any version (a field it lacks takes its default; ``reward_needs``: None).
        A file is read with :func:`turngym.envs.reader.read_episodes`, which also brings older records up."""
        version = d.get("schema_version", SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"episode schema_version {version} is newer than this turngym "
                f"understands ({SCHEMA_VERSION}); upgrade turngym"
            )
        kwargs = _known_fields(cls, d)
        kwargs["turns"] = [Turn.from_dict(t) for t in d.get("turns", [])]
        needs = d.get("reward_needs")  # absent from older files: None, so a reward that needs it says so
        kwargs["reward_needs"] = None if needs is None else RewardNeeds.from_dict(needs)
        return cls(**kwargs)

    def to_json(self) -> str:
        """One JSON line, the text of ``json.dumps(to_dict())``; lone surrogates (text no UTF-8 can hold) become
        ``\\udXXX`` escapes. Written without ``to_dict``'s deep copy (a third of a busy client's CPU went to it):
        the encoder reads the records' fields in place."""
        d = _fields_of(self)
        if self.reward_needs is not None:
            needs = _fields_of(self.reward_needs)
            if not needs["predates"]:
                del needs["predates"]
            d["reward_needs"] = needs
        d["schema_version"] = SCHEMA_VERSION
        return escape_surrogates(json.dumps(d, ensure_ascii=False, allow_nan=True, default=_record_fields))

    @classmethod
    def from_json(cls, line: str) -> Episode:
        return cls.from_dict(json.loads(line))

    def token_layout(self) -> TokenLayout:
        """The episode's tokens laid out for training and scoring (see :class:`TokenLayout`): per turn
        its prefill ids (untrained), action ids (trained), observation ids (untrained).

        The one walk over prompt, action and observation ids that the rollout runner, the
        trainer and the support scorer share; an episode without token ids is refused.
        """
        if self.prompt_ids is None:
            raise ValueError(f"episode {self.id} has no token ids (generated by a text-only backend?)")
        ids, trained, turn_of = list(self.prompt_ids), [0] * len(self.prompt_ids), [-1] * len(self.prompt_ids)
        logprobs = [0.0] * len(ids)
        action_ends, turn_ends = [], []
        for t in self.turns:
            if t.action_ids is None:
                raise ValueError(f"episode {self.id} turn {t.index} has no action_ids")
            prefill, action, observation = list(t.prefill_ids or []), list(t.action_ids), list(t.observation_ids or [])
            if t.action_logprobs is not None and len(t.action_logprobs) != len(action):
                raise ValueError(f"episode {self.id} turn {t.index}: {len(t.action_logprobs)} logprobs for "
                                 f"{len(action)} action ids")
            ids += prefill + action + observation
            trained += [0] * len(prefill) + [1] * len(action) + [0] * len(observation)
            turn_of += [t.index] * (len(prefill) + len(action) + len(observation))
            logprobs += [0.0] * len(prefill)
            logprobs += [float(x) for x in t.action_logprobs] if t.action_logprobs is not None else [0.0] * len(action)
            logprobs += [0.0] * len(observation)
            action_ends.append(len(ids) - len(observation))
            turn_ends.append(len(ids))
        return TokenLayout(ids, trained, turn_of, logprobs, len(self.prompt_ids), action_ends, turn_ends)


@dataclass(frozen=True)
class EpisodeGroup(Sequence):
    """The K rollouts of one query, in order, with the task they played.

    ``key`` is the episodes' ``Episode.group`` (an episode without one is a group of its own,
    keyed by its id). Built by :func:`group_episodes` from saved or fresh episodes, or by
    :meth:`of` from episodes already known to form one group (a trainer's slice, a reward's
    input); either way the episodes must be rollouts of one query (one question).
    """

    key: str
    task: dict[str, Any]
    episodes: tuple[Episode, ...]

    def __post_init__(self) -> None:
        if not self.episodes:
            raise ValueError("a group needs at least one episode")
        questions = {str(e.task.get("question")) for e in self.episodes}
        if len(questions) > 1:
            raise ValueError(f"a group must hold rollouts of one query; got {len(questions)} different questions")

    @classmethod
    def of(cls, episodes: Sequence[Episode]) -> EpisodeGroup:
        """``episodes`` as one group (a group is returned as it is)."""
        if isinstance(episodes, EpisodeGroup):
            return episodes
        first = episodes[0] if episodes else None
        return cls(first.group_key if first else "", first.task if first else {}, tuple(episodes))

    @property
    def question(self) -> str:
        return str(self.task.get("question", ""))

    @property
    def env_id(self) -> str:
        return self.episodes[0].env_id

    def __getitem__(self, i):  # type: ignore[override]
        return list(self.episodes[i]) if isinstance(i, slice) else self.episodes[i]

    def __len__(self) -> int:
        return len(self.episodes)



def group_episodes(episodes: Iterable[Episode]) -> list[EpisodeGroup]:
    """Episodes grouped by ``Episode.group`` (alone when it has none), groups in first-seen order."""
    by_key: dict[str, list[Episode]] = {}
    for ep in episodes:
        by_key.setdefault(ep.group_key, []).append(ep)
    return [EpisodeGroup(key, eps[0].task, tuple(eps)) for key, eps in by_key.items()]


@dataclass(frozen=True)
class TokenLayout:
    """Where each token of an episode sits, in the order the model saw them: the prompt's ids,
    then each turn's action ids and observation ids.

    ``trained`` is the loss mask (1 exactly on generated action tokens; a turn's ``prefill_ids``, the
    forced start of its reply, come just before its action ids and are 0: the model did not choose
    them). ``turn_of`` is the turn index of each token (-1 on the prompt; a turn's prefill and
    observation tokens belong to that turn).
    ``logprobs`` holds each action token's recorded sampling log-probability (0.0 where none
    was recorded, and on prompt and observation tokens). Boundary points are positions in
    ``ids``: ``prompt_end`` ends the prompt; ``action_ends[t]`` follows turn t's action (before
    its observation); ``turn_ends[t]`` follows its observation (the same point if it has none).
    ``ids[:point]`` is the prefix the model had seen at that point.
    """

    ids: list[int]
    trained: list[int]
    turn_of: list[int]
    logprobs: list[float]
    prompt_end: int
    action_ends: list[int]
    turn_ends: list[int]


def group_needs(episodes: Sequence[Episode], purpose: str) -> RewardNeeds:
    """The declaration the episodes of one group share (they come from one env configuration)."""
    if not episodes:
        raise ValueError("a group needs at least one episode")
    needs = episodes[0].needs(purpose)
    for ep in episodes[1:]:
        if ep.needs(purpose) != needs:
            raise ValueError(f"episodes {episodes[0].id} and {ep.id} of one group declare different reward needs "
                             f"({needs} vs {ep.reward_needs}); a group must come from one env configuration")
    return needs


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _fields_of(obj: Any) -> dict[str, Any]:
    """A dataclass instance's fields, in order, not copied."""
    names = _FIELD_NAMES.get(type(obj))
    if names is None:
        names = _FIELD_NAMES[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
    return {name: getattr(obj, name) for name in names}


_PLAIN = frozenset({str, int, float, bool, type(None)})


def plain_json(value: Any) -> bool:
    """Whether ``value`` is JSON that :func:`json.dumps` writes without fail, by its types alone: str, bool,
    None, float, an int within the interpreter's digit limit for int-to-text (fewer than 3 bits a digit), and
    lists, tuples and str-keyed dicts of these. False means only "not shown here" (a subclass, another key
    type): dump it to know."""
    kind = type(value)
    if kind is str or kind is bool or kind is float or value is None:
        return True
    if kind is int:
        limit = sys.get_int_max_str_digits()  # 0: no limit
        return limit == 0 or value.bit_length() < 3 * limit
    if kind is dict:
        return all(type(k) is str and plain_json(v) for k, v in value.items())
    if kind is list or kind is tuple:
        return all(plain_json(v) for v in value)
    return False


def json_copy(value: Any) -> Any:
    """``value`` as :func:`dataclasses.asdict` would give it (records as dicts, containers copied, so the copy
    shares no container with ``value``), in one pass over JSON-shaped data; anything else is deep-copied."""
    if type(value) in _PLAIN:
        return value
    if type(value) is dict:
        return {k: v if type(v) in _PLAIN else json_copy(v) for k, v in value.items()}
    if type(value) is list or type(value) is tuple:
        items = [v if type(v) in _PLAIN else json_copy(v) for v in value]  # token ids: no call per id
        return items if type(value) is list else tuple(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_copy(_fields_of(value))
    return copy.deepcopy(value)


def _record_fields(obj: Any) -> dict[str, Any]:
    """``json.dumps``' fallback for the records inside an episode (turns, truth values): their fields."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _fields_of(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def escape_surrogates(text: str) -> str:
    """JSON text with every lone surrogate written as a ``\\udXXX`` escape, which JSON readers turn
    back into the same code point; the line stays valid UTF-8.

    A high surrogate followed by a low one cannot be escaped that way (JSON readers join the two
    escapes into one character), so such a pair stays raw and is written with ``surrogatepass``
    (:func:`encode_line`) and read back with it (:func:`decode_line`): every string reads back
    identically.
    """
    if utf8_encodable(text):  # the common case, checked in C (the regex scan was 5% of a busy client)
        return text
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def utf8_encodable(text: str) -> bool:
    """Whether ``text`` holds no surrogate code point (only those stop UTF-8 encoding); ASCII text at once."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def encode_line(text: str) -> bytes:
    return (text + "\n").encode("utf-8", "surrogatepass")


def decode_line(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogatepass")


def _known_fields(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in d
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
    ]
    if missing:
        raise ValueError(f"{cls.__name__} record lacks required field(s) {missing}")
    return {k: v for k, v in d.items() if k in names}


# --------------------------------------------------------------------------- JSONL


class EpisodeFileError(ValueError):
    """A line of an episodes file that is not a valid episode; names the line."""

    def __init__(self, path: Path, line_no: int, reason: str):
        super().__init__(f"{path}:{line_no}: {reason}")
        self.path, self.line_no, self.reason = path, line_no, reason


def read_records(path: str | os.PathLike,
                 strict: bool = False) -> tuple[list[tuple[int, dict[str, Any]]], list[EpisodeFileError]]:
    """(line number, JSON object) of every whole line of an episodes file, and the lines that are not one.

    The file layer only: the records are not yet episodes. Read episodes with
    :func:`turngym.envs.reader.read_episodes`, which turns each record of any schema version into today's
    :class:`Episode`. With ``strict=True`` the first bad line raises instead.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"episodes file not found: {path}")
    if not path.is_file():  # a FIFO, a device or a link to one could be read without end
        raise ValueError(f"{path} is not a regular file; episodes are read from regular files only")
    records: list[tuple[int, dict[str, Any]]] = []
    errors: list[EpisodeFileError] = []
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                if not raw.endswith(b"\n"):
                    raise ValueError("torn last line (no newline): the writer was interrupted")
                record = json.loads(decode_line(raw))
                if not isinstance(record, dict):
                    raise ValueError(f"an episode record is a JSON object, got {type(record).__name__}")
                records.append((line_no, record))
            except (ValueError, UnicodeDecodeError) as exc:
                err = EpisodeFileError(path, line_no, str(exc))
                if strict:
                    raise err from exc
                errors.append(err)
    return records, errors


class EpisodeWriter:
    """Append-only JSONL writer.

    Each episode is one ``os.write`` of a complete line to an ``O_APPEND`` descriptor,
    followed by fsync, so readers never see half an episode from a finished write. If a
    previous process died mid-write, the torn tail is moved to ``<file>.torn`` (kept for
    inspection) before anything new is appended.
    """

    def __init__(self, path: str | os.PathLike, fsync: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.recovered_tail = self._repair_torn_tail()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _repair_torn_tail(self) -> bytes:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return b""
        with self.path.open("rb+") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            pos, chunk, tail = size, 4096, b""
            while pos > 0:
                step = min(chunk, pos)
                pos -= step
                fh.seek(pos)
                tail = fh.read(step) + tail
                nl = tail.rfind(b"\n")
                if nl >= 0:
                    keep = pos + nl + 1
                    break
            else:
                keep = 0
            if keep == size:
                return b""
            fh.seek(keep)
            torn = fh.read()
            with open(str(self.path) + ".torn", "ab") as side:
                side.write(torn + b"\n")
            fh.truncate(keep)
            return torn

    def write(self, episode: Episode) -> None:
        data = encode_line(episode.to_json())
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        if self.fsync:
            os.fsync(self._fd)

    def write_all(self, episodes: Iterable[Episode]) -> None:
        """Each episode as one write of its whole line (as :meth:`write`), then one fsync for all of them."""
        fsync, self.fsync = self.fsync, False
        try:
            for ep in episodes:
                self.write(ep)
        finally:
            self.fsync = fsync
        if fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



def played_content(ep: Episode) -> dict[str, Any]:
    """What an episode says, without when and where it was played (wall and turn timings, the Ray worker that
    played it): the record two backends of the same run must agree on."""
    d = ep.to_dict()
    d["meta"] = {k: v for k, v in d["meta"].items() if k not in ("wall_ms", "ray")}
    for t in d["turns"]:
        t["latency_ms"] = {}
    return d


def reward_view(episodes: Sequence[Episode]) -> Any:
    """The episodes as a reward may see them: shallow copies whose turns carry no truth.

    Every place that hands episodes to ``score_group`` (ablate, creditbench, the trainer) goes
    through here, so a reward cannot read the truth it is scored against. An
    :class:`~turngym.episode.EpisodeGroup` stays one (same key and task).
    """
    copies = tuple(dataclasses.replace(ep, turns=[dataclasses.replace(t, truth={}) for t in ep.turns])
                   for ep in episodes)
    if isinstance(episodes, EpisodeGroup):
        return EpisodeGroup(episodes.key, episodes.task, copies)
    return list(copies)


def turn_labels(ep: Episode, key: str | None = None, mapping: TruthMap | None = None) -> list[int | None]:
    """Each turn's label (1 useful, 0 not, None unlabelled) from the truth namespace only.

    ``key`` None: the one key the episode's turns carry (none: all unlabelled; several: refused, name one).
    Values pass through ``mapping`` when given, else must be binary (True / False / 1 / 0): never cast
    with ``bool()``, so a −1 label is not "useful".
    """
    if key is None:
        keys = sorted({k for t in ep.turns for k in t.truth})
        if len(keys) > 1:
            raise TruthError(f"episode {ep.id} carries several truth keys {keys}; name the one to score with --truth")
        if not keys:
            return [None] * len(ep.turns)
        key = keys[0]
    out: list[int | None] = []
    for t in ep.turns:
        tv = t.truth.get(key)
        if tv is None or tv.value is None or (isinstance(tv.value, float) and math.isnan(tv.value)):
            out.append(None)
            continue
        if mapping is not None:
            found, lab = mapping.label(tv.value)
            if not found:
                raise TruthError(f"truth {key!r} = {tv.value!r} on turn {t.index} of episode {ep.id} is not in "
                                 f"--truth-map; add it (VALUE:1, VALUE:0 or VALUE:skip)")
            out.append(lab)
            continue
        try:
            out.append(binary_label(tv.value))
        except ValueError:
            raise TruthError(f"truth {key!r} = {tv.value!r} ({tv.source}) on turn {t.index} of episode {ep.id} is not "
                             "binary (True/False/1/0); give --truth-map, e.g. '+1:1,-1:0,0:skip'") from None
    return out
