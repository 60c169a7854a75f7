"""BFCL V4 categories: which run offline, and their entries as bfcl-eval prepares them.

Data comes from the files bfcl-eval ships (BFCL V4, Apache-2.0), or from a local folder
with the same layout (``BFCL_v4_<category>.json`` plus ``possible_answer/``). Entries
are prepared by bfcl-eval's own functions: multi-turn function docs are filled in from
its ``multi_turn_func_doc`` files, held-out functions of ``miss_func`` are moved to
``missed_function``, and the language hints are added to the docs the model sees. The
checker gets the docs without hints, as in bfcl-eval's evaluator.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.corpora.datasets import Manifest, parse_jsonl
from turngym.envs.bfcl.categories import CATEGORIES, MEMORY, MEMORY_PREREQ, MULTI_TURN, REFUSED, RELEVANCE, SINGLE_TURN_AST
from turngym.envs.bfcl.upstream import BFCL_VERSION, bfcl

__all__ = ["CATEGORIES", "MULTI_TURN", "RELEVANCE", "SINGLE_TURN_AST", "BFCLCategory", "BFCLDataError",
           "MemoryOrderError", "check_category", "is_memory", "is_multi_turn", "language_of", "load_category"]


class BFCLDataError(ValueError):
    """An unknown or unsupported category, or a data folder without the category's files."""


class MemoryOrderError(BFCLDataError, RuntimeError):
    """A memory conversation or question played before the conversation it builds on."""


def language_of(category: str) -> str:
    return "java" if category.endswith("java") else "javascript" if category.endswith("javascript") else "python"


def is_multi_turn(category: str) -> bool:
    return category in MULTI_TURN


def is_memory(category: str) -> bool:
    return category in MEMORY or category in MEMORY_PREREQ


@dataclass
class BFCLCategory:
    """One category: entries the model sees, entries the checker sees, and ground truths."""

    name: str
    entries: list[dict[str, Any]]
    checker_entries: list[dict[str, Any]]
    answers: dict[str, Any]
    manifest: Manifest
    prompts: dict[tuple[int, str], list[dict[str, str]]] = field(default_factory=dict)  # rendered once per item
    tools: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # native tool schemas, once per item

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def items(self) -> list[dict[str, Any]]:
        """The entries, under the name the harness uses for every dataset."""
        return self.entries


def check_category(category: str) -> str:
    if category in REFUSED:
        raise BFCLDataError(f"BFCL category {category!r} is not available offline: it {REFUSED[category]}")
    if category not in CATEGORIES:
        raise BFCLDataError(f"unknown BFCL category {category!r}; choose one of {', '.join(CATEGORIES)}")
    return category


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """BFCL's files are JSON Lines despite their ``.json`` names."""
    if not path.is_file():
        raise BFCLDataError(f"BFCL data file not found: {path}")
    try:
        return parse_jsonl(path.read_text(encoding="utf-8"), path)
    except ValueError as exc:
        raise BFCLDataError(str(exc)) from None


def package_data_dir() -> Path:
    return Path(bfcl()["eval_config"].PROMPT_PATH)


_cache: dict[tuple[str, str], BFCLCategory] = {}
_cache_lock = threading.Lock()


def load_category(category: str, data_dir: str | Path | None = None) -> BFCLCategory:
    """The category's entries (cached per process; callers must not mutate them)."""
    check_category(category)
    folder = Path(data_dir) if data_dir is not None else package_data_dir()
    if is_memory(category) and data_dir is not None:
        raise BFCLDataError("memory categories load from bfcl-eval's own data (they need its prerequisite files)")
    key = (category, str(folder))
    with _cache_lock:
        if key not in _cache:
            _cache[key] = _load_memory(category) if is_memory(category) else _load(category, folder, data_dir is None)
        return _cache[key]


def _load_memory(category: str) -> BFCLCategory:
    """Questions, or (``*_prereq``) the prerequisite conversations in dependency order, as bfcl-eval builds them."""
    mods = bfcl()
    utils = mods["utils"]
    base = category.removesuffix("_prereq")
    prereq = category.endswith("_prereq")
    entries = [e for e in utils.load_dataset_entry(base, include_prereq=True)
               if ("prereq" in e["id"]) == prereq]
    seen: set[str] = set()
    for e in entries if prereq else []:  # each conversation comes after the ones it depends on: checked
        if not set(e.get("depends_on", [])) <= seen:
            raise BFCLDataError(f"{e['id']} comes before a conversation it depends on")
        seen.add(e["id"])
    answers: dict[str, Any] = {}
    if not prereq:
        for row in utils.load_ground_truth_entry(base):
            answers[row["id"].replace("memory", base, 1)] = row["ground_truth"]
        missing = [e["id"] for e in entries if e["id"] not in answers]
        if missing:
            raise BFCLDataError(f"{len(missing)} {category} entries have no ground truth (first: {missing[0]})")
    source = Path(mods["eval_config"].PROMPT_PATH) / f"{mods['eval_config'].VERSION_PREFIX}_memory.json"
    manifest = Manifest(dataset=category, split="test", source=f"bfcl-eval {BFCL_VERSION}: {source.name}",
                        sha256=hashlib.sha256(source.read_bytes()).hexdigest(), count=len(entries),
                        item_ids=[e["id"] for e in entries])
    return BFCLCategory(category, entries, copy.deepcopy(entries), answers, manifest)


def _load(category: str, folder: Path, from_package: bool) -> BFCLCategory:
    mods = bfcl()
    utils = mods["utils"]
    prefix = mods["eval_config"].VERSION_PREFIX
    question_file = folder / f"{prefix}_{category}.json"
    raw = _read_jsonl(question_file)
    raw = utils.populate_test_cases_with_predefined_functions(raw)
    checker_entries = copy.deepcopy(raw)
    entries = utils.add_language_specific_hint_to_function_doc(copy.deepcopy(raw))
    answers: dict[str, Any] = {}
    if category not in RELEVANCE:
        for row in _read_jsonl(folder / "possible_answer" / f"{prefix}_{category}.json"):
            answers[row["id"]] = row["ground_truth"]
        missing = [e["id"] for e in entries if e["id"] not in answers]
        if missing:
            raise BFCLDataError(f"{len(missing)} {category} entries have no ground truth (first: {missing[0]})")
    digest = hashlib.sha256(question_file.read_bytes()).hexdigest()
    source = f"bfcl-eval {BFCL_VERSION}: {question_file.name}" if from_package else str(question_file)
    manifest = Manifest(dataset=category, split="test", source=source, sha256=digest, count=len(entries),
                        item_ids=[e["id"] for e in entries])
    return BFCLCategory(category, entries, checker_entries, answers, manifest)
