"""``turngym index build|search`` and ``turngym serve-retriever``: BM25 and dense indexes and the retrieval service."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from turngym.cli._common import attempt, fail, port

COMMANDS = ("index", "serve-retriever")


def add_parser(sub: Any) -> None:
    index = sub.add_parser("index", help="build or query a BM25 (Lucene) or dense (FAISS) index")
    index = index.add_subparsers(dest="index_command", required=True)
    ib = index.add_parser("build", help="index the embedded corpus (--default) or JSONL passage files")
    src = ib.add_mutually_exclusive_group(required=True)
    src.add_argument("--default", action="store_true", help="the embedded Wikipedia + dataset-context corpus")
    src.add_argument("--input", nargs="+", help='JSONL passages: {"id","contents"} or {"id","title","text"}')
    ib.add_argument("--out", required=True, help="index directory to write")
    ib.add_argument("--threads", type=int, default=2, help="indexing threads")
    ib.add_argument("--no-dedupe", action="store_true", help="keep passages whose text repeats")
    ib.add_argument("--dense", action="store_true", help="a dense FAISS index (passage vectors) instead of BM25")
    ib.add_argument("--encoder", default="all-MiniLM-L6-v2",
                    help="--dense: encoder name (all-MiniLM-L6-v2, e5-base-v2, ...), hub id or model directory")
    ib.add_argument("--index-type", default="auto", choices=("auto", "flat", "hnsw", "ivf"),
                    help="--dense: FAISS index (auto: flat up to 1M passages, HNSW above)")
    ib.add_argument("--batch-size", type=int, default=64, help="--dense: passages per encoder batch")
    ib.add_argument("--shard-size", type=int, default=4096,
                    help="--dense: passages per saved shard of vectors (an interrupted build resumes from these)")
    ib.set_defaults(run=run)
    isr = index.add_parser("search", help="top-k hits for a query")
    isr.add_argument("query", help="the query text")
    isr.add_argument("--index", default="default",
                     help="index directory, dense:PATH, hybrid:BM25_PATH,DENSE_PATH, server URL, or 'default'")
    isr.add_argument("-k", type=int, default=3, help="hits to show")
    isr.set_defaults(run=run)

    srv = sub.add_parser("serve-retriever", help="serve an index over HTTP (Search-R1 /retrieve)")
    srv.add_argument("--index", default="default",
                     help="index directory, dense:PATH, hybrid:BM25_PATH,DENSE_PATH, or 'default' (BM25)")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on")
    srv.add_argument("--port", type=port, default=8000, help="TCP port (0: any free port)")
    srv.add_argument("--threads", type=int, default=2, help="search threads")
    srv.add_argument("--max-hits", type=int, default=50_000, help="cap on queries x topk per request (413 above)")
    srv.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.command == "serve-retriever":
        return _serve(args)
    return _build(args) if args.index_command == "build" else _search(args)


def _build(args: argparse.Namespace) -> int:
    from turngym.corpora.corpus import default_passages, read_user_passages, write_collection
    from turngym.corpora.lucene import RetrieverError, build_index

    if args.dense:
        return _build_dense(args)
    out = Path(args.out)
    collection = out.parent / f"{out.name}.collection"
    errors = (FileNotFoundError, ValueError, RetrieverError)

    def collect() -> int:
        sources = default_passages() if args.default else (p for f in args.input for p in read_user_passages(f))
        return write_collection(sources, collection, dedupe=not args.no_dedupe, progress=True)

    n = attempt(collect, *errors)
    print(f"{n} passages written to {collection}; indexing with {args.threads} threads ...", flush=True)
    seconds = attempt(lambda: build_index(collection, out, threads=args.threads), *errors)
    print(f"index built in {seconds:.1f} s: {out}")
    return 0


def _build_dense(args: argparse.Namespace) -> int:
    from turngym.corpora.corpus import default_passages, read_user_passages
    from turngym.corpora.lucene import RetrieverError
    from turngym.extras import MissingExtra

    if args.batch_size < 1 or args.shard_size < 1:
        fail("--batch-size and --shard-size must be >= 1")

    def build() -> dict:
        from turngym.corpora.dense import build_dense_index

        sources = default_passages() if args.default else (p for f in args.input for p in read_user_passages(f, True))
        return build_dense_index(sources, args.out, encoder=args.encoder, index_type=args.index_type,
                                 batch_size=args.batch_size, shard_size=args.shard_size, dedupe=not args.no_dedupe,
                                 progress=True)

    m = attempt(build, FileNotFoundError, ValueError, RetrieverError, MissingExtra, OSError)
    rate = m["encoded"] / m["encode_seconds"] if m["encode_seconds"] else 0.0
    resumed = f", {m['resumed']} resumed from an earlier run" if m["resumed"] else ""
    print(f"dense index built in {m['seconds']:.1f} s: {args.out} ({m['count']} passages{resumed}, "
          f"{m['encoder']['name']}, dim {m['dim']}, {m['index_type']}; encoding {rate:.0f} passages/s)")
    return 0


def _search(args: argparse.Namespace) -> int:
    from turngym.corpora.lucene import RetrieverError
    from turngym.corpora.service import make_retriever
    from turngym.extras import MissingExtra

    hits = attempt(lambda: make_retriever(args.index).search(args.query, args.k),
                   FileNotFoundError, ValueError, RetrieverError, MissingExtra)
    for rank, h in enumerate(hits, start=1):
        print(f"{rank:2d}  {h.score:8.3f}  {h.docid}  {h.title}: {h.text[:160]}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from turngym.corpora.corpus import default_index_dir
    from turngym.corpora.lucene import RetrieverError
    from turngym.corpora.service import RetrievalServer

    index = str(default_index_dir()) if args.index == "default" else args.index
    from turngym.extras import MissingExtra

    server = attempt(lambda: RetrievalServer(index, host=args.host, port=args.port, threads=args.threads,
                                             max_hits=args.max_hits), RetrieverError, OSError, ValueError, MissingExtra)
    print(f"serving {index} on http://{args.host}:{server.server_address[1]}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0
