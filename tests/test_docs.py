"""The repository stands alone: everything the code cites is in ``docs/``.

Two checks over the code, tests, benchmarks, examples, scripts, skills, the README and the docs
themselves:

* nothing cites a document outside this repository: no item codes in the style of an outside
  checklist (one or two capital letters, a hyphen, a number), no section signs, no names of
  outside notes, no "design decision N" or "the spec" references;
* every ``docs/<page>.md#<anchor>`` citation (and every relative link inside ``docs/``) names a
  page that exists and a heading of that page, using GitHub's anchor rules.

Papers (arXiv ids) and public upstream documentation or issues may be cited freely.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SCANNED = ("relaxtrio", "tests", "benchmarks", "examples", "scripts", "docs", "skills", "README.md")
TEXT_SUFFIXES = frozenset({".py", ".md", ".sh", ".jinja", ".toml", ".json", ".jsonl", ".txt", ".cfg"})

# The same patterns as the acceptance grep, spelled so that this file does not match it itself.
OUTSIDE_CODES = re.compile(
    r"\b[A-Z]{1,2}-[0-9]+\b"  # checklist item codes
    "|\u00a7"  # section signs
    r"|relax-behavio(?:u)r|deps-and-mode(?:l)|pitfalls[.]md|sglang-native-ap(?:i)|shared[/]"
)
OUTSIDE_WORDS = re.compile(
    r"\bDESIGN(?: decision|[.]md)|\bSTYLE[.]md|\b[Tt]he spec\b|\bspec's\b|\(spec(?:[,):]|\s)"
    r"|\breference (?:quirk|loop|behaviou?r)\b|\bthe reference\b"
)
CITATION = re.compile(r"docs/([\w-]+\.md)(?:#([\w-]+))?")
DOCS_LINK = re.compile(r"\]\((?!https?:)([\w./-]*\.md)?(?:#([\w-]+))?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def _files() -> Iterator[Path]:
    this = Path(__file__).resolve()
    for name in SCANNED:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for file in candidates:
            if file.is_file() and file.suffix in TEXT_SUFFIXES and file.resolve() != this:
                if "__pycache__" not in file.parts:
                    yield file


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a markdown page (duplicates get ``-1``, ``-2`` like GitHub)."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is None:
            continue
        anchor = github_anchor(match.group(2))
        n = counts.get(anchor, 0)
        counts[anchor] = n + 1
        found.add(anchor if n == 0 else f"{anchor}-{n}")
    return found


def test_github_anchor_rules() -> None:
    assert github_anchor("Tool-call arguments: mapping or string") == "tool-call-arguments-mapping-or-string"
    assert github_anchor("Silent clamp of `max_new_tokens`") == "silent-clamp-of-max_new_tokens"
    assert github_anchor("From a lineage to a TrainingSample") == "from-a-lineage-to-a-trainingsample"


def test_docs_pages_exist() -> None:
    pages = {p.name for p in DOCS.glob("*.md")}
    assert {"architecture.md", "agent-contract.md", "canonical-contract.md", "export-and-credit.md",
            "scheduling.md", "client-quirks.md"} <= pages


def test_nothing_cites_a_document_outside_the_repository() -> None:
    hits = []
    for file in _files():
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            for pattern in (OUTSIDE_CODES, OUTSIDE_WORDS):
                match = pattern.search(line)
                if match:
                    hits.append(f"{file.relative_to(ROOT)}:{number}: {match.group(0)!r} in {line.strip()}")
    assert not hits, (
        "cite docs/<page>.md#<section> (or say it in the code's own words) instead of an outside "
        "document:\n" + "\n".join(hits)
    )


def _citations() -> Iterator[tuple[str, Path, str | None]]:
    for file in _files():
        text = file.read_text(encoding="utf-8")
        where = str(file.relative_to(ROOT))
        for match in CITATION.finditer(text):
            yield where, DOCS / match.group(1), match.group(2)
        if file.parent == DOCS:
            for match in DOCS_LINK.finditer(text):
                page, anchor = match.group(1), match.group(2)
                target = file if page is None else (file.parent / page)
                if page is None or target.resolve().parent == DOCS.resolve():
                    yield where, target, anchor


def test_every_docs_citation_names_an_existing_heading() -> None:
    cache: dict[Path, set[str]] = {}
    bad = []
    seen = 0
    for where, page, anchor in _citations():
        seen += 1
        if not page.is_file():
            bad.append(f"{where}: no page {page.relative_to(ROOT)}")
            continue
        if anchor is None:
            continue
        if page not in cache:
            cache[page] = anchors(page)
        if anchor not in cache[page]:
            bad.append(f"{where}: {page.name} has no heading #{anchor}")
    assert seen > 0, "found no docs citations at all: is the scan broken?"
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_headings_are_unique_within_a_page(page: str) -> None:
    """A citation must point at one section, so no page repeats a heading anchor."""
    text = (DOCS / page).read_text(encoding="utf-8")
    seen: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            seen.append(github_anchor(match.group(2)))
    duplicates = sorted({a for a in seen if seen.count(a) > 1})
    assert not duplicates, f"{page} repeats headings {duplicates}"
