"""Decomposition into ⟨subgoal, skill, step⟩ with character spans inside turns.

SCRIBE judges *steps*, and one reasoning turn (a long MATH/AIME derivation) holds many.
So the decomposer works on the agent's text itself, not on whole turns:

1. Budget. Every turn's action is cut into *parts* of at most ``window_tokens`` tokens
   (cuts at line ends where possible), counted with the judge model's tokenizer when it has
   one, else estimated as ``ceil(chars / 4)`` (stated in the diagnostics as ``token_count``).
   Parts are packed, in order, into *windows* of at most ``window_tokens`` tokens, counting
   with a turn's last part the environment's reply shown after it (clipped to
   ``observation_tokens``, head and tail kept). Whole short turns share a window; a long
   turn spans several. Nothing of a turn is cut away: its end is always in some window.
2. One decomposer call per window. The model lists the steps it sees, each with the turn
   it is in and ``starts_with``: the first words of the step copied from that turn.
3. Spans. Each ``starts_with`` is located in its turn's part (exact match, then with
   whitespace collapsed); a step whose quote is not found, or names a turn outside the
   window, is dropped and counted. Inside a turn the located starts are sorted and the
   steps tile the turn: step i spans ``[start_i, start_{i+1})``, the last one ends at the
   end of the turn, and the first one begins at character 0 (text before the first quoted
   step belongs to it). A step therefore never crosses a turn, and every character of a turn
   that has any located step belongs to exactly one step. Turns with none are counted
   (``unstepped_turns``).

Options for a decomposer too small to quote (both off by default, both counted):
``locate_steps="fuzzy"`` places a quote that is not found verbatim where the turn's words best
cover the quote's words (:func:`locate_fuzzy`), and ``unlocated="whole_turn"`` makes a turn
none of whose quotes is found one step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import TYPE_CHECKING, Any

from turngym.envs.base import as_encodable_text
from turngym.episode import Episode
from turngym.rewards.scribe.library import SkillItem
from turngym.rewards.scribe.prompts import DECOMPOSE_SCHEMA, decompose_prompt

if TYPE_CHECKING:
    from turngym.rewards.scribe.llm import JSONLLM

CHARS_PER_TOKEN_ESTIMATE = 4


@dataclass
class TokenCounter:
    """Token counts by a tokenizer, or ``ceil(chars / 4)`` when there is none."""

    tokenizer: Any = None

    @property
    def method(self) -> str:
        return "tokenizer" if self.tokenizer is not None else f"chars/{CHARS_PER_TOKEN_ESTIMATE}"

    def count_many(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        if self.tokenizer is None:
            return [math.ceil(len(t) / CHARS_PER_TOKEN_ESTIMATE) for t in texts]
        texts = [as_encodable_text(t) for t in texts]  # tokenizers refuse lone surrogates
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def count(self, text: str) -> int:
        return self.count_many([text])[0]

    def clip(self, text: str, budget: int) -> str:
        """``text`` if it fits ``budget`` tokens, else its head and tail with the omission stated."""
        n = self.count(text)
        if n <= budget:
            return text
        keep = max(1, int(len(text) * budget / n) // 2)
        return f"{text[:keep]}\n[... {len(text) - 2 * keep} characters omitted ...]\n{text[-keep:]}"


def counter_for(llm: JSONLLM) -> TokenCounter:
    """Token counts in the judge's own tokenizer (characters / 4 for a text-only backend)."""
    return TokenCounter(llm.policy.tokenizer)


@dataclass(frozen=True)
class Part:
    """Characters ``[start, end)`` of turn ``turn``'s action."""

    turn: int
    start: int
    end: int
    tokens: int


def split_turn(text: str, turn: int, budget: int, counter: TokenCounter) -> list[Part]:
    """Cut one action into parts of at most ``budget`` tokens, at line ends where possible."""
    if not text:
        return [Part(turn, 0, 0, 0)]
    pieces = [m.span() for m in re.finditer(r"[^\n]*\n|[^\n]+$", text)]
    sizes = counter.count_many([text[a:b] for a, b in pieces])
    fine: list[tuple[int, int, int]] = []
    for (a, b), n in zip(pieces, sizes, strict=True):
        if n <= budget:
            fine.append((a, b, n))
            continue
        step = max(1, int((b - a) * budget / n))  # an over-long line: cut by characters in proportion
        for s in range(a, b, step):
            e = min(b, s + step)
            fine.append((s, e, counter.count(text[s:e])))
    parts, cur_start, cur_end, cur_tokens = [], fine[0][0], fine[0][0], 0
    for a, b, n in fine:
        if cur_tokens and cur_tokens + n > budget:
            parts.append(Part(turn, cur_start, cur_end, cur_tokens))
            cur_start, cur_tokens = a, 0
        cur_end, cur_tokens = b, cur_tokens + n
    parts.append(Part(turn, cur_start, cur_end, cur_tokens))
    return parts


def windows(episode: Episode, budget: int, counter: TokenCounter, observation_tokens: int = 0) -> list[list[Part]]:
    """The episode's parts, packed in order into windows of at most ``budget`` tokens; a turn's
    last part also carries its reply as shown (at most ``observation_tokens``)."""
    out: list[list[Part]] = []
    used = 0
    for t in episode.turns:
        reply = min(counter.count(t.observation), observation_tokens) if t.observation and observation_tokens else 0
        parts = split_turn(t.action, t.index, max(1, budget - reply), counter)
        for k, part in enumerate(parts):
            cost = part.tokens + (reply if k == len(parts) - 1 else 0)
            if out and used + cost <= budget:
                out[-1].append(part)
                used += cost
            else:
                out.append([part])
                used = cost
    return out


def locate(quote: str, text: str) -> int | None:
    """Where ``quote`` starts in ``text``: exact, else with runs of whitespace collapsed."""
    quote = quote.strip()
    if not quote:
        return None
    at = text.find(quote)
    if at >= 0:
        return at
    pattern = r"\s+".join(re.escape(w) for w in quote.split())
    m = re.search(pattern, text)
    return m.start() if m else None


_WORD = re.compile(r"\w+|[^\w\s]")


def locate_fuzzy(quote: str, text: str, min_coverage: float = 0.6) -> int | None:
    """Where a paraphrased ``quote`` starts in ``text``, or None. Words and symbols of both, lower-cased,
    are aligned (difflib) against every stretch of the text that starts at a word and is at most 1.5x
    the quote's length in words; the stretch whose aligned words cover the largest share of the quote's
    words wins (the earliest on ties), if that share is at least ``min_coverage`` and at least two words
    (one when the quote has one). The step starts at the first aligned word of that stretch: for the
    quote "multiply 84 * 63" in ``<calc>84 * 63 + 51</calc>``, at "84" (3 of 4 words covered)."""
    q = [m.group().lower() for m in _WORD.finditer(quote)]
    words = list(_WORD.finditer(text))
    if not q or not words:
        return None
    low = [m.group().lower() for m in words]
    span = max(len(q), math.ceil(1.5 * len(q)))
    need = max(min(2, len(q)), math.ceil(min_coverage * len(q)))
    best, best_at = 0, None
    for i in range(len(low)):
        if low[i] not in q:
            continue  # a stretch that starts with an unaligned word is covered as well from its next word
        blocks = [b for b in SequenceMatcher(None, q, low[i:i + span], autojunk=False).get_matching_blocks() if b.size]
        covered = sum(b.size for b in blocks)
        if covered > best and covered >= need:
            best, best_at = covered, words[i + blocks[0].b].start()
    return best_at


def find_quote(quote: str, text: str, mode: str = "exact", min_coverage: float = 0.6) -> tuple[int | None, bool]:
    """(start, fuzzy): :func:`locate`, then with ``mode="fuzzy"`` :func:`locate_fuzzy`."""
    at = locate(quote, text)
    if at is not None or mode != "fuzzy":
        return at, False
    at = locate_fuzzy(quote, text, min_coverage)
    return at, at is not None


@dataclass
class Decomposition:
    items: list[SkillItem]
    dropped: int = 0                       # steps whose quote was not found or named a turn outside its window
    failed_windows: int = 0                # windows for which the LLM never produced valid JSON
    windows: int = 0
    unstepped_turns: list[int] = field(default_factory=list)
    whole_turn_steps: int = 0              # unlocated="whole_turn": turns made one step because no quote was found
    fuzzy_located: int = 0                 # locate_steps="fuzzy": steps placed by locate_fuzzy (not found verbatim)

    @property
    def failed(self) -> bool:
        return self.windows > 0 and self.failed_windows == self.windows


UNLOCATED = ("drop", "whole_turn")
LOCATE = ("exact", "fuzzy")


def decompose(episodes: Sequence[Episode], llm: Any, window_tokens: int = 1024,
              observation_tokens: int = 192, unlocated: str = "drop", locate_steps: str = "exact",
              fuzzy_min_coverage: float = 0.6) -> list[Decomposition]:
    """Steps of every episode, with spans; all windows of all episodes in one batch of LLM calls.
    ``unlocated``: what happens to a turn none of whose steps' quotes is found: ``"drop"`` (its steps
    are dropped and counted, the turn is unstepped) or ``"whole_turn"`` (the turn becomes one step, with
    the subgoal and skill of the first step the decomposer placed in it; counted as ``whole_turn_steps``).
    ``locate_steps``: ``"exact"`` (the quote verbatim, whitespace collapsed) or ``"fuzzy"`` (then, failing that,
    :func:`locate_fuzzy` with ``fuzzy_min_coverage``; counted as ``fuzzy_located``)."""
    if unlocated not in UNLOCATED:
        raise ValueError(f"unlocated must be one of {UNLOCATED}, got {unlocated!r}")
    if locate_steps not in LOCATE:
        raise ValueError(f"locate_steps must be one of {LOCATE}, got {locate_steps!r}")
    if not 0 < fuzzy_min_coverage <= 1:
        raise ValueError(f"fuzzy_min_coverage must be in (0, 1], got {fuzzy_min_coverage}")
    if window_tokens < 16 or observation_tokens >= window_tokens:
        raise ValueError(f"need window_tokens >= 16 and observation_tokens < window_tokens, got {window_tokens} "
                         f"and {observation_tokens}")
    counter = counter_for(llm)
    plan = [(ep, w) for ep in episodes for w in windows(ep, window_tokens, counter, observation_tokens)]
    replies = llm.call_many([(decompose_prompt(ep, w, counter, observation_tokens), DECOMPOSE_SCHEMA)
                             for ep, w in plan])
    found: dict[str, list[tuple[int, int, str, str]]] = {ep.id: [] for ep in episodes}
    unplaced: dict[str, dict[int, tuple[str, str]]] = {ep.id: {} for ep in episodes}  # turn -> first unlocated step
    stats: dict[str, list[int]] = {ep.id: [0, 0, 0, 0] for ep in episodes}  # dropped, failed, windows, fuzzy
    for (ep, window), reply in zip(plan, replies, strict=True):
        s = stats[ep.id]
        s[2] += 1
        if reply is None:
            s[1] += 1
            continue
        parts = {p.turn: p for p in window}
        for step in reply["steps"]:
            part = parts.get(int(step["turn"]))
            at, fuzzy = (None, False) if part is None else find_quote(
                step["starts_with"], ep.turns[part.turn].action[part.start:part.end], locate_steps, fuzzy_min_coverage)
            if part is None or at is None:
                s[0] += 1
                if part is not None:
                    unplaced[ep.id].setdefault(part.turn, (step["subgoal"].strip(), step["skill"].strip()))
                continue
            s[3] += int(fuzzy)
            found[ep.id].append((part.turn, part.start + at, step["subgoal"].strip(), step["skill"].strip()))
    out = []
    for ep in episodes:
        items: list[SkillItem] = []
        by_turn: dict[int, dict[int, tuple[str, str]]] = {}
        for turn, start, subgoal, skill in found[ep.id]:
            by_turn.setdefault(turn, {}).setdefault(start, (subgoal, skill))  # one step per start
        whole = [t for t in unplaced[ep.id] if t not in by_turn] if unlocated == "whole_turn" else []
        for turn in whole:
            by_turn[turn] = {0: unplaced[ep.id][turn]}
        for turn in sorted(by_turn):
            action = ep.turns[turn].action
            starts = sorted(by_turn[turn])
            bounds = [0] + starts[1:] + [len(action)]
            for k, start in enumerate(starts):
                subgoal, skill = by_turn[turn][start]
                items.append(SkillItem(subgoal, skill, turn, bounds[k], bounds[k + 1], ep.id,
                                       action[bounds[k]:bounds[k + 1]]))
        dropped, failed, n_windows, fuzzy_n = stats[ep.id]
        unstepped = [t.index for t in ep.turns if t.index not in by_turn]
        out.append(Decomposition(items, dropped, failed, n_windows, unstepped, len(whole), fuzzy_n))
    return out
