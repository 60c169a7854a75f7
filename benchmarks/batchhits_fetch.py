"""Document fetch throughput of turngym's ``BatchHits`` against Anserini's own path, side by side:

- ``batchhits``: ``LuceneRetriever.batch_search``'s path (``BatchHits`` searches on its worker threads and
  hands each chunk's hits and stored documents over as one string; Python's ``parse_raw`` reads them);
- ``anserini``: what a Pyserini user writes: ``SimpleSearcher.batch_search`` (the searcher
  ``LuceneSearcher`` wraps), then each hit's docid, score and stored document read into Python and
  ``json.loads``-ed into title and text;
- with ``--reader-source FILE``: also ``reader`` and ``no-reader``, a BatchHits source from before its
  Java JSON reader was dropped (``git show aeacb37:turngym/corpora/java/BatchHits.java``), compiled as it
  was and with the reader switched off (every stored document handed back to Python). Their chunks are
  decoded by ``legacy_decode``, that version's decoder. This is the comparison that dropped the reader
  (issue 29: keep it only if ``reader`` beats ``no-reader`` by more than 0.05x of ``anserini``).

All arms must give the same hits. One process, one JVM, warm-up batches first, then every repeat runs
the arms in a fresh random order; each arm's figure is printed as soon as it is measured, the summary
gives medians (queries per second by wall time, CPU ms per batch by process CPU time, Python and every
JVM thread).

Usage: python benchmarks/batchhits_fetch.py [--index DIR] [--queries 2000] [--threads 2] [--repeats 9]
       [--reader-source FILE]
(default index: the embedded default corpus's, built by ``turngym index build --default``).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from turngym.corpora.datasets import load_dataset
from turngym.corpora.java_helper import compile_helper
from turngym.corpora.lucene import (
    QUIET_JVM_OPTIONS,
    Hit,
    SentDocs,
    anserini_jar,
    decode_hits,
    java_home,
    parse_raw,
    split_contents,
    stream_chunk,
)

READER_CALL = "Doc parsed = RawDoc.parse(raw);"
SEP, ESC = "\x01", "\x02"  # BatchHits' field separator and escape character
ESCAPED = re.compile("\x02([\x02\x03])")


def compile_legacy(source: Path, out: Path) -> None:
    """The reader-era BatchHits twice, each under its own package: as it was, and with ``Row.read``
    handing every stored document back to Python."""
    src = source.read_text(encoding="utf-8")
    if src.count(READER_CALL) != 1 or src.count("package turngym.lucene;") != 1:
        raise SystemExit(f"{source} is not a BatchHits.java with its Java JSON reader (no {READER_CALL!r})")
    variants = {"reader": src, "noreader": src.replace(
        READER_CALL, "Doc parsed = null;  // benchmark variant: Python parses every stored document")}
    javac = shutil.which("javac")
    if javac is None:
        raise SystemExit("no javac on PATH: install a JDK to build the BatchHits variants")
    for name, text in variants.items():
        folder = out / name
        folder.mkdir()
        (folder / "BatchHits.java").write_text(text.replace("package turngym.lucene;", f"package turngymbench.{name};"),
                                               encoding="utf-8")
        subprocess.run([javac, "--release", "11", "-encoding", "UTF-8", "-nowarn", "-d", str(out),
                        str(folder / "BatchHits.java")], check=True)


def legacy_decode(encoded: str, n_queries: int, docs: SentDocs) -> list[list[Hit]]:
    """The reader-era chunk decoder: D docids, D titles, D texts, then the documents left to Python."""
    fields = encoded.split(SEP)
    counts = [int(c) for c in fields[1:n_queries + 1]]
    n, p = sum(counts), n_queries + 1
    new = (len(fields) - p - 2 * n - 1) // 3
    first, q = len(docs.titles), p + 2 * n
    sent = fields[q:q + 3 * new]
    if fields[0] == ESC:
        sent = [ESCAPED.sub(lambda m: ESC if m.group(1) == ESC else SEP, f) for f in sent]
    docs.docids += sent[:new]
    docs.titles += sent[new:2 * new]
    docs.texts += sent[2 * new:]
    if fields[-1]:
        for i in map(int, fields[-1].split(",")):
            raw_id, docs.titles[i], docs.texts[i] = parse_raw(docs.titles[i])
            if raw_id is not None:
                docs.docids[i] = raw_id
    numbers = list(map(int, fields[p + n:q]))
    assert not numbers or max(numbers) < first + new
    hits = [Hit(docs.docids[d], float(s), docs.titles[d], docs.texts[d]) for d, s in zip(numbers, fields[p:p + n],
                                                                                       strict=True)]
    out, at = [], 0
    for c in counts:
        out.append(hits[at:at + c])
        at += c
    return out


def start_jvm(*classpath: str):
    """The JVM with Anserini and every BatchHits build on its class path (turngym's ``jvm()`` takes one)."""
    os.environ["JAVA_HOME"] = java_home()
    import jnius_config

    faulthandler.enable()  # before the JVM, so the JVM's own signal handler goes on top (see lucene.py)
    jnius_config.add_options("-Xms256m", "-Xmx4g", "-Dlog4j2.level=WARN", "--enable-native-access=ALL-UNNAMED",
                             "--sun-misc-unsafe-memory-access=allow", *QUIET_JVM_OPTIONS)
    jnius_config.set_classpath(anserini_jar(), *classpath)
    import jnius

    return jnius


def streamed(cls, decode, searcher, queries: list[str], k: int, threads: int) -> list[list[Hit]]:
    """``LuceneRetriever.batch_search``'s path through one BatchHits build and its decoder."""
    chunk = stream_chunk(len(queries))
    out: list[list[Hit]] = []
    docs = SentDocs()
    pending = cls.start(searcher, queries, k, threads, chunk)
    try:
        for lo in range(0, len(queries), chunk):
            out.extend(decode(pending.next(), min(chunk, len(queries) - lo), docs))
    finally:
        pending.close()
    return out


def anserini_hits(searcher, jq, jid, n: int, k: int, threads: int) -> list[list[Hit]]:
    """Anserini's batch search, then each hit's stored document read and parsed in Python."""
    res = searcher.batch_search(jq, jid, k, threads)
    out = []
    for i in range(n):
        hits = []
        for h in res.get(str(i)) or ():
            doc = json.loads(h.lucene_document.get("raw"))
            if "title" in doc and "text" in doc:
                title, text = str(doc["title"]), str(doc["text"])
            else:
                title, text = split_contents(str(doc.get("contents", "")))
            hits.append(Hit(str(doc.get("id", h.docid)), float(h.score), title, text))
        out.append(hits)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--index", default=None, help="a Lucene index with stored raw documents (default: the default corpus's)")
    ap.add_argument("--queries", type=int, default=2000, help="NQ-open test questions, top-3 each")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--reader-source", default=None, type=Path,
                    help="a BatchHits.java from before the Java JSON reader was dropped: adds the reader arms")
    args = ap.parse_args()
    if args.index is None:
        from turngym.corpora.corpus import default_index_dir

        args.index = str(default_index_dir())
        if not Path(args.index).is_dir():
            raise SystemExit(f"no index at {args.index}: build it with `turngym index build --default --out {args.index}`")
    shipped = compile_helper()
    if shipped.classpath is None:
        raise SystemExit(f"BatchHits not built: {shipped.reason}")
    legacy_dir = Path(tempfile.mkdtemp(prefix="batchhits-legacy-"))
    if args.reader_source:
        compile_legacy(args.reader_source, legacy_dir)
    jnius = start_jvm(shipped.classpath, str(legacy_dir))
    searcher = jnius.autoclass("io.anserini.search.SimpleSearcher")(args.index)
    searcher.set_bm25(0.9, 0.4)

    queries = [" ".join(it["question"].split()) for it in load_dataset("nq").items[: args.queries]]
    jlist = jnius.autoclass("java.util.ArrayList")
    jq, jid = jlist(), jlist()
    for i, q in enumerate(queries):
        jq.add(q)
        jid.add(str(i))
    k, n = 3, len(queries)
    batch_hits = jnius.autoclass("turngym.lucene.BatchHits")
    arms = {"batchhits": lambda: streamed(batch_hits, decode_hits, searcher, queries, k, args.threads),
            "anserini": lambda: anserini_hits(searcher, jq, jid, n, k, args.threads)}
    if args.reader_source:
        for name, package in (("reader", "reader"), ("no-reader", "noreader")):
            cls = jnius.autoclass(f"turngymbench.{package}.BatchHits")
            arms[name] = lambda cls=cls: streamed(cls, legacy_decode, searcher, queries, k, args.threads)
    results = {name: [[(h.docid, h.score, h.title, h.text) for h in hits] for hits in fn()] for name, fn in arms.items()}
    if any(r != results["anserini"] for r in results.values()):
        raise SystemExit("the arms disagree on the hits; the comparison would be meaningless")
    print(f"{n} NQ queries, top-{k}, {args.threads} threads: {sum(map(len, results['anserini']))} hits, "
          f"{len({h[0] for r in results['anserini'] for h in r})} distinct passages; the arms agree", flush=True)
    for _ in range(2):  # warm-up: the JIT compiles every path
        for fn in arms.values():
            fn()
    wall: dict[str, list[float]] = {name: [] for name in arms}
    cpu: dict[str, list[float]] = {name: [] for name in arms}
    order = random.Random(0)
    for rep in range(args.repeats):
        names = list(arms)
        order.shuffle(names)
        for name in names:
            t, c = time.perf_counter(), time.process_time()
            arms[name]()
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
            print(f"repeat {rep + 1}/{args.repeats} {name:9s} {n / wall[name][-1]:6.0f} q/s, "
                  f"CPU {cpu[name][-1] * 1e3:5.0f} ms", flush=True)
    qps = {name: n / statistics.median(v) for name, v in wall.items()}
    cpu_ms = {name: statistics.median(v) * 1e3 for name, v in cpu.items()}
    print("\nmedians of", args.repeats, "repeats:")
    for name in arms:
        print(f"  {name:9s} {qps[name]:6.0f} q/s ({qps[name] / qps['anserini']:.3f}x anserini), "
              f"CPU {cpu_ms[name]:5.0f} ms per batch ({cpu_ms['anserini'] / cpu_ms[name]:.3f}x anserini by CPU)")
    if args.reader_source:
        def gains(times: dict[str, list[float]]) -> list[float]:  # per repeat, in units of anserini's throughput
            return [(n / r - n / o) / (n / a) for r, o, a in zip(times["reader"], times["no-reader"], times["anserini"],
                                                                 strict=True)]

        gain = (qps["reader"] - qps["no-reader"]) / qps["anserini"]
        gain_cpu = (n / cpu_ms["reader"] - n / cpu_ms["no-reader"]) / (n / cpu_ms["anserini"])
        for what, total, per_rep in (("wall", gain, gains(wall)), ("CPU", gain_cpu, gains(cpu))):
            print(f"reader minus no-reader, {what}, in units of anserini's throughput: {total:+.3f} from the medians; "
                  f"per repeat median {statistics.median(per_rep):+.3f} (" + ", ".join(f"{g:+.3f}" for g in per_rep) + ")")
    shutil.rmtree(legacy_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
