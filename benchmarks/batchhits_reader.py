"""Is BatchHits' Java JSON reader worth keeping? Document fetch throughput, three arms side by side:

- ``reader``: turngym's ``BatchHits`` as shipped (its Java reader answers each stored document, Python
  parses only what it hands back);
- ``no-reader``: the same class with the reader switched off (compiled from the same source under its
  own package name, every stored document handed back and parsed by Python's ``parse_raw``);
- ``anserini``: Anserini's own path, what a Pyserini user writes: ``SimpleSearcher.batch_search`` (the
  searcher ``LuceneSearcher`` wraps), then each hit's docid, score and stored document read into Python
  and ``json.loads``-ed into title and text.

The two BatchHits arms go through the same Python code (``decode_hits`` over streamed chunks, as
``LuceneRetriever.batch_search``) and must give the same hits. One process, one JVM, warm-up batches
first, then every repeat runs the arms in a fresh random order; each arm's figure is printed as soon as
it is measured, the summary gives medians (queries per second by wall time, CPU ms per batch by process
CPU time, Python and every JVM thread). The rule the reader is judged by (issue 29): keep it only if
``reader`` beats ``no-reader`` by more than 0.05x of ``anserini``'s throughput.

Usage: python benchmarks/batchhits_reader.py [--index DIR] [--queries 2000] [--threads 2] [--repeats 9]
(default index: the embedded default corpus's, built on first use by ``turngym index build --default``).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from turngym.corpora.datasets import load_dataset
from turngym.corpora.java_helper import SOURCE, compile_helper
from turngym.corpora.lucene import (
    QUIET_JVM_OPTIONS,
    Hit,
    SentDocs,
    anserini_jar,
    decode_hits,
    java_home,
    split_contents,
    stream_chunk,
)

VARIANT_PACKAGE = "turngymbench.noreader"
READER_CALL = "Doc parsed = RawDoc.parse(raw);"


def compile_without_reader(out: Path) -> None:
    """BatchHits.java with ``Row.read`` handing every stored document back to Python, as its own package."""
    src = SOURCE.read_text(encoding="utf-8")
    if src.count(READER_CALL) != 1 or src.count("package turngym.lucene;") != 1:
        raise SystemExit(f"BatchHits.java no longer has one {READER_CALL!r}; update this benchmark")
    variant = src.replace("package turngym.lucene;", f"package {VARIANT_PACKAGE};").replace(
        READER_CALL, "Doc parsed = null;  // benchmark variant: Python parses every stored document")
    (out / "BatchHits.java").write_text(variant, encoding="utf-8")
    javac = shutil.which("javac")
    if javac is None:
        raise SystemExit("no javac on PATH: install a JDK to build the BatchHits variants")
    subprocess.run([javac, "--release", "11", "-encoding", "UTF-8", "-nowarn", "-d", str(out), str(out / "BatchHits.java")],
                   check=True)


def start_jvm(*classpath: str):
    """The JVM with Anserini and both BatchHits builds on its class path (turngym's ``jvm()`` takes one)."""
    os.environ["JAVA_HOME"] = java_home()
    import jnius_config

    faulthandler.enable()  # before the JVM, so the JVM's own signal handler goes on top (see lucene.py)
    jnius_config.add_options("-Xms256m", "-Xmx4g", "-Dlog4j2.level=WARN", "--enable-native-access=ALL-UNNAMED",
                             "--sun-misc-unsafe-memory-access=allow", *QUIET_JVM_OPTIONS)
    jnius_config.set_classpath(anserini_jar(), *classpath)
    import jnius

    return jnius


def streamed(cls, searcher, queries: list[str], k: int, threads: int) -> list[list[Hit]]:
    """``LuceneRetriever.batch_search``'s path through one BatchHits build."""
    chunk = stream_chunk(len(queries))
    out: list[list[Hit]] = []
    docs = SentDocs()
    pending = cls.start(searcher, queries, k, threads, chunk)
    try:
        for lo in range(0, len(queries), chunk):
            out.extend(decode_hits(pending.next(), min(chunk, len(queries) - lo), docs))
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
    args = ap.parse_args()
    if args.index is None:
        from turngym.corpora.corpus import default_index_dir

        args.index = str(default_index_dir())
        if not Path(args.index).is_dir():
            raise SystemExit(f"no index at {args.index}: build it with `turngym index build --default --out {args.index}`")
    shipped = compile_helper()
    if shipped.classpath is None:
        raise SystemExit(f"BatchHits not built: {shipped.reason}")
    variant_dir = Path(tempfile.mkdtemp(prefix="batchhits-noreader-"))
    compile_without_reader(variant_dir)
    jnius = start_jvm(shipped.classpath, str(variant_dir))
    searcher = jnius.autoclass("io.anserini.search.SimpleSearcher")(args.index)
    searcher.set_bm25(0.9, 0.4)
    with_reader = jnius.autoclass("turngym.lucene.BatchHits")
    without = jnius.autoclass(f"{VARIANT_PACKAGE}.BatchHits")

    queries = [" ".join(it["question"].split()) for it in load_dataset("nq").items[: args.queries]]
    jlist = jnius.autoclass("java.util.ArrayList")
    jq, jid = jlist(), jlist()
    for i, q in enumerate(queries):
        jq.add(q)
        jid.add(str(i))
    k, n = 3, len(queries)
    arms = {"reader": lambda: streamed(with_reader, searcher, queries, k, args.threads),
            "no-reader": lambda: streamed(without, searcher, queries, k, args.threads),
            "anserini": lambda: anserini_hits(searcher, jq, jid, n, k, args.threads)}
    results = {name: fn() for name, fn in arms.items()}
    as_rows = {name: [[(h.docid, h.score, h.title, h.text) for h in hits] for hits in r] for name, r in results.items()}
    if not as_rows["reader"] == as_rows["no-reader"] == as_rows["anserini"]:
        raise SystemExit("the arms disagree on the hits; the comparison would be meaningless")
    hits = sum(map(len, results["reader"]))
    print(f"{n} NQ queries, top-{k}, {args.threads} threads: {hits} hits, "
          f"{len({h.docid for r in results['reader'] for h in r})} distinct passages; the three arms agree", flush=True)
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
    def gains(times: dict[str, list[float]]) -> list[float]:  # per repeat, in units of anserini's throughput
        return [(n / r - n / o) / (n / a) for r, o, a in zip(times["reader"], times["no-reader"], times["anserini"],
                                                             strict=True)]

    gain = (qps["reader"] - qps["no-reader"]) / qps["anserini"]
    gain_cpu = (n / cpu_ms["reader"] - n / cpu_ms["no-reader"]) / (n / cpu_ms["anserini"])
    for what, total, per_rep in (("wall", gain, gains(wall)), ("CPU", gain_cpu, gains(cpu))):
        print(f"reader minus no-reader, {what}, in units of anserini's throughput: {total:+.3f} from the medians; "
              f"per repeat median {statistics.median(per_rep):+.3f} (" + ", ".join(f"{g:+.3f}" for g in per_rep) + ")")
    print("rule (keep the reader only where it gains more than +0.05):",
          {True: "keep", False: "drop"}[gain > 0.05], "by wall,", {True: "keep", False: "drop"}[gain_cpu > 0.05], "by CPU")
    shutil.rmtree(variant_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
