"""The rule registry: every code any command can report, with its stable name, rationale and examples.

Codes are a public contract: never renumber or reuse one. Ranges: DFD1xx-3xx scan, DFD4xx gpus, DFD5xx logs,
DFD6xx guards, DFD7xx repro, DFD8xx pipeline, DFD9xx live runs (run, attach).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from dflash_doctor.findings import Finding, Severity

_CODE = re.compile(r"^DFD[1-9]\d\d$")
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")

# How a rule's bad/good examples are written. Each format's runner (the function that turns an example into findings
# through exactly the code the command runs) is in dflash_doctor/rule_examples.py, above the domains it imports:
# tests/test_rule_examples.py runs every rule's examples with it, so a rule is tested the moment it is registered,
# and a format cannot be registered here without a runner there (importing rule_examples checks both name the same).
EXAMPLE_FORMATS: Tuple[str, ...] = (
    "python",  # a source file with `# DFDxxx` on offending lines
    "nvidia-smi-csv",  # a snapshot, options as comments
    "log",  # a log excerpt
    "torch-layout",  # stand-in torch sources
    "guards-state",  # guards facts (JSON)
    "repro-facts",  # a repro facts document (JSON)
    "pipeline-facts",  # a pipeline facts document (JSON)
    "live-facts",  # run/attach per-process records (JSON)
)

RULES: Dict[str, "Rule"] = {}
_BY_NAME: Dict[str, "Rule"] = {}


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: Severity
    summary: str  # one line; the default finding message
    rationale: str  # why it matters, for `explain` and SARIF help
    bad: str  # an example that fires; runs as a test
    good: str  # the fixed example; runs as a test and must be clean
    example_format: str = "python"  # one of EXAMPLE_FORMATS
    fix: str = ""

    def finding(
        self,
        message: Optional[str] = None,
        *,
        path: Optional[str] = None,
        line: Optional[int] = None,
        column: Optional[int] = None,
        evidence: Optional[Mapping[str, Any]] = None,
        severity: Optional[Severity] = None,
    ) -> Finding:
        return Finding(
            code=self.code,
            name=self.name,
            severity=severity or self.severity,
            message=message or self.summary,
            path=path,
            line=line,
            column=column,
            evidence=dict(evidence or {}),
        )


def register(rule: Rule) -> Rule:
    if not _CODE.match(rule.code):
        raise ValueError(f"bad rule code {rule.code!r}")
    if not _NAME.match(rule.name):
        raise ValueError(f"bad rule name {rule.name!r}")
    if rule.example_format not in EXAMPLE_FORMATS:
        raise ValueError(f"rule {rule.code}: unknown example format {rule.example_format!r}")
    if rule.code in RULES or rule.name in _BY_NAME:
        raise ValueError(f"rule {rule.code} {rule.name} registered twice")
    RULES[rule.code] = rule
    _BY_NAME[rule.name] = rule
    return rule
