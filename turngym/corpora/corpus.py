"""Passage corpora: the embedded default corpus, user JSONL, and the default index.

The default corpus is the bundled Wikipedia passage samples plus the context paragraphs
shipped with HotpotQA, 2WikiMultihopQA, MuSiQue and PopQA, deduplicated on (title, text).
Passages are written in Pyserini's JsonCollection form: ``{"id", "contents", "title", "text"}``
with ``contents = '"Title"\\ntext'`` (Search-R1 / FlashRAG). Search-R1's own ``{"id", "contents"}``
alone stores half the raw text but measured slower end to end (docs/results.md, "Lucene batch
search throughput"), so the title/text fields stay.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from tqdm import tqdm

from turngym.cache import cache_root
from turngym.corpora.lucene import build_index, split_contents


def _data(rel: str) -> Path:
    return Path(str(resources.files("turngym").joinpath("data", rel)))


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _passage(title: str, text: str) -> dict[str, str]:
    return {"title": title.strip(), "text": text.strip()}


def default_passages() -> Iterator[dict[str, str]]:
    """Every passage of the embedded corpus, before deduplication."""
    for row in _rows(_data("wiki/flashrag_wiki18_sample_1000.jsonl")):
        yield _passage(*split_contents(row["contents"]))
    for row in _rows(_data("wiki/hipporag_2wikimultihopqa_corpus.jsonl")):
        yield _passage(row["title"], row["text"])
    for name in ("hotpotqa", "2wikimultihopqa"):
        for row in _rows(_data(f"qa/{name}/dev_with_context.jsonl")):
            for title, sentences in row.get("context", []):
                yield _passage(title, " ".join(s.strip() for s in sentences))
    for row in _rows(_data("qa/musique/dev_with_context.jsonl")):
        for p in row.get("paragraphs", []):
            yield _passage(p["title"], p["paragraph_text"])
    for row in _rows(_data("qa/popqa/test.jsonl")):
        for p in row.get("paragraphs", []):
            yield _passage(p["title"], p["text"])


def _key(p: dict[str, str]) -> int:
    """An 8-byte hash of the normalised (title, text): dedupes 21M passages in ~2 GB, not ~15."""
    norm = p["title"].lower() + "\x00" + re.sub(r"\s+", " ", p["text"]).lower()
    return int.from_bytes(hashlib.blake2b(norm.encode("utf-8"), digest_size=8).digest(), "little")


def collection_docs(passages: Iterable[dict[str, str]], dedupe: bool = True) -> Iterator[dict[str, str]]:
    """Passages as stored documents ``{"id", "contents", "title", "text"}``: empty texts skipped, repeats
    dropped when ``dedupe``, ids from the passage or its number. The BM25 and dense builders both number
    passages here, so the two indexes of one corpus share ids (what hybrid search fuses on)."""
    seen: set[int] = set()
    n = 0
    for p in passages:
        if not p["text"]:
            continue
        if dedupe:
            key = _key(p)
            if key in seen:
                continue
            seen.add(key)
        yield {"id": p.get("id") or str(n), "contents": f"\"{p['title']}\"\n{p['text']}",
               "title": p["title"], "text": p["text"]}
        n += 1


def write_collection(passages: Iterable[dict[str, str]], out_dir: str | os.PathLike, dedupe: bool = True,
                     shard_size: int = 1_000_000, progress: bool = False) -> int:
    """Write passages as JsonCollection shards in ``out_dir``; returns the passage count."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n, fh = 0, None
    try:
        for doc in collection_docs(tqdm(passages, disable=not progress, unit="psg", desc="passages"), dedupe):
            if n % shard_size == 0:
                if fh:
                    fh.close()
                fh = (out / f"docs{n // shard_size:05d}.jsonl").open("w", encoding="utf-8")
            fh.write(json.dumps(doc, ensure_ascii=False) + "\n")
            n += 1
    finally:
        if fh:
            fh.close()
    return n


def read_user_passages(path: str | os.PathLike, refuse_empty: bool = False) -> Iterator[dict[str, str]]:
    """User JSONL passages: ``{"id", "contents"}`` (DPR wiki-18 / FlashRAG) or ``{"id", "title", "text"}``.
    ``refuse_empty``: a passage with no text is a ValueError naming its line (else the builder skips it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"passage file not found: {path}")
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
            if "title" in row and "text" in row:
                p = _passage(str(row["title"]), str(row["text"]))
            elif "contents" in row:
                contents = str(row["contents"])
                title, text = split_contents(contents)
                p = _passage(title, text) if text else _passage("", contents.partition("\n")[0])
            else:
                raise ValueError(f"{path}:{n}: a passage needs 'contents' or 'title' and 'text'")
            if refuse_empty and not p["text"]:
                raise ValueError(f"{path}:{n}: empty passage (no text to encode)")
            p["id"] = str(row.get("id", n))
            yield p


def default_index_dir(build: bool = True, threads: int = 2) -> Path:
    """The BM25 index of the embedded corpus, built once per machine (a file lock guards it)."""
    root = cache_root() / "indexes"
    index = root / "default-bm25-v1"
    if (index / "segments_1").exists() or list(index.glob("segments_*")):
        return index
    if not build:
        raise FileNotFoundError(f"default index not built yet: {index} (run `turngym index build --default`)")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".default.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if list(index.glob("segments_*")):
            return index
        collection = root / "default-collection"
        write_collection(default_passages(), collection)
        build_index(collection, index, threads=threads)
    return index
