"""README.md and docs/*.md rendered by a real Markdown parser (markdown-it-py, CommonMark with tables):
every code fence closed, every heading line a heading, every relative link and image inside the repository
and pointing at a file that exists (with its #anchor, where it names one)."""

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
# sections a reader looks for by name (prefixes: a heading may go on)
README_SECTIONS = ["Install", "An environment", "A reward ablation", "A training run", "Environments", "Documentation"]
README_MAX_LINES = 150  # what it is, install, three examples, one line per env, links: the rest is in docs/


def _tokens(path: Path):
    return MarkdownIt("commonmark").enable("table").parse(path.read_text(encoding="utf-8"))


def _headings(tokens) -> list[tuple[int, str]]:
    """(source line, text) of every heading."""
    return [(tok.map[0], tokens[i + 1].content) for i, tok in enumerate(tokens) if tok.type == "heading_open"]


def _slug(text: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", text.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _closed(tok, lines: list[str]) -> bool:
    """Whether a fence token ends on a closing fence line (an unclosed one runs to the end of the document)."""
    last = lines[tok.map[1] - 1].strip() if tok.map[1] - 1 > tok.map[0] else ""
    return bool(last) and set(last) == {tok.markup[0]} and len(last) >= len(tok.markup)


def unclosed_fences(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{path.name}:{tok.map[0] + 1}" for tok in _tokens(path) if tok.type == "fence" and not _closed(tok, lines)]


def lost_headings(path: Path) -> list[str]:
    """``#`` lines outside closed code that the parser does not read as headings (swallowed by an unclosed
    fence or an HTML block)."""
    tokens = _tokens(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    in_code = {line for tok in tokens if tok.type == "code_block" or (tok.type == "fence" and _closed(tok, lines))
               for line in range(*tok.map)}
    heading_lines = {line for line, _ in _headings(tokens)}
    return [f"{path.name}:{n + 1}: {line}" for n, line in enumerate(lines)
            if re.match(r"#{1,6} ", line) and n not in in_code and n not in heading_lines]


def bad_links(path: Path, root: Path = ROOT) -> list[str]:
    """Relative links and images that leave ``root``, name no file, or name a heading the target lacks."""
    bad = []
    for tok in _tokens(path):
        for child in tok.children or []:
            href = child.attrGet("href") if child.type == "link_open" else child.attrGet("src") if child.type == "image" else None
            if href is None:
                continue
            parts = urlsplit(href)
            if parts.scheme or parts.netloc:  # http(s), mailto: outside the repository by design
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if not target.is_relative_to(root):
                bad.append(f"{href} (outside the repository)")
            elif not target.exists():
                bad.append(f"{href} (no such file)")
            elif parts.fragment and target.suffix == ".md":
                if parts.fragment not in {_slug(text) for _, text in _headings(_tokens(target))}:
                    bad.append(f"{href} (no heading #{parts.fragment} in {target.name})")
    return bad


def test_the_docs_are_found():
    assert ROOT / "README.md" in DOCS and len(DOCS) > 1


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_fence_is_closed(path):
    assert not unclosed_fences(path), "code fences opened here are never closed"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_heading_line_is_a_heading(path):
    assert not lost_headings(path)


def test_readme_has_its_sections_as_headings():
    texts = [text for _, text in _headings(_tokens(ROOT / "README.md"))]
    assert not [s for s in README_SECTIONS if not any(t.startswith(s) for t in texts)]


def test_the_readme_is_short_and_links_every_docs_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md|benchmarks/README\.md)", text))
    pages = {str(p.relative_to(ROOT)) for p in DOCS if p.name != "README.md" or p.parent.name == "benchmarks"}
    assert pages <= linked, sorted(pages - linked)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files_in_the_repository(path):
    assert not bad_links(path)


def test_the_checks_find_planted_defects(tmp_path):
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "guide.md").write_text("# Guide\n\n## Set up\n")
    doc = repo / "README.md"
    doc.write_text("# T\n\n[ok](docs/guide.md#set-up) [gone](docs/DESIGN.md) [up](../shared/DESIGN.md) "
                   "[anchor](docs/guide.md#nowhere) ![img](docs/x.png) [web](https://example.org)\n\n"
                   "<div>\n## In HTML\n\n```bash\necho hi\n\n## Rewards\n")
    assert unclosed_fences(doc) == ["README.md:8"]
    assert lost_headings(doc) == ["README.md:6: ## In HTML", "README.md:11: ## Rewards"]
    assert bad_links(doc, root=repo) == ["docs/DESIGN.md (no such file)", "../shared/DESIGN.md (outside the repository)",
                                         "docs/guide.md#nowhere (no heading #nowhere in guide.md)",
                                         "docs/x.png (no such file)"]


CONFLICT = re.compile(r"^(<{7} |={7}$|>{7} )", re.M)  # the lines git writes around an unresolved merge


def conflict_lines(text: str) -> list[int]:
    """1-based lines of ``text`` that are git merge-conflict markers."""
    return [text.count("\n", 0, m.start()) + 1 for m in CONFLICT.finditer(text)]


def test_no_tracked_file_holds_a_merge_conflict_marker():
    import subprocess

    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    bad = []
    for name in filter(None, files):
        path = ROOT / name.decode()
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:  # binary
            continue
        bad += [f"{name.decode()}:{line}" for line in conflict_lines(data.decode("utf-8", "replace"))]
    assert not bad, "unresolved merge conflicts: " + ", ".join(bad)


def test_the_conflict_check_finds_planted_markers():
    text = "| a |\n<<<<<<< HEAD\n| b |\n=======\n| c |\n>>>>>>> policy\n=== a heading rule ===\n"
    assert conflict_lines(text) == [2, 4, 6]


def test_the_results_estimator_table_is_what_the_declarations_say():
    from turngym.credit.pairings import with_table

    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert page == with_table(page), ("docs/results.md's estimator table no longer matches the rewards' and estimators' "
                                      "declarations: run python -m turngym.credit.pairings docs/results.md")
