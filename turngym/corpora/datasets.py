"""Benchmark dataset loading: bundled files, local paths, or Hugging Face dataset ids.

Every loaded dataset carries a :class:`Manifest` (source, split, sha256 of the file,
item ids) so a result can say exactly which subset it was computed on. Items are
normalised to ``{"dataset", "split", "index", "id", "question", "answers", ...}``
with ``index`` the position in the dataset's own file order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BundledDataset:
    name: str
    relpath: str
    split: str
    normalise: Callable[[dict[str, Any]], dict[str, Any]]
    note: str = ""


def _math500(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["unique_id"], "question": row["problem"], "answers": [str(row["answer"])],
            "subject": row.get("subject"), "level": row.get("level")}


def _aime(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "question": row["problem"], "answers": [str(row["answer"])]}


def _gsm8k(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"gsm8k-test-{row['idx']}", "question": row["question"], "answers": [str(row["final_answer"])]}


def _qa(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": str(row["id"]), "question": row["question"], "answers": [str(a) for a in row["golden_answers"]]}


def _igpo(row: dict[str, Any]) -> dict[str, Any]:
    return {**_qa(row), "benchmark": row["dataset"], "source_split": row.get("source_split")}


BUNDLED: dict[str, BundledDataset] = {
    "math500": BundledDataset("math500", "math/math500/test.jsonl", "test", _math500, "full 500-problem subset"),
    "aime24": BundledDataset("aime24", "math/aime24/test.jsonl", "test", _aime, "full (30)"),
    "aime25": BundledDataset("aime25", "math/aime25/test.jsonl", "test", _aime, "full (30)"),
    "gsm8k": BundledDataset("gsm8k", "math/gsm8k/test.jsonl", "test", _gsm8k, "full test split (1,319)"),
    "nq": BundledDataset("nq", "qa/nq/test.jsonl", "test", _qa, "full NQ-open test (3,610)"),
    "triviaqa": BundledDataset("triviaqa", "qa/triviaqa/test_sample200.jsonl", "test", _qa, "sample of 200, split unknown"),
    "popqa": BundledDataset("popqa", "qa/popqa/test.jsonl", "test", _qa, "first 1,000 PopQA rows"),
    "hotpotqa": BundledDataset("hotpotqa", "qa/hotpotqa/dev.jsonl", "dev", _qa, "full distractor dev (7,405)"),
    "2wikimultihopqa": BundledDataset("2wikimultihopqa", "qa/2wikimultihopqa/dev.jsonl", "dev", _qa, "full dev (12,576)"),
    "musique": BundledDataset("musique", "qa/musique/dev.jsonl", "dev", _qa, "full answerable dev (2,417)"),
    "bamboogle": BundledDataset("bamboogle", "qa/bamboogle/test.jsonl", "test", _qa, "full (125)"),
    "igpo-test": BundledDataset("igpo-test", "qa/igpo_test/test.jsonl", "test", _igpo,
                                "IGPO's evaluation items: 512 per QA dataset (bamboogle 125), 3,197"),
}
QA_DATASETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


@dataclass
class Manifest:
    dataset: str
    split: str
    source: str
    sha256: str | None
    count: int
    item_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def subset(self, indices: Sequence[int], items: Sequence[dict[str, Any]]) -> Manifest:
        ids = [str(items[i]["id"]) for i in indices]
        return Manifest(self.dataset, self.split, self.source, self.sha256, len(ids), ids)


@dataclass
class Dataset:
    items: list[dict[str, Any]]
    manifest: Manifest

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


def _bundled_path(relpath: str) -> Path:
    return Path(str(resources.files("turngym").joinpath("data", relpath)))


def _read_rows(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        return data if isinstance(data, list) else data.get("data", [])
    return parse_jsonl(text, path)


def parse_jsonl(text: str, path: Path | str) -> list[dict[str, Any]]:
    """JSON Lines rows; a bad line is reported as ``path:line``."""
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
    return rows


def _generic(row: dict[str, Any], n: int) -> dict[str, Any]:
    """Field names used by the common benchmark files and Hugging Face copies."""
    question = next((row[k] for k in ("question", "problem", "prompt", "query") if k in row), None)
    if question is None:
        raise ValueError(f"row {n} has no question/problem field (fields: {sorted(row)})")
    answers: Any = next((row[k] for k in ("answers", "golden_answers", "final_answer", "answer", "solution")
                         if k in row and row[k] is not None), [])
    if isinstance(answers, dict) and "text" in answers:
        answers = answers["text"]
    if not isinstance(answers, list):
        answers = [answers]
    answers = [str(a).split("####")[-1].strip() for a in answers]
    return {"id": str(row.get("id", row.get("unique_id", row.get("idx", n)))), "question": str(question),
            "answers": answers}


def load_dataset(name_or_path: str, split: str | None = None, normalise: Callable | None = None) -> Dataset:
    """A bundled name (``math500``), a shipped subset (``subset:searchqa-eval-nq``), a local
    ``.jsonl``/``.json`` file, or a HF dataset id."""
    if name_or_path.startswith("subset:"):
        return _load_subset(name_or_path[len("subset:"):], split)
    if name_or_path in BUNDLED:
        spec = BUNDLED[name_or_path]
        if split not in (None, spec.split):
            raise ValueError(f"bundled {name_or_path} has only the {spec.split!r} split, not {split!r}")
        path = _bundled_path(spec.relpath)
        rows, norm, name, split = _read_rows(path), spec.normalise, spec.name, spec.split
        source = f"bundled:{spec.relpath}"
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        items = [{**norm(r)} for r in rows]
    else:
        path = Path(name_or_path)
        if path.suffix in (".jsonl", ".json") or path.exists():
            if not path.is_file():
                raise FileNotFoundError(f"dataset file not found: {name_or_path}")
            rows = _read_rows(path)
            name, split, source = path.stem, split or "local", str(path)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            rows, name, split, source, digest = _load_hub(name_or_path, split)
        items = [normalise(r) if normalise else _generic(r, n) for n, r in enumerate(rows)]
    for i, item in enumerate(items):
        item.update({"dataset": name, "split": split, "index": i})
    manifest = Manifest(name, split, source, digest, len(items), [str(it["id"]) for it in items])
    return Dataset(items, manifest)


# ------------------------------------------------------------------ subset files
# A subset file (``turngym/data/subsets/<name>.json``, drawn by ``turngym.corpora.subsets``) lists items
# of bundled datasets; ``load_dataset("subset:<name>")`` loads it like any dataset.


def subsets_dir() -> Path:
    return Path(str(resources.files("turngym").joinpath("data", "subsets")))


def subset_path(name: str) -> Path:
    path = subsets_dir() / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in subsets_dir().glob("*.json"))
        raise ValueError(f"unknown subset {name!r}; shipped subsets: {', '.join(known)}")
    return path


@dataclass
class SubsetSpec:
    """A subset file: ``items`` are ``[source dataset, index in its file, item id]``."""

    name: str
    description: str
    items: list[list[Any]]
    sources: dict[str, str]  # source dataset -> sha256 of its bundled file
    selection: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "selection": self.selection,
                "sources": self.sources, "count": len(self.items), "items": self.items}

    @classmethod
    def read(cls, name: str) -> SubsetSpec:
        raw = json.loads(subset_path(name).read_text(encoding="utf-8"))
        return cls(raw["name"], raw["description"], raw["items"], raw["sources"], raw.get("selection", {}))


def subset_items(spec: SubsetSpec) -> list[dict[str, Any]]:
    """The subset's items in file order, checked against the bundled source files."""
    sources = {}
    for ds, digest in spec.sources.items():
        data = load_dataset(ds)
        if data.manifest.sha256 != digest:
            raise ValueError(f"subset {spec.name!r} was drawn from a different {ds} file (sha256 "
                             f"{digest[:12]}…, bundled file {str(data.manifest.sha256)[:12]}…); regenerate it")
        sources[ds] = data
    out = []
    for pos, (ds, index, item_id) in enumerate(spec.items):
        item = dict(sources[ds][int(index)])
        if str(item["id"]) != str(item_id):
            raise ValueError(f"subset {spec.name!r} item {pos}: {ds}[{index}] has id {item['id']!r}, expected {item_id!r}")
        out.append({**item, "source_dataset": ds, "source_index": int(index)})
    return out


def _load_subset(name: str, split: str | None) -> Dataset:
    """A subset file's items; ``dataset`` is the subset's name, ``index`` the position in it, and
    ``source_dataset`` / ``source_index`` say where each item comes from."""
    if split not in (None, "subset"):
        raise ValueError(f"subset {name!r} has no splits; got split {split!r}")
    spec = SubsetSpec.read(name)
    items = subset_items(spec)
    for i, item in enumerate(items):
        item.update({"dataset": spec.name, "split": "subset", "index": i})
    digest = hashlib.sha256(subset_path(name).read_bytes()).hexdigest()
    manifest = Manifest(spec.name, "subset", f"bundled:subsets/{name}.json", digest, len(items),
                        [str(it["id"]) for it in items])
    return Dataset(items, manifest)


def _load_hub(dataset_id: str, split: str | None):
    try:
        import datasets as hf_datasets
    except ImportError:
        raise ValueError(
            f"{dataset_id!r} is not a bundled dataset ({', '.join(sorted(BUNDLED))}) or a local file, and "
            "loading a Hugging Face dataset id needs `pip install datasets`"
        ) from None
    try:
        ds = hf_datasets.load_dataset(dataset_id, split=split or "test")
    except Exception as exc:  # noqa: BLE001 - network, auth, or unknown id
        raise ValueError(f"could not load Hugging Face dataset {dataset_id!r} (split {split or 'test'}): {exc}") from exc
    fingerprint = getattr(ds, "_fingerprint", None)
    return [dict(r) for r in ds], dataset_id.split("/")[-1], split or "test", f"hf:{dataset_id}", fingerprint
