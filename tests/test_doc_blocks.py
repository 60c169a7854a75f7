"""The README's and docs' ``bash`` and ``python`` blocks run as written (after the set-up command), so the
pages cannot drift from the code. A block is run in a fresh folder (with the repository's ``configs``,
``benchmarks`` and ``tests``), with this interpreter's ``turngym`` on PATH. Blocks are tagged by an HTML
comment on the line before the fence: ``<!-- block: slow -->`` runs under the ``slow`` marker;
``<!-- block: long (reason) -->`` takes longer than a CI run affords on 2 cores (a model-scored benchmark, a
training run, a whole BFCL category) and runs only when asked, ``pytest -m long``;
``<!-- block: skip (reason) -->`` cannot run here, for the reason given (``SKIP_REASONS``: a GPU, the network
beyond PyPI, a hub id, a second environment, packages installed into the running one, the test suite itself).
A block that needs a server starts it in the background and stops it on exit. Untagged blocks are fast and
run in every test run.

A block may go on from another of its page: a reason holding ``after "CODE"`` runs the block in the folder of
the page's block whose code starts with CODE (the nearest above, else the first below; run first if this session
has not run it), and one holding ``in the checkout`` runs in the repository itself (a block that builds or
uses the checkout's own environments, ``scripts/*.sh``). A skip is for what cannot be done here at all, and
there are fewer than 15."""

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
AFTER = re.compile(r'after "([^"]+)"')
IN_CHECKOUT = "in the checkout"
RANK = {None: 0, "slow": 1, "long": 2, "skip": 3}
MAX_SKIPS = 14  # issue #53: fewer than 15 blocks that cannot run here
# what a skip's reason must name: something this machine cannot give (a GPU, a non-PyPI network, a second
# environment), packages installed into the running one, or the test suite that runs this test
SKIP_REASONS = ("GPU", "network", "hub", "installs packages", "test suite", "own environment")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    tag: str | None      # None (fast), "slow", "long" or "skip"
    reason: str

    @property
    def after(self) -> str | None:
        """The start of the earlier block on the page this one goes on from, if any."""
        m = AFTER.search(self.reason)
        return m.group(1) if m else None

    @property
    def in_checkout(self) -> bool:
        return IN_CHECKOUT in self.reason


def blocks(path: Path) -> list[Block]:
    return _blocks_at(path, str(path.relative_to(ROOT)))


def _blocks_at(path: Path, page: str | None = None) -> list[Block]:
    page = page or path.name
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for tok in MarkdownIt("commonmark").parse("\n".join(lines)):
        language = tok.info.strip().split(" ")[0] if tok.type == "fence" else ""
        if language not in LANGUAGES:
            continue
        before = next((lines[n].strip() for n in range(tok.map[0] - 1, -1, -1) if lines[n].strip()), "")
        m = TAG.fullmatch(before)
        found.append(Block(page, tok.map[0] + 1, language, tok.content,
                           m.group(1) if m else None, (m.group(2) or "") if m else ""))
    return found


ALL = [b for page in PAGES if page.exists() for b in blocks(page)]


def _param(block: Block):
    marks = {"slow": [pytest.mark.slow], "long": [pytest.mark.slow, pytest.mark.long]}.get(block.tag or "", [])
    return pytest.param(block, id=f"{block.page}:{block.line}", marks=marks)


def test_blocks_are_found_and_every_skip_says_why():
    assert any(b.page == "README.md" and b.tag is None and b.language == "python" for b in ALL)
    assert [f"{b.page}:{b.line}" for b in ALL if b.tag in ("skip", "long") and not b.reason] == []


def test_skips_are_few_and_each_names_what_is_impossible_here():
    skips = [b for b in ALL if b.tag == "skip"]
    assert len(skips) <= MAX_SKIPS, [f"{b.page}:{b.line}" for b in skips]
    assert [f"{b.page}:{b.line} ({b.reason})" for b in skips if not any(r in b.reason for r in SKIP_REASONS)] == []


def test_every_after_names_an_earlier_block_of_its_page_that_runs():
    bad = []
    for b in ALL:
        if b.after is None:
            continue
        before = _prerequisite(b)
        if before is None or before.tag == "skip" or RANK[before.tag] > RANK[b.tag]:  # a fast block never waits on a long one
            bad.append(f"{b.page}:{b.line} after {b.after!r}")
    assert bad == []


def test_the_after_reader_finds_the_last_earlier_match(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('<!-- block: long (x) -->\n```bash\necho one\n```\n\n```bash\necho one two\n```\n\n'
                    '<!-- block: long (y; after "echo one") -->\n```bash\ncat out\n```\n')
    found = _blocks_at(page)
    assert found[2].after == "echo one" and _prerequisite(found[2], found) == found[1]
    assert _prerequisite(found[1], found) is None and not found[2].in_checkout
    ahead = Block("page.md", 1, "bash", "cat out\n", "long", 'z; after "echo one two"')
    assert _prerequisite(ahead, found) == found[1]   # a block further down the page
    assert _prerequisite(Block("page.md", 1, "bash", "x", "long", 'after "nothing"'), found) is None


def test_the_tag_parser_reads_tags_and_fences():
    page = ROOT / "README.md"
    tagged = [b for b in blocks(page) if b.tag]
    assert {b.tag for b in tagged} <= {"slow", "long", "skip"} and any(b.code.startswith("bash scripts/main.sh") for b in tagged)


def _prerequisite(block: Block, among: list[Block] | None = None) -> Block | None:
    """The block of ``block``'s page whose code starts with its ``after "..."`` text: the nearest one above it,
    else the first one below (a page may point ahead: "the main job, further down")."""
    if block.after is None:
        return None
    page = [b for b in (among if among is not None else ALL) if b.page == block.page and b.line != block.line]
    match = [b for b in page if b.code.lstrip().startswith(block.after)]
    above = [b for b in match if b.line < block.line]
    return above[-1] if above else next(iter(match), None)


_FOLDERS: dict[tuple[str, int], Path] = {}  # the folder each block ran in this session, for the blocks after it


def _run(block: Block, tmp_path_factory, chain: tuple[tuple[str, int], ...] = ()) -> None:
    key = (block.page, block.line)
    if key in _FOLDERS:  # already run this session, as another block's prerequisite
        return
    assert key not in chain, f"{block.page}:{block.line}: its after \"...\" chain comes back to it"
    before = _prerequisite(block)
    if block.after is not None:
        assert before is not None, f"{block.page}:{block.line}: no block of its page starts with {block.after!r}"
        _run(before, tmp_path_factory, (*chain, key))
        folder = _FOLDERS[(before.page, before.line)]
    elif block.in_checkout:
        folder = ROOT
    else:
        folder = tmp_path_factory.mktemp("block")
        for shared in ("configs", "benchmarks", "tests"):  # what blocks name by relative path; everything else they make
            (folder / shared).symlink_to(ROOT / shared)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if block.language == "python":
        command = [sys.executable, "-c", block.code]
    else:
        command = ["bash", "-euo", "pipefail", "-c", block.code]
    proc = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=3 * 3600)
    assert proc.returncode == 0, (f"{block.page}:{block.line} failed (exit {proc.returncode}):\n{block.code}\n"
                                  f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
    _FOLDERS[(block.page, block.line)] = folder


@pytest.mark.parametrize("block", [_param(b) for b in ALL if b.tag != "skip"])
def test_block_runs_as_written(block: Block, tmp_path_factory):
    _run(block, tmp_path_factory)
