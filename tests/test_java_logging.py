"""The JVM behind Lucene search prints none of Java's notes that carry nothing for the user (SLF4J's
provider line, Lucene's "please update Apache Lucene"), while a real Java warning still reaches stderr."""

import json
import subprocess
import sys

PASSAGES = [
    {"id": "p1", "title": "Paris", "text": "Paris is the capital and most populous city of France."},
    {"id": "p2", "title": "Berlin", "text": "Berlin is the capital of Germany."},
]

SEARCH = """
import sys
from turngym.corpora.lucene import LuceneRetriever, jvm
print(LuceneRetriever(sys.argv[1]).search("capital of France", 1)[0].docid)
jvm().autoclass("java.util.logging.Logger").getLogger("turngym.test").warning("a real Java warning stays visible")
"""

BUILD_AND_SEARCH = """
import sys
from pathlib import Path
from turngym.corpora.corpus import read_user_passages, write_collection
from turngym.corpora.lucene import LuceneRetriever, build_index
root = Path(sys.argv[1])
write_collection(read_user_passages(root / "passages.jsonl"), root / "collection")
build_index(root / "collection", root / "index", threads=1)
print(LuceneRetriever(root / "index").search("capital of France", 1)[0].docid)
"""


def _run(code, arg):
    proc = subprocess.run([sys.executable, "-c", code, str(arg)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["p1"]
    return proc.stderr


def test_search_prints_no_slf4j_or_lucene_notes_but_keeps_java_warnings(lucene_index):
    err = _run(SEARCH, lucene_index(PASSAGES))
    assert "SLF4J" not in err and "MMapDirectory" not in err and "update Apache Lucene" not in err, err
    assert "a real Java warning stays visible" in err  # java.util.logging WARNING still prints


def test_index_build_then_search_prints_no_slf4j_line(tmp_path):
    (tmp_path / "passages.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    err = _run(BUILD_AND_SEARCH, tmp_path)
    assert "SLF4J" not in err and "WARNING" not in err, err
