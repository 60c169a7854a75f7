"""Strict-JSON LLM calls for SCRIBE's decomposer, distiller, router and judge.

:class:`JSONLLM` runs on any turngym :class:`~turngym.agents.policy.Policy`: a local
transformers model (``HFPolicy``; one batched ``generate`` per chunk) or any
OpenAI-compatible server (``OpenAICompatPolicy``). Every reply is checked against a
small JSON schema. Malformed replies are repaired when the intent is unambiguous (code
fences, prose around the object, trailing commas, Python literals, integers written as
strings, a reply cut off by the token limit: its complete values kept and the object
closed); otherwise the model is asked once more with the validation error. A reply
that still fails is returned as ``None`` and counted: callers report it, nothing is
invented. Identical calls are answered from a cache (optionally a JSONL file that
survives restarts; with greedy decoding a failed call is remembered as failed too);
``max_concurrency`` bounds how many prompts are in flight. ``progress`` (optional) hears each
:meth:`JSONLLM.call_many`'s count of prompts to generate: ``(0, total)`` when it starts, then
``(done, total)`` after every chunk, so a command can show replies arriving (a local model takes
minutes per chunk on a CPU).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import random
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from turngym.agents.checker import check_policy
from turngym.agents.policy import GenerationRequest, Policy, SamplingParams
from turngym.envs.base import as_encodable_text
from turngym.rewards.scribe.constrain import pick_option

Schema = dict[str, Any]


# ------------------------------------------------------------------ schema validation


def validate(value: Any, schema: Schema, path: str = "$") -> str | None:
    """The first way ``value`` breaks ``schema`` (a JSON-schema subset), or None."""
    kind = schema.get("type")
    checks = {"object": dict, "array": list, "string": str, "boolean": bool}
    if kind in checks and not isinstance(value, checks[kind]):
        return f"{path} must be {kind}, got {type(value).__name__}"
    if kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        return f"{path} must be an integer, got {value!r}"
    if kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"{path} must be a number, got {value!r}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path} must be one of {schema['enum']}, got {value!r}"
    if "minimum" in schema and value < schema["minimum"]:
        return f"{path} must be >= {schema['minimum']}"
    if "maximum" in schema and value > schema["maximum"]:
        return f"{path} must be <= {schema['maximum']}"
    if kind == "string" and len(value) > schema.get("maxLength", 10_000):
        return f"{path} is longer than {schema.get('maxLength', 10_000)} characters"
    if kind == "object":
        for key in schema.get("required", []):
            if key not in value:
                return f"{path} lacks required key {key!r}"
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                err = validate(value[key], sub, f"{path}.{key}")
                if err:
                    return err
    if kind == "array":
        if len(value) < schema.get("minItems", 0):
            return f"{path} needs at least {schema['minItems']} items"
        if len(value) > schema.get("maxItems", 10_000):
            return f"{path} allows at most {schema['maxItems']} items"
        for i, item in enumerate(value):
            err = validate(item, schema.get("items", {}), f"{path}[{i}]")
            if err:
                return err
    return None


def _coerce(value: Any, schema: Schema) -> Any:
    """Unambiguous type repairs: "2" -> 2 for integers, one string -> [string] for string arrays."""
    kind = schema.get("type")
    if kind == "integer" and isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "array" and isinstance(value, str) and schema.get("items", {}).get("type") == "string":
        return [value]
    if kind == "object" and isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: _coerce(v, props[k]) if k in props else v for k, v in value.items()}
    if kind == "array" and isinstance(value, list):
        return [_coerce(v, schema.get("items", {})) for v in value]
    return value


def _structure(text: str, start: int):
    """(index, char) of each bracket at or after ``start`` that is outside JSON strings (escapes honoured)."""
    in_str = esc = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{}[]":
            yield i, ch


def _outermost_object(text: str) -> str | None:
    start = text.find("{")
    while start >= 0:
        depth = 0
        for i, ch in _structure(text, start):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i + 1]
        start = text.find("{", start + 1)
    return None


def close_truncated(text: str) -> str | None:
    """A reply cut off (by the token limit) inside its JSON object, ended after its last complete
    value inside an array or object and closed: ``{"steps": [{..}, {..}, {"sub`` → ``{"steps": [{..}, {..}]}``.
    None when the object is complete or no value in it was completed."""
    start = text.find("{")
    if start < 0:
        return None
    stack: list[str] = []
    last: tuple[int, str] | None = None   # (end of the last complete nested value, closers needed there)
    for i, ch in _structure(text, start):
        if ch in "{[":
            stack.append("}" if ch == "{" else "]")
            continue
        if not stack or stack.pop() != ch:
            return None
        if not stack:
            return None  # the object is complete: nothing to close
        last = (i + 1, "".join(reversed(stack)))
    if last is None:
        return None
    return text[start:last[0]] + last[1]


def parse_json_reply(text: str, schema: Schema) -> tuple[Any, str | None, bool]:
    """(value, error, repaired): the reply as JSON matching ``schema``."""
    candidates = [text.strip()]
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        candidates.append(fenced.group(1).strip())
    obj = _outermost_object(text)
    if obj:
        candidates.append(obj)
        candidates.append(re.sub(r",\s*([}\]])", r"\1", obj))
    closed = close_truncated(text)  # (the outermost object may be cut while a nested one is complete)
    if closed:
        candidates.append(re.sub(r",\s*([}\]])", r"\1", closed))
    error = "no JSON object in the reply"
    for n, cand in enumerate(candidates):
        for loader in (json.loads, ast.literal_eval):
            try:
                value = loader(cand)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            value = _coerce(value, schema)
            err = validate(value, schema)
            if err is None:
                return value, None, n > 0 or loader is not json.loads
            error = err
    return None, error, False


# ------------------------------------------------------------------ the caller


@dataclass
class LLMStats:
    calls: int = 0            # requests answered (cached or not)
    cache_hits: int = 0
    generated: int = 0        # prompts sent to the model, re-asks included
    repaired: int = 0         # replies fixed without asking again
    reasked: int = 0
    failed: int = 0           # still invalid after the re-ask: returned as None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cache_hit_rate"] = self.cache_hits / self.calls if self.calls else 0.0
        return d


@dataclass
class JSONLLM:
    """Schema-checked JSON replies from a policy, cached and concurrency-limited."""

    policy: Policy
    max_new_tokens: int = 384
    temperature: float = 0.0
    max_concurrency: int = 8
    reask: bool = True
    use_cache: bool = True
    cache_path: str | Path | None = None
    guided_json: bool = False  # served models: ask the server to constrain replies to the schema
    stats: LLMStats = field(default_factory=LLMStats)
    progress: Callable[[int, int], None] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        check_policy(self.policy)  # supports_score decides below how replies are made: refuse a declaration that lies
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(self.max_concurrency)
        self._rng = random.Random(0)
        if self.cache_path is not None and Path(self.cache_path).is_file():
            for line in Path(self.cache_path).read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                    self._cache[row["key"]] = row["value"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn last line from a killed run: that call is simply redone

    @property
    def name(self) -> str:
        return self.policy.name

    def key(self, prompt: str, schema: Schema) -> str:
        blob = json.dumps([self.name, self.temperature, self.max_new_tokens, prompt, schema], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def call(self, prompt: str, schema: Schema) -> Any:
        return self.call_many([(prompt, schema)])[0]

    def call_many(self, jobs: Sequence[tuple[str, Schema]]) -> list[Any]:
        """One JSON value (or None when the model never produced a valid one) per job, in order."""
        out: list[Any] = [None] * len(jobs)
        todo: dict[str, list[int]] = {}
        with self._lock:
            self.stats.calls += len(jobs)
            for i, (prompt, schema) in enumerate(jobs):
                k = self.key(prompt, schema)
                if self.use_cache and k in self._cache:
                    self.stats.cache_hits += 1
                    out[i] = self._cache[k]
                elif self.use_cache and k in todo:
                    self.stats.cache_hits += 1  # an identical call in the same batch
                    todo[k].append(i)
                else:
                    todo[k if self.use_cache else f"{k}#{i}"] = [i]  # uncached: every call is its own draw
        keys = list(todo)
        if keys and self.progress is not None:
            self.progress(0, len(keys))
        for start in range(0, len(keys), self.max_concurrency):
            chunk = keys[start:start + self.max_concurrency]
            values = self._generate_valid([jobs[todo[k][0]] for k in chunk])
            for k, value in zip(chunk, values, strict=True):
                for i in todo[k]:
                    out[i] = value
                # greedy decoding fails the same way twice: remember failures too, but not when sampling
                if self.use_cache and (value is not None or self.temperature == 0):
                    self._remember(k, value)
            if self.progress is not None:
                self.progress(start + len(chunk), len(keys))
        return out

    def _remember(self, key: str, value: Any) -> None:
        with self._lock:
            self._cache[key] = value
            if self.cache_path is not None:
                with open(self.cache_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"key": key, "value": value}) + "\n")

    def _generate_valid(self, jobs: Sequence[tuple[str, Schema]]) -> list[Any]:
        texts, forced = self._generate([p for p, _ in jobs], [sch for _, sch in jobs])
        values: list[Any] = []
        retry: list[int] = []
        errors: dict[int, str] = {}
        for i, ((_, schema), text) in enumerate(zip(jobs, texts, strict=True)):
            value, err, repaired = parse_json_reply(text, schema)
            if err is not None and forced[i]:  # the constrained field alone may satisfy the schema
                value, err2, _ = parse_json_reply(forced[i] + "}", schema)
                err, repaired = (None, True) if err2 is None else (err, repaired)
            values.append(value)
            if err is None:
                self.stats.repaired += int(repaired)
            else:
                retry.append(i)
                errors[i] = err
        if retry and self.reask:
            self.stats.reasked += len(retry)
            again, _ = self._generate([reask_prompt(jobs[i][0], errors[i], jobs[i][1]) for i in retry],
                                      [jobs[i][1] for i in retry])
            for i, text in zip(retry, again, strict=True):
                value, err, repaired = parse_json_reply(text, jobs[i][1])
                values[i] = value
                self.stats.repaired += int(repaired and err is None)
        self.stats.failed += sum(v is None for v in values)
        return values

    def _generate(self, prompts: Sequence[str], schemas: Sequence[Schema]) -> tuple[list[str], list[str]]:
        prompts = [as_encodable_text(p) for p in prompts]  # tokenizers and JSON encoders refuse lone surrogates
        """Local models get the opening of the expected JSON after the prompt (rendered with
        their chat template when they have one), and a leading enum field (a score, a
        prototype id) chosen by their own log-probabilities; the opening is put back in
        front of the reply. Served models get the prompt as a user message."""
        sampling = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                  stop=("}\n\n", "```\n"))
        if not self.policy.supports_score:
            reqs = [GenerationRequest(messages=[{"role": "user", "content": p}],
                                      json_schema=s if self.guided_json else None) for p, s in zip(prompts, schemas, strict=True)]
            with self._slots:
                gens = self.policy.generate(reqs, dataclasses.replace(sampling, stop=()))
            with self._lock:
                self.stats.generated += len(prompts)
            return [g.text for g in gens], [""] * len(prompts)
        tok = self.policy.tokenizer
        chat = bool(getattr(tok, "chat_template", None))
        texts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
                 if chat else p + "\n" for p in prompts]
        prefixes = [json_prefix(s) for s in schemas]
        forced = [""] * len(prompts)
        with self._slots:
            for i, schema in enumerate(schemas):
                options = enum_options(schema)
                if options:
                    k = pick_option(self.policy, texts[i] + prefixes[i], options, self.temperature, self._rng,
                                    add_special_tokens=not chat)
                    prefixes[i] += options[k]
                    forced[i] = prefixes[i]
            reqs = [GenerationRequest(prompt_ids=list(tok(t + pre, add_special_tokens=not chat)["input_ids"]))
                    for t, pre in zip(texts, prefixes, strict=True)]
            gens = self.policy.generate(reqs, sampling)
        with self._lock:
            self.stats.generated += len(prompts)
        return [pre + g.text for pre, g in zip(prefixes, gens, strict=True)], forced


def enum_options(schema: Schema) -> list[str]:
    """Continuations of :func:`json_prefix` for a leading enum field: ``["0", "1"]`` or ``['p0"', 'none"']``."""
    if schema.get("type") != "object" or not schema.get("required"):
        return []
    sub = schema.get("properties", {}).get(schema["required"][0], {})
    if "enum" not in sub:
        return []
    return [f'{v}"' if isinstance(v, str) else json.dumps(v) for v in sub["enum"]]


def json_prefix(schema: Schema) -> str:
    """The fixed opening of any object matching ``schema``, up to its first value: ``{"steps": [{"subgoal": "``."""
    if schema.get("type") != "object" or not schema.get("required"):
        return ""
    key = schema["required"][0]
    sub = schema.get("properties", {}).get(key, {})
    kind = sub.get("type")
    opening = {"string": '"', "object": json_prefix(sub)}.get(kind, "")
    if kind == "array":
        opening = "[" + json_prefix(sub.get("items", {}))
    return '{"' + key + '": ' + opening


def reask_prompt(prompt: str, error: str, schema: Schema) -> str:
    return (f"{prompt}\n\nYour previous reply was not valid: {error}. Reply with one JSON object only, "
            f"matching this JSON schema:\n{json.dumps(schema)}")
