"""The registries' lists inside the hand-written docs (README.md, docs/*.md), regenerated in place.

The prose around them is written by hand; the lists in it are not: the output formats a `--format` takes, the
code ranges a domain's rules span (`DFD501-518`), the fixes `run --fix` refuses. Each is found by its pattern and
rewritten from its registry, so adding a format, a rule or a mitigation is still one module plus its examples:

    python -m dflash_doctor.render.doc_lists --write     # also run by `python -m dflash_doctor.render.rules_doc --write`

tests/render/test_doc_lists.py fails when a list is stale, or when a pattern no longer finds its list.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[2]
REGENERATE = "python -m dflash_doctor.render.doc_lists --write"
# Pages generated whole elsewhere (render/rules_doc.py, render/mitigations_doc.py) are not edited here.
GENERATED_PAGES = ("docs/rules.md", "docs/mitigations.md")


def hand_written_docs() -> List[str]:
    """README.md and every page of docs/ that no generator writes whole, relative to the repository."""
    pages = ["README.md"] + sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))
    return [page for page in pages if page not in GENERATED_PAGES]


def _formats(separator: str) -> Callable[["re.Match[str]"], str]:
    def render(match: "re.Match[str]") -> str:
        from dflash_doctor.render.formats import OutputFormat

        return separator.join(fmt.value for fmt in OutputFormat)
    return render


def _range_end(match: "re.Match[str]") -> str:
    """`DFD501-517` -> `DFD501-518` once DFD518 is registered: a range starting at the lowest code of its hundred
    ends at the highest (a range starting elsewhere is a deliberate part and stays as written)."""
    from dflash_doctor.rules import all_rules

    first = match.group("first")
    hundred = sorted(rule.code[3:] for rule in all_rules() if rule.code[3] == first[0])
    if not hundred or hundred[0] != first:
        return match.group("list")
    return hundred[-1]


def _needs_code_change(match: "re.Match[str]") -> str:
    from dflash_doctor import mitigations

    return ", ".join(f"`{entry.name}`" for entry in mitigations.REGISTRY if not entry.applies_without_code_change)


@dataclass(frozen=True)
class DocList:
    """One kind of list: where it is (`pages`: None for every hand-written page), the pattern whose group
    `list` it is, and how the registry renders it."""

    what: str
    pattern: "re.Pattern[str]"
    render: Callable[["re.Match[str]"], str]
    pages: Optional[Tuple[str, ...]] = None


DOC_LISTS: Tuple[DocList, ...] = (
    DocList("the output formats (`--format a|b|...`)",
            re.compile(r"--format (?P<list>[a-z]+(?:\|[a-z]+)+)"), _formats("|")),
    DocList("the output formats shell completion offers",
            re.compile(r"`--format <TAB>` gives\s+`(?P<list>[a-z]+(?: [a-z]+)+)`"), _formats(" "), ("docs/ci.md",)),
    DocList("a domain's code range (`DFD501-518`)",
            re.compile(r"\bDFD(?P<first>\d{3})-(?P<list>\d{3})\b"), _range_end),
    DocList("the fixes `run --fix` refuses (they need a code change)",
            re.compile(r"any other \((?P<list>`[a-z-]+`(?:, `[a-z-]+`)*)\) is refused"), _needs_code_change,
            ("docs/run.md",)),
)


def regenerate(text: str, doc_list: DocList) -> Tuple[str, int]:
    """`text` with every list of the kind rewritten, and how many the pattern found."""
    found = 0

    def replace(match: "re.Match[str]") -> str:
        nonlocal found
        found += 1
        start, end = match.span("list")
        return match.group(0)[:start - match.start()] + doc_list.render(match) + match.group(0)[end - match.start():]

    return doc_list.pattern.sub(replace, text), found


def current_pages() -> Dict[str, Tuple[str, str]]:
    """Page -> (its text, its text with every list regenerated), for the hand-written pages."""
    pages = {}
    for page in hand_written_docs():
        text = (REPO / page).read_text(encoding="utf-8")
        new = text
        for doc_list in DOC_LISTS:
            if doc_list.pages is None or page in doc_list.pages:
                new, _ = regenerate(new, doc_list)
        pages[page] = (text, new)
    return pages


def found_per_list() -> Dict[str, int]:
    """How many lists each DocList finds across its pages (0: the prose changed and its pattern went stale)."""
    counts = {}
    for doc_list in DOC_LISTS:
        pages = doc_list.pages or tuple(hand_written_docs())
        counts[doc_list.what] = sum(regenerate((REPO / page).read_text(encoding="utf-8"), doc_list)[1]
                                    for page in pages)
    return counts


def stale_pages() -> List[str]:
    return [page for page, (text, new) in current_pages().items() if text != new]


def write() -> List[str]:
    """Rewrite the stale pages; returns them."""
    written = []
    for page, (text, new) in current_pages().items():
        if text != new:
            (REPO / page).write_text(new, encoding="utf-8")
            written.append(page)
    return written


def main(argv: Optional[List[str]] = None) -> int:
    """`--write` rewrites the stale lists; `--check` exits 1 naming the stale pages; with neither, lists them."""
    args = sys.argv[1:] if argv is None else argv
    if "--write" in args:
        for page in write():
            sys.stdout.write(f"rewrote the registry lists in {page}\n")
        return 0
    stale = stale_pages()
    for page in stale:
        sys.stderr.write(f"{page}: a registry list is stale; regenerate with: {REGENERATE}\n")
    return 1 if stale and "--check" in args else 0


if __name__ == "__main__":
    raise SystemExit(main())
