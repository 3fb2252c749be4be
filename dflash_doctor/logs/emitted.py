"""The findings a scan has made so far: each rule's findings deduplicated by key (repeats counted) and capped per
code (the rest counted as suppressed)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.rules.registry import Rule


class EmittedFindings:
    def __init__(self, path: str, max_per_code: int) -> None:
        self.path = path
        self.max_per_code = max_per_code
        self.findings: List[Finding] = []
        self.seen: Dict[tuple, int] = {}
        self.suppressed: Dict[str, int] = {}
        self._per_code: Dict[str, int] = {}

    def emit(self, rule: Rule, key: tuple, message: str, line: int, evidence: Dict[str, Any],
             severity: Optional[Severity] = None) -> List[Finding]:
        """The new finding, or none when its key was reported already or its code is at the cap."""
        full_key = (rule.code,) + key
        if full_key in self.seen:
            self.seen[full_key] += 1
            return []
        if self._per_code.get(rule.code, 0) >= self.max_per_code:
            self.suppressed[rule.code] = self.suppressed.get(rule.code, 0) + 1
            return []
        self.seen[full_key] = 1
        self._per_code[rule.code] = self._per_code.get(rule.code, 0) + 1
        finding = rule.finding(message, path=self.path, line=line, column=1, evidence=evidence, severity=severity)
        self.findings.append(finding)
        return [finding]

    def withdraw(self, finding: Finding, key: tuple) -> None:
        """A finding that a later line showed to be part of another one's."""
        self.findings = [f for f in self.findings if f is not finding]
        self.seen.pop((finding.code,) + key, None)
        self._per_code[finding.code] -= 1

    def repeats(self) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        for key, count in self.seen.items():
            if count > 1:
                counts[key[0]] = counts.get(key[0], 0) + count - 1
        return counts
