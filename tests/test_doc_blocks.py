"""The README's and docs' ``bash`` and ``python`` blocks run as written (after the set-up command), so the
pages cannot drift from the code. A block is run in a fresh folder (with the repository's ``configs`` and
``benchmarks``), with this interpreter's ``turngym`` on PATH. Blocks are tagged by an HTML comment on the line before the
fence: ``<!-- block: slow -->`` runs under the ``slow`` marker; ``<!-- block: long (reason) -->`` takes longer
than a CI run affords on 2 cores (a model-scored benchmark, a training run, a whole BFCL category) and runs
only when asked, ``pytest -m long``; ``<!-- block: skip (reason) -->`` cannot run
here, for the reason given (a GPU, the network, a placeholder for the reader's own model or files, the test
suite itself). A block that needs a server starts it in the background and stops it on exit.
Untagged blocks are fast and run in every test run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
TAG = re.compile(r"<!--\s*block:\s*(slow|long|skip)\s*(?:\((.+)\))?\s*-->")
LANGUAGES = {"bash", "sh", "python"}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    tag: str | None      # None (fast), "slow", "long" or "skip"
    reason: str


def blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for tok in MarkdownIt("commonmark").parse("\n".join(lines)):
        language = tok.info.strip().split(" ")[0] if tok.type == "fence" else ""
        if language not in LANGUAGES:
            continue
        before = next((lines[n].strip() for n in range(tok.map[0] - 1, -1, -1) if lines[n].strip()), "")
        m = TAG.fullmatch(before)
        found.append(Block(str(path.relative_to(ROOT)), tok.map[0] + 1, language, tok.content,
                           m.group(1) if m else None, (m.group(2) or "") if m else ""))
    return found


ALL = [b for page in PAGES if page.exists() for b in blocks(page)]


def _param(block: Block):
    marks = {"slow": [pytest.mark.slow], "long": [pytest.mark.slow, pytest.mark.long]}.get(block.tag or "", [])
    return pytest.param(block, id=f"{block.page}:{block.line}", marks=marks)


def test_blocks_are_found_and_every_skip_says_why():
    assert any(b.page == "README.md" and b.tag is None and b.language == "python" for b in ALL)
    assert [f"{b.page}:{b.line}" for b in ALL if b.tag in ("skip", "long") and not b.reason] == []


def test_the_tag_parser_reads_tags_and_fences():
    page = ROOT / "README.md"
    tagged = [b for b in blocks(page) if b.tag]
    assert {b.tag for b in tagged} <= {"slow", "long", "skip"} and any(b.code.startswith("bash scripts/main.sh") for b in tagged)


@pytest.mark.parametrize("block", [_param(b) for b in ALL if b.tag != "skip"])
def test_block_runs_as_written(block: Block, tmp_path: Path):
    for shared in ("configs", "benchmarks"):  # what blocks name by relative path; everything else they make
        (tmp_path / shared).symlink_to(ROOT / shared)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if block.language == "python":
        command = [sys.executable, "-c", block.code]
    else:
        command = ["bash", "-euo", "pipefail", "-c", block.code]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, (f"{block.page}:{block.line} failed (exit {proc.returncode}):\n{block.code}\n"
                                  f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
