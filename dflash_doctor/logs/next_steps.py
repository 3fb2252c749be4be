"""What to do next about a logs report: the steps each rule declares for its findings (rules/logs/
`LogRule.next_steps`), or its fix.

The fix texts come from the rule registry and the mitigation registry (dflash_doctor/mitigations.py), so the
advice cannot drift from `explain` and `repro`.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from dflash_doctor.findings import Finding
from dflash_doctor.rules import lookup
from dflash_doctor.rules.logs import LOG_RULES, UNNAMED, fix_step


def next_steps(findings: Sequence[Finding], threads: Optional[Dict[str, dict]] = None,
               workers: Optional[int] = None) -> List[str]:
    """Steps for the findings, most severe kind first; `workers` is how many threads a repro should start."""
    threads = threads or {}
    by_code: Dict[str, List[Finding]] = {}
    for finding in sorted(findings, key=lambda f: (-f.severity.rank, f.line or 0)):
        by_code.setdefault(finding.code, []).append(finding)
    count = workers or max(2, len([t for t in threads if t != UNNAMED]))
    steps: List[str] = []
    for code, found in by_code.items():
        steps += _steps_for(code, found, threads, count)
    unique: List[str] = []
    for step in steps:
        if step not in unique:
            unique.append(step)
    return unique


def _steps_for(code: str, found: List[Finding], threads: Dict[str, dict], count: int) -> List[str]:
    entry = LOG_RULES.get(code)
    declared = entry.next_steps(found, threads, count) if entry is not None and entry.next_steps else None
    if declared is not None:
        return declared
    rule = lookup(code)
    return [fix_step(rule) if rule is not None else f"dflash-doctor explain {code}"]
