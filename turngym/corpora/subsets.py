"""Named subsets of the bundled datasets (evaluation subsets, the offline training split) and the
train/evaluation overlap check.

A subset file (``turngym/data/subsets/<name>.json``) lists items of bundled datasets by
position, with the item ids and the sha256 of each source file, so loading it fails loudly if a
source file changed. ``load_dataset("subset:<name>")`` returns it as an ordinary dataset.

Evaluation subsets are the items IGPO evaluates on (its repository's ``data/test.parquet``,
bundled as ``igpo-test``): 512 per QA dataset, 125 for Bamboogle. The offline training split is
every item of the bundled NQ and HotpotQA files whose question is in no evaluation subset.

Overlap between training and evaluation items is decided by a hash of the normalised question
(lower case, punctuation dropped, white space collapsed), so a question that appears in two
files, or twice with different ids, still counts.
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turngym.corpora.datasets import SubsetSpec, load_dataset, subset_items, subsets_dir

SUBSET_PREFIX = "subset:"
EVAL_SOURCE = "igpo-test"  # IGPO's evaluation file, bundled
# The SIOP and IGPO evaluation sets: the Search-R1 / FlashRAG seven.
SEARCHQA_EVAL_DATASETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
# The papers train on NQ + HotpotQA train (Search-R1's nq_hotpotqa_train); offline, the bundled
# NQ test and HotpotQA dev files minus every evaluation subset stand in for them.
SEARCHQA_TRAIN_SOURCES = ("nq", "hotpotqa")
SEARCHQA_TRAIN_OFFLINE = "searchqa-train-offline"

_PUNCT = str.maketrans(dict.fromkeys(string.punctuation, " "))


def normalise_question(text: str) -> str:
    return " ".join(str(text).lower().translate(_PUNCT).split())


def question_key(item: dict[str, Any]) -> str:
    """The overlap key of an item: hash of its normalised question, else of its dataset-qualified id."""
    q = item.get("question")
    text = f"q:{normalise_question(q)}" if isinstance(q, str) and q.strip() else f"id:{item.get('dataset')}:{item.get('id')}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def eval_subset_name(dataset: str) -> str:
    return f"searchqa-eval-{dataset}"


def draw_eval_subset(dataset: str) -> SubsetSpec:
    """The items of ``dataset`` in IGPO's evaluation file, in that file's order."""
    source = load_dataset(EVAL_SOURCE)
    picked = [i for i, it in enumerate(source.items) if it["benchmark"] == dataset]
    if not picked:
        raise ValueError(f"{EVAL_SOURCE} has no items of {dataset!r}")
    return SubsetSpec(
        name=eval_subset_name(dataset),
        description=f"the {len(picked)} {dataset} items IGPO evaluates on (SIOP/IGPO evaluation protocol)",
        items=[[EVAL_SOURCE, i, str(source[i]["id"])] for i in picked],
        sources={EVAL_SOURCE: str(source.manifest.sha256)},
        selection={"method": f"items of {EVAL_SOURCE} whose benchmark is {dataset}, in file order",
                   "origin": "GuoqingWang1/IGPO data/test.parquet (512 per dataset drawn by the IGPO authors)"},
    )


def draw_offline_train_split(eval_specs: Sequence[SubsetSpec]) -> SubsetSpec:
    """Every item of the training sources whose question key is in no evaluation subset (file order,
    NQ first, as Search-R1 concatenates its training sets)."""
    excluded = eval_keys(eval_specs)
    items, sources, dropped = [], {}, {}
    for ds in SEARCHQA_TRAIN_SOURCES:
        data = load_dataset(ds)
        sources[ds] = str(data.manifest.sha256)
        kept = [[ds, i, str(it["id"])] for i, it in enumerate(data.items) if question_key(it) not in excluded]
        dropped[ds] = len(data) - len(kept)
        items += kept
    return SubsetSpec(
        name=SEARCHQA_TRAIN_OFFLINE,
        description=("offline training split for search QA: the bundled NQ test and HotpotQA dev files minus every "
                     "item whose normalised question is in any searchqa-eval-* subset"),
        items=items, sources=sources,
        selection={"method": "question_key(item) not in the union of the evaluation subsets' keys",
                   "excluded_subsets": [s.name for s in eval_specs], "dropped": dropped},
    )


def eval_keys(specs: Iterable[SubsetSpec]) -> set[str]:
    return {question_key(it) for spec in specs for it in subset_items(spec)}


def write_searchqa_subsets(out_dir: Path | None = None) -> list[Path]:
    """(Re)generate the shipped search-QA subset files; deterministic."""
    out_dir = Path(out_dir) if out_dir is not None else subsets_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    evals = [draw_eval_subset(ds) for ds in SEARCHQA_EVAL_DATASETS]
    paths = []
    for spec in [*evals, draw_offline_train_split(evals)]:
        path = out_dir / f"{spec.name}.json"
        path.write_text(_render(spec), encoding="utf-8")
        paths.append(path)
    return paths


def _render(spec: SubsetSpec) -> str:
    """JSON with one item per line (readable diffs, small files)."""
    head = {k: v for k, v in spec.to_dict().items() if k != "items"}
    lines = ",\n".join("  " + json.dumps(it) for it in spec.items)
    return json.dumps(head, indent=1)[:-2] + ',\n "items": [\n' + lines + "\n ]\n}\n"


# ------------------------------------------------------------------ overlap check

OVERLAP_POLICIES = ("refuse", "drop", "allow")


@dataclass
class OverlapReport:
    train_count: int
    overlapping: list[int]  # positions in the training list whose question is in an evaluation set
    per_eval_set: dict[str, int]

    @property
    def count(self) -> int:
        return len(self.overlapping)


class EvalOverlapError(ValueError):
    """Training items share questions with evaluation items."""


def check_overlap(train_items: Sequence[dict[str, Any]], eval_sets: dict[str, Sequence[dict[str, Any]]]) -> OverlapReport:
    keys_by_set = {name: {question_key(it) for it in items} for name, items in eval_sets.items()}
    union = set().union(*keys_by_set.values()) if keys_by_set else set()
    train_keys = [question_key(it) for it in train_items]
    overlapping = [i for i, k in enumerate(train_keys) if k in union]
    per_set = {name: sum(k in keys for k in train_keys) for name, keys in keys_by_set.items()}
    return OverlapReport(len(train_items), overlapping, {k: v for k, v in per_set.items() if v})


def apply_overlap_policy(report: OverlapReport, policy: str) -> list[int]:
    """Positions of the training items to keep; refuses with a message naming the overlap count."""
    if policy not in OVERLAP_POLICIES:
        raise ValueError(f"data.eval_overlap must be one of {OVERLAP_POLICIES}, got {policy!r}")
    keep = list(range(report.train_count))
    if not report.count or policy == "allow":
        return keep
    if policy == "drop":
        gone = set(report.overlapping)
        return [i for i in keep if i not in gone]
    detail = ", ".join(f"{name}: {n}" for name, n in sorted(report.per_eval_set.items()))
    raise EvalOverlapError(
        f"{report.count} of {report.train_count} training items share a normalised question with evaluation items "
        f"({detail}). Train on a split without them (e.g. subset:{SEARCHQA_TRAIN_OFFLINE}), or set "
        "data.eval_overlap: drop to leave them out, or data.eval_overlap: allow (--allow-eval-overlap) to train on them anyway")


# Evaluation sets per env family: what `turngym eval` and the papers evaluate on. "env" means every
# item of the training env's own dataset (BFCL: every entry is a benchmark item).
DEFAULT_EVAL_SETS: dict[str, list[str]] = {
    "turngym/SearchQA-v0": [SUBSET_PREFIX + eval_subset_name(ds) for ds in SEARCHQA_EVAL_DATASETS],
    "turngym/MathCode-v0": ["math500", "aime24", "aime25", "gsm8k"],
    "turngym/BFCL-v0": ["env"],
    "turngym/Calculator-v0": [],  # synthetic tasks, no evaluation benchmark
    "turngym/Digits-v0": [],
}


def eval_set_items(env_id: str, specs: Sequence[str] | None, env: Any) -> dict[str, list[dict[str, Any]]]:
    """Items of each evaluation set, by spec: a dataset name or path for ``load_dataset``
    (``subset:…`` included), or ``env`` for every item of ``env``'s own dataset."""
    if specs is None:
        if env_id not in DEFAULT_EVAL_SETS:
            raise ValueError(f"no default evaluation sets for {env_id}; list them in data.eval_sets "
                             "(dataset names, subset:NAME, files, or 'env')")
        specs = DEFAULT_EVAL_SETS[env_id]
    out = {}
    for spec in specs:
        if spec == "env":
            out[f"env:{getattr(env, 'dataset_name', env_id)}"] = [env.get_item(i) for i in range(env.num_items())]
        else:
            out[spec] = load_dataset(spec).items
    return out
