"""Every relative link in README.md and docs/*.md reaches a file, and its ``#anchor`` a heading.

``docs/benchmarks.md`` keeps the current figures and moves the rest to
``docs/benchmarks-history.md``; a section moved or renamed must not leave a
link elsewhere pointing at nothing.  Anchors are GitHub's: the heading in
lower case, without punctuation but ``-`` and ``_``, spaces as ``-``, a
repeated one suffixed ``-1``, ``-2``, ...
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"\]\(([^()\s]*)\)")


def _prose(text: str) -> list[str]:
    """The lines of ``text`` outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text (before the suffix of a repeated one)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor the headings of ``page`` give."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose(page.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(pages: list[Path], root: Path = ROOT) -> list[str]:
    """``page: target`` for each relative link whose file or anchor is missing."""
    cache: dict[Path, set[str]] = {}
    broken = []
    for page in pages:
        for line in _prose(page.read_text(encoding="utf-8")):
            for target in _LINK.findall(line):
                if not target or re.match(r"[a-z][a-z+.-]*:", target):
                    continue  # an absolute URL, mailto:, ...
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                if not dest.exists():
                    broken.append(f"{page.relative_to(root)}: {target} (no such file)")
                    continue
                if not anchor or dest.suffix != ".md":
                    continue
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def test_slug_follows_githubs_rule() -> None:
    assert slug("`broadcast`: F-Matrix, R-Matrix (Shanmugasundaram et al., Figures 1-3)") == (
        "broadcast-f-matrix-r-matrix-shanmugasundaram-et-al-figures-1-3"
    )
    assert slug("tm: durable commits (moved from benchmarks.md on 2026-11-28)") == (
        "tm-durable-commits-moved-from-benchmarksmd-on-2026-11-28"
    )
    assert slug("Start-up, the store's format") == "start-up-the-stores-format"


def test_a_missing_heading_or_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(
        "# Top\n\n## Same\n\n## Same\n\n```\n# not a heading\n```\n", encoding="utf-8"
    )
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#same-1) [ok](a.md#top) [bad](a.md#same-2) [bad](a.md#not-a-heading) "
        "[bad](c.md) [ok](https://example.org/x#y)\n",
        encoding="utf-8",
    )
    assert broken_links([page], tmp_path) == [
        "b.md: a.md#same-2 (no such heading)",
        "b.md: a.md#not-a-heading (no such heading)",
        "b.md: c.md (no such file)",
    ]


def test_every_link_of_the_readme_and_docs_resolves() -> None:
    assert broken_links(PAGES) == []
