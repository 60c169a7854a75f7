"""Importing labelled trajectories: OpenAI-message transcripts with per-step human labels → turngym episodes.

Why: credit tables score rewards against a per-turn truth no reward saw. Human step labels
(AgentProcessBench: +1 / 0 / −1 on every assistant step) are such a truth, but they come as chat
transcripts, not episodes. This module turns each transcript into an :class:`~turngym.episode.Episode`
of the matching env (HotpotQA → SearchQA-v0 in its native tool format, BFCL → BFCL-v0), with each
assistant step one :class:`~turngym.episode.Turn` and its label in ``Turn.truth["human"]`` (source
``human``, the value as recorded), so ``turngym ablate --truth human --truth-map "+1:1,-1:0,0:skip"``
scores every reward against it. Episodes are text only (no token ids).

A record (one JSON object per line, or a JSON array of them) holds:

- ``messages``: OpenAI chat messages ``{"role", "content", "tool_calls"?}``; the system / user messages
  before the first assistant message are the prompt, each assistant message is a turn, and the
  messages after it up to the next assistant message (tool results, a next user turn) its observation.
- ``step_labels``: the labels, either a list with one entry per assistant message or a mapping
  ``{message index: label}`` (AgentProcessBench's form, keys counting every message from 0); each label
  is −1, 0, +1 or null (unlabelled).
- ``question`` and ``answers`` (gold answers; SearchQA grades the final answer against them).

All field names are options (:class:`Fields`; dotted paths reach into objects, e.g. ``ground_truth.target``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.episode import Episode, EpisodeWriter, RewardNeeds, Turn
from turngym.truth import TruthValue

LABEL_KEY = "human"
LABEL_VALUES = (-1, 0, 1)
ROLES = ("system", "user", "assistant", "tool")


class TrajectoryError(ValueError):
    """A record that cannot become an episode; the message names the record and the field."""


@dataclass(frozen=True)
class Fields:
    """Where a record keeps each part (dotted paths reach into objects)."""

    messages: str = "messages"
    labels: str = "step_labels"
    question: str = "question"
    answers: str = "answers"
    id: str | None = None  # None: the record's line number
    final_label: str | None = None  # a trajectory-level label kept in meta, never the outcome


@dataclass(frozen=True)
class Target:
    """The turngym env an imported trajectory becomes an episode of, and how that env grades it."""

    env_id: str
    reward_needs: RewardNeeds
    finish: Callable[[Episode, dict[str, Any]], None]  # sets final_answer, outcome, terminated / truncated
    step_metrics: Callable[[dict[str, Any], list[dict[str, Any]], int], tuple[dict[str, Any], str | None]]


@dataclass
class ImportSummary:
    written: int
    out: Path
    skipped: Counter = field(default_factory=Counter)  # data source -> records with no matching env
    labels: Counter = field(default_factory=Counter)  # label value -> turns


# ------------------------------------------------------------------ the envs


def _searchqa_metrics(msg: dict[str, Any], calls: list[dict[str, Any]], _user_turn: int) -> tuple[dict[str, Any], str | None]:
    """The metrics and parse error SearchQA-v0 records for such a step (a call, an answer, or neither)."""
    from turngym.envs.search_qa import last_answer

    if calls:  # the transcript holds the call's response: the search ran
        return {"action": "search", "search_ok": True}, None
    if last_answer(_text(msg.get("content"))) is not None:
        return {"action": "answer"}, None
    return {"action": "invalid"}, "no search call and no <answer> tag"


def _searchqa_finish(ep: Episode, record: dict[str, Any]) -> None:
    """Final answer as the env reads it (the last ``<answer>`` of a step with no call), graded by the env's grader."""
    from turngym.envs.search_qa import grade_answer, last_answer

    last = ep.turns[-1]
    answer = None if last.metrics.get("action") == "search" else last_answer(last.action)
    if answer is not None:
        last.tool_calls = [{"name": "answer", "arguments": {"answer": answer}}]
    ep.final_answer = answer
    ep.outcome = grade_answer(answer, ep.task.get("answers", []))
    ep.terminated, ep.truncated = answer is not None, answer is None


def _bfcl_metrics(_msg: dict[str, Any], calls: list[dict[str, Any]], user_turn: int) -> tuple[dict[str, Any], str | None]:
    return {"bfcl_user_turn": user_turn}, None


def _bfcl_finish(ep: Episode, record: dict[str, Any]) -> None:
    """BFCL is graded by replaying its backends, which a transcript cannot do: the outcome is the record's
    own verdict (``bfcl_valid``, or AgentProcessBench's ``stop_reason``), else ungraded."""
    from turngym.envs.bfcl.modes import answer_json

    by_turn: dict[int, list[str]] = {}
    for t in ep.turns:
        by_turn.setdefault(t.metrics["bfcl_user_turn"], []).extend(
            f"{c['name']}({', '.join(f'{k}={v!r}' for k, v in c['arguments'].items())})" for c in t.tool_calls)
    ep.final_answer = answer_json([by_turn[k] for k in sorted(by_turn)])
    verdict = record.get("bfcl_valid")
    if verdict is None and record.get("stop_reason") in ("bfcl_valid", "bfcl_invalid"):
        verdict = record["stop_reason"] == "bfcl_valid"
    ep.outcome = {"bfcl_valid": bool(verdict)} if isinstance(verdict, bool) else {"graded": False}
    ep.terminated = bool(record.get("terminated", True))
    ep.truncated = not ep.terminated


def target(env: str) -> Target:
    """The :class:`Target` for an env name (``SearchQA-v0`` or ``turngym/SearchQA-v0``; ``BFCL-v0``)."""
    name = env.removeprefix("turngym/")
    if name == "SearchQA-v0":
        from turngym.envs.search_qa import SearchQAEnv

        return Target("turngym/SearchQA-v0", SearchQAEnv.reward_needs, _searchqa_finish, _searchqa_metrics)
    if name == "BFCL-v0":
        from turngym.envs.bfcl.modes import TURN_CALL_ANSWERS  # a conversation, as BFCL's multi-turn entries

        return Target("turngym/BFCL-v0", TURN_CALL_ANSWERS, _bfcl_finish, _bfcl_metrics)
    raise TrajectoryError(f"--env {env!r}: trajectories can be imported into SearchQA-v0 or BFCL-v0")


# ------------------------------------------------------------------ one record


def _get(record: dict[str, Any], path: str) -> Any:
    cur: Any = record
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _text(content: Any) -> str:
    """A message's text (OpenAI content is a string, null, or a list of ``{"type": "text", "text"}`` parts)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _calls(msg: dict[str, Any], where: str) -> list[dict[str, Any]]:
    out = []
    for j, tc in enumerate(msg.get("tool_calls") or []):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise TrajectoryError(f"{where}.tool_calls[{j}]: needs function.name")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise TrajectoryError(f"{where}.tool_calls[{j}].function.arguments is not JSON ({exc.msg})") from None
        if not isinstance(args, dict):
            raise TrajectoryError(f"{where}.tool_calls[{j}].function.arguments must be an object")
        out.append({"name": fn["name"], "arguments": args})
    return out


def render_native(content: str, calls: list[dict[str, Any]]) -> str:
    """The step as a Hermes-format reply: its text, then one ``<tool_call>`` JSON block per call."""
    blocks = ["<tool_call>\n" + json.dumps(c, ensure_ascii=False) + "\n</tool_call>" for c in calls]
    return "\n".join(([content.strip()] if content.strip() else []) + blocks) if blocks else content


def _label(value: Any, where: str) -> int | None:
    """−1 / 0 / +1 as an int (1.0 reads as 1), None unlabelled; booleans and anything else are refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value not in LABEL_VALUES:
        raise TrajectoryError(f"{where} is {value!r}; a step label is -1, 0, 1 or null")
    return int(value)


def _labels(raw: Any, assistant_at: list[int], path: str) -> dict[int, int | None]:
    """Labels by message index, from a list (one per assistant step) or a ``{message index: label}`` mapping."""
    if isinstance(raw, list):
        if len(raw) != len(assistant_at):
            raise TrajectoryError(f"field {path!r} has {len(raw)} labels for {len(assistant_at)} assistant messages")
        return {i: _label(v, f"{path}[{k}]") for k, (i, v) in enumerate(zip(assistant_at, raw, strict=True))}
    if isinstance(raw, dict):
        out = {}
        for key, v in raw.items():
            try:
                i = int(key)
            except (TypeError, ValueError):
                raise TrajectoryError(f"field {path!r} key {key!r} is not a message index") from None
            if i not in assistant_at:
                raise TrajectoryError(f"field {path!r} labels message {i}, which is not an assistant message")
            out[i] = _label(v, f"{path}[{key!r}]")
        return out
    raise TrajectoryError(f"field {path!r} is missing or not a list / mapping of step labels")


def to_episode(record: dict[str, Any], tgt: Target, fields: Fields, source: str, file: str, line: int,
               dataset: str | None = None) -> Episode:
    """One record as an episode of ``tgt``'s env; :class:`TrajectoryError` names the field that is wrong."""
    rid = _get(record, fields.id) if fields.id else line
    name = f"trajectory {rid!r} ({file}:{line})"
    try:
        return _episode(record, tgt, fields, source, file, rid, dataset)
    except TrajectoryError as exc:
        raise TrajectoryError(f"{name}: {exc}") from None


def _episode(record: dict[str, Any], tgt: Target, fields: Fields, source: str, file: str, rid: Any,
             dataset: str | None) -> Episode:
    if rid is None:
        raise TrajectoryError(f"field {fields.id!r} (the trajectory id) is missing")
    msgs = _get(record, fields.messages)
    if not isinstance(msgs, list) or not msgs:
        raise TrajectoryError(f"field {fields.messages!r} is missing or not a non-empty list of messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise TrajectoryError(f"{fields.messages}[{i}] needs a role among {ROLES}")
    assistant_at = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if not assistant_at:
        raise TrajectoryError(f"field {fields.messages!r} has no assistant message")
    prompt = [{"role": m["role"], "content": _text(m.get("content"))} for m in msgs[:assistant_at[0]]]
    if any(m["role"] not in ("system", "user") for m in prompt):
        raise TrajectoryError(f"{fields.messages}: only system / user messages may come before the first assistant one")
    question = _get(record, fields.question)
    if not isinstance(question, str) or not question.strip():
        raise TrajectoryError(f"field {fields.question!r} (the question) is missing or empty")
    golds = _get(record, fields.answers)
    golds = [golds] if isinstance(golds, str) and tgt.env_id.endswith("SearchQA-v0") else golds
    if tgt.env_id.endswith("SearchQA-v0") and (not isinstance(golds, list) or not golds):
        raise TrajectoryError(f"field {fields.answers!r} (the gold answers) is missing or empty")
    labels = _labels(_get(record, fields.labels), assistant_at, fields.labels)

    # a turngym turn is one assistant message and everything after it up to the next one (tool results, user
    # replies): that is what the env would have answered, so it becomes the turn's observation
    turns, user_turn = [], 0
    for k, i in enumerate(assistant_at):
        where = f"{fields.messages}[{i}]"
        calls = _calls(msgs[i], where)
        metrics, parse_error = tgt.step_metrics(msgs[i], calls, user_turn)
        after = msgs[i + 1: assistant_at[k + 1] if k + 1 < len(assistant_at) else len(msgs)]
        user_turn += sum(m["role"] == "user" for m in after)
        if any(m["role"] == "system" for m in after):
            raise TrajectoryError(f"{where}: a system message follows an assistant step")
        turn = Turn(index=k, action=render_native(_text(msgs[i].get("content")), calls), tool_calls=calls,
                    parse_error=parse_error, metrics=metrics,
                    observation="\n".join(_text(m.get("content")) for m in after) if after else None,
                    observation_role=after[0]["role"] if after else None)
        if labels.get(i) is not None:  # human step labels go to the truth namespace, which no reward sees
            turn.truth[LABEL_KEY] = TruthValue(labels[i], "human")
        turns.append(turn)
    task: dict[str, Any] = {"id": str(rid), "question": question}
    if tgt.env_id.endswith("SearchQA-v0"):
        task["answers"] = [str(a) for a in golds]
    elif golds is not None:  # BFCL: the expected calls per user turn, as recorded
        task["ground_truth"] = golds
    if dataset:
        task["dataset"] = dataset
    imported: dict[str, Any] = {"source": source, "file": file, "record": rid}
    if fields.final_label and _get(record, fields.final_label) is not None:
        imported["final_label"] = _get(record, fields.final_label)
    tools = record.get("tools") if isinstance(record.get("tools"), list) else None
    # group by question: trajectories of one question are the K rollouts a group-relative reward compares
    ep = Episode(id=f"{source}:{rid}", env_id=tgt.env_id, task=task, prompt=prompt, turns=turns, group=question,
                 meta={"imported": imported}, tools=tools, reward_needs=tgt.reward_needs)
    tgt.finish(ep, record)
    return ep


# ------------------------------------------------------------------ files


def read_records(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) from a JSONL file, or (position + 1, record) from a JSON array."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trajectories file not found: {p}")
    text = p.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TrajectoryError(f"{p}: not a JSON array ({exc})") from None
        numbered = list(enumerate(rows, start=1))
    else:
        numbered = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                numbered.append((n, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise TrajectoryError(f"{p}:{n}: not a JSON object ({exc.msg})") from None
    for n, row in numbered:
        if not isinstance(row, dict):
            raise TrajectoryError(f"{p}:{n}: a trajectory is a JSON object, got {type(row).__name__}")
        yield n, row


def write_all(episodes: list[Episode], out: str | os.PathLike, overwrite: bool = False) -> Path:
    """All episodes or none: written to a temporary file beside ``out`` and renamed over it. An existing
    ``out`` is refused unless ``overwrite`` (a rerun replaces the file; it never appends duplicates)."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
    seen: dict[str, int] = {}
    for ep in episodes:
        if ep.id in seen:
            raise TrajectoryError(f"two trajectories have the id {ep.id!r}; ids must be unique")
        seen[ep.id] = 1
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        with EpisodeWriter(tmp, fsync=False) as w:
            w.write_all(episodes)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _summary(episodes: list[Episode], out: Path, skipped: Counter) -> ImportSummary:
    labels = Counter(t.truth[LABEL_KEY].value for ep in episodes for t in ep.turns if LABEL_KEY in t.truth)
    return ImportSummary(len(episodes), out, skipped, labels)


def import_messages(path: str | os.PathLike, out: str | os.PathLike, env: str, fields: Fields = Fields(),
                    source: str = "messages", dataset: str | None = None, overwrite: bool = False) -> ImportSummary:
    """Every record of ``path`` as an episode of ``env``, written to ``out`` (all or nothing)."""
    tgt = target(env)
    eps = [to_episode(r, tgt, fields, source, str(path), n, dataset) for n, r in read_records(path)]
    if not eps:
        raise TrajectoryError(f"{path} holds no trajectories")
    return _summary(eps, write_all(eps, out, overwrite), Counter())


# AgentProcessBench (RUCBM/AgentProcessBench, data/AgentProcessBench/<dataset>.jsonl): one trajectory per line
APB_FIELDS = Fields(messages="messages", labels="step_labels", question="question", answers="ground_truth.target",
                    id="total_index", final_label="final_label")


def apb_target(data_source: str) -> tuple[str, str] | None:
    """(env, dataset) for an AgentProcessBench ``data_source``; None where turngym has no such env (GAIA, tau2)."""
    ds = data_source.lower()
    if "hotpotqa" in ds:
        return "SearchQA-v0", "hotpotqa"
    if ds.startswith("bfcl"):
        return "BFCL-v0", ds.removeprefix("bfcl_") or "multi_turn_base"
    return None


def import_agentprocessbench(path: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False) -> ImportSummary:
    """AgentProcessBench trajectories of HotpotQA (→ SearchQA-v0) and BFCL (→ BFCL-v0); others are counted as skipped."""
    eps, skipped = [], Counter()
    for n, r in read_records(path):
        ds = r.get("data_source")
        if not isinstance(ds, str):
            raise TrajectoryError(f"trajectory {r.get('total_index', n)!r} ({path}:{n}): field 'data_source' is missing")
        found = apb_target(ds)
        if found is None:
            skipped[ds] += 1
            continue
        env, dataset = found
        fields = APB_FIELDS if env == "SearchQA-v0" else dataclasses.replace(APB_FIELDS, answers="ground_truth")
        eps.append(to_episode(r, target(env), fields, "agentprocessbench", str(path), n, dataset))
    if not eps:
        raise TrajectoryError(f"{path} holds no HotpotQA or BFCL trajectories (skipped: {dict(skipped) or 'none'})")
    return _summary(eps, write_all(eps, out, overwrite), skipped)
