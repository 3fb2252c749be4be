"""What every rule sees while one file is analysed, and the one place where findings are made and suppressed."""
from __future__ import annotations

import ast
import bisect
import re
from typing import FrozenSet, List, Mapping, Optional, Set, Tuple, Union

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.rules.registry import Rule
from dflash_doctor.scan.applied import AppliedFix
from dflash_doctor.scan.resolve import Resolver
from dflash_doctor.scan.scopes import ScopeTable

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z0-9]+(?:[\s,]+[A-Za-z0-9]+)*))?", re.IGNORECASE)
ALL_CODES: FrozenSet[str] = frozenset({"*"})
_NOQA_SPELLINGS = ("noqa", "NOQA", "NoQA", "Noqa")


def has_noqa(text: str) -> bool:
    """Whether a noqa comment may be present (str.find per spelling: a case-insensitive regex over a whole
    file cost more than the check it guards)."""
    return any(spelling in text for spelling in _NOQA_SPELLINGS)



def noqa_codes(line_text: str) -> Optional[FrozenSet[str]]:
    """None when the line has no `# noqa`; ALL_CODES for a bare one; else the listed codes, upper-cased."""
    match = _NOQA.search(line_text)
    if match is None:
        return None
    codes = match.group("codes")
    if not codes:
        return ALL_CODES
    return frozenset(c.upper() for c in re.split(r"[\s,]+", codes) if c)


def suppressed(code: str, codes: Optional[FrozenSet[str]]) -> bool:
    return codes is not None and (codes is ALL_CODES or code in codes)


# Findings one file may list: a file with more was generated (240,000 calls on one line), and listing them all
# cost a gigabyte and minutes. Past the cap they are counted, and the scan reports a problem saying how many.
MAX_FINDINGS_PER_FILE = 1000

NoqaDirective = Tuple[int, int, FrozenSet[str]]  # line, 1-based column of its "#", the DFD codes it names
Located = Union[ast.expr, ast.stmt]  # a node with a line and column a finding can point at


def noqa_directives(text: str) -> List[NoqaDirective]:
    """Every `# noqa: DFDxxx` comment of a file (bare `# noqa` and other tools' codes are not ours to judge)."""
    if not has_noqa(text):
        return []
    found = []
    line, counted = 1, 0
    for match in _NOQA.finditer(text):
        codes = match.group("codes")
        ours = frozenset(c.upper() for c in re.split(r"[\s,]+", codes or "") if c.upper().startswith("DFD"))
        if not ours:
            continue
        line += text.count("\n", counted, match.start())
        counted = match.start()
        column = match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1
        found.append((line, column, ours))
    return found


def _statement_starts(text: str, keyword: str) -> List[int]:
    """Offsets of lines that start with `keyword` and a blank (indentation allowed), found with str.find."""
    found = []
    position = text.find(keyword)
    while position != -1:
        begin = text.rfind("\n", 0, position) + 1
        end = position + len(keyword)
        if not text[begin:position].strip(" \t") and text[end:end + 1] in (" ", "\t"):
            found.append(position)
        position = text.find(keyword, end)
    return found


def _lines_of(text: str, offsets: List[int]) -> List[int]:
    """1-based line numbers of sorted character offsets, counting newlines between them (in C)."""
    lines, line, counted = [], 1, 0
    for offset in offsets:
        line += text.count("\n", counted, offset)
        counted = offset
        lines.append(line)
    return lines


class FileContext:
    def __init__(self, path: str, text: str, tree: ast.Module, enabled: FrozenSet[str], package: Optional[str],
                 candidate_lines: Optional[List[int]] = None, compile_names: FrozenSet[str] = frozenset({"compile"}),
                 transformers_version: Optional[str] = None):
        self.path = path
        self.transformers_version = transformers_version  # the installed release, for DFD104's message
        self.text = text
        self.enabled = enabled
        # Sorted lines a rule call can start on (None: every line); see analysis.candidate_lines.
        self.candidate_lines = candidate_lines
        global_lines = _lines_of(text, _statement_starts(text, "global"))
        walrus = []
        if ":=" in text:
            position = text.find(":=")
            while position != -1:
                walrus.append(position)
                position = text.find(":=", position + 2)
        self.table = ScopeTable(tree, package, global_lines, _lines_of(text, walrus))
        self.resolver = Resolver(self.table, path, compile_names)
        self.findings: List[Finding] = []
        self._lines: Optional[List[str]] = None
        self._has_noqa = has_noqa(text)  # once: asking per finding made big files quadratic
        self.used_noqa: Set[Tuple[int, str]] = set()  # (line, code) a noqa comment suppressed
        self.fixes: List[AppliedFix] = []  # the mitigations this file applies (for DFD201)
        self.unlisted = 0  # findings past MAX_FINDINGS_PER_FILE, counted only
        self._tree = tree
        self._old_torch: Optional[List[Tuple[int, int, str]]] = None  # scan/versions.py, computed on first need

    def on_candidate_line(self, node: Located) -> bool:
        """Whether `node` spans a candidate line: rules skip every other call without resolving names."""
        lines = self.candidate_lines
        if lines is None:
            return True
        start = node.lineno
        index = bisect.bisect_left(lines, start)
        return index < len(lines) and lines[index] <= (node.end_lineno or start)

    def old_torch_only(self, line: int) -> Optional[str]:
        """Why `line` runs only on a torch older than the first release with torch.compile (None: it may run on
        a supported one). Files that never spell a version test are not searched."""
        if self._old_torch is None:
            from dflash_doctor.scan.versions import old_torch_branches

            lowered = self.text.lower() if "torch" in self.text or "TORCH" in self.text else ""
            self._old_torch = old_torch_branches(self._tree) if "version" in lowered or "greater" in lowered \
                or "less_than" in lowered else []
        return next((why for first, last, why in self._old_torch if first <= line <= last), None)

    def noqa(self, line: int) -> Optional[FrozenSet[str]]:
        if not self._has_noqa:
            return None
        if self._lines is None:
            self._lines = self.text.splitlines()
        return noqa_codes(self._lines[line - 1]) if 0 < line <= len(self._lines) else None

    def report(self, rule: Rule, node: Located, message: str, evidence: Mapping[str, object],
               severity: Optional[Severity] = None) -> None:
        if rule.code not in self.enabled:
            return
        if suppressed(rule.code, self.noqa(node.lineno)):
            self.used_noqa.add((node.lineno, rule.code))
            return
        if len(self.findings) >= MAX_FINDINGS_PER_FILE:
            self.unlisted += 1
            return
        old = self.old_torch_only(node.lineno)
        if old is not None:
            from dflash_doctor.scan.versions import FIRST_COMPILE_RELEASE

            first = ".".join(str(part) for part in FIRST_COMPILE_RELEASE[:2])
            message = f"{message}; only an old torch runs it ({old}; torch.compile, and so the race, needs {first})"
            evidence = {**evidence, "old_torch_only": old}
            severity = Severity.INFO
        self.findings.append(rule.finding(
            message, path=self.path, line=node.lineno, column=node.col_offset + 1, evidence=evidence,
            severity=severity))
