"""The episode record every turngym stage exchanges: plain dataclasses (no framework types), one JSON line each."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from turngym.episode.encoding import escape_surrogates, fields_of, json_copy, known_fields, record_fields
from turngym.episode.needs import DEFAULT_REWARD_NEEDS, MissingRewardNeeds, RewardNeeds
from turngym.truth import TruthValue

# the record's format: bumped, with a migration in turngym.episode.migrations.MIGRATIONS, whenever the record changes
SCHEMA_VERSION = 4
# the longest action any parser reads (answer extraction, tool calls); a longer one is refused unread, so no
# action costs more than a linear pass over this many characters
MAX_ACTION_CHARS = 200_000


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
        d = fields_of(self)
        del d["latency_ms"], d["truth"]
        return json_copy(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Turn:
        kwargs = known_fields(cls, d)
        truth = kwargs.get("truth") or {}
        if not isinstance(truth, dict):
            raise ValueError(f"a turn's truth must be a mapping of key to {{'value', 'source'}}, got {type(truth).__name__}")
        kwargs["truth"] = {str(k): TruthValue.from_any(v) for k, v in truth.items()}
        return cls(**kwargs)


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
        A file is read with :func:`turngym.episode.reader.read_episodes`, which also brings older records up."""
        version = d.get("schema_version", SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"episode schema_version {version} is newer than this turngym "
                f"understands ({SCHEMA_VERSION}); upgrade turngym"
            )
        kwargs = known_fields(cls, d)
        kwargs["turns"] = [Turn.from_dict(t) for t in d.get("turns", [])]
        needs = d.get("reward_needs")  # absent from older files: None, so a reward that needs it says so
        kwargs["reward_needs"] = None if needs is None else RewardNeeds.from_dict(needs)
        return cls(**kwargs)

    def to_json(self) -> str:
        """One JSON line, the text of ``json.dumps(to_dict())``; lone surrogates (text no UTF-8 can hold) become
        ``\\udXXX`` escapes. Written without ``to_dict``'s deep copy (a third of a busy client's CPU went to it):
        the encoder reads the records' fields in place."""
        d = fields_of(self)
        if self.reward_needs is not None:
            needs = fields_of(self.reward_needs)
            if not needs["predates"]:
                del needs["predates"]
            d["reward_needs"] = needs
        d["schema_version"] = SCHEMA_VERSION
        return escape_surrogates(json.dumps(d, ensure_ascii=False, allow_nan=True, default=record_fields))

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
