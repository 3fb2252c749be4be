"""The rule registry: every code any command can report, with its stable name, rationale and examples.

Codes are a public contract: never renumber or reuse one. Ranges: DFD1xx-3xx scan, DFD4xx gpus, DFD5xx logs,
DFD6xx guards, DFD7xx repro, DFD8xx pipeline, DFD9xx live runs (run, attach).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from dflash_doctor.findings import Finding, Severity

_CODE = re.compile(r"^DFD[1-9]\d\d$")
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")

# How a rule's bad/good examples are written, and the function (module:name, imported on use) that turns one into
# findings through exactly the code the command runs: tests/test_rule_examples.py runs every rule's examples with
# it, so a rule is tested the moment it is registered, and a format without a runner cannot be registered.
EXAMPLE_RUNNERS: Dict[str, str] = {
    "python": "dflash_doctor.scan.engine:example_findings",  # a source file with `# DFDxxx` on offending lines
    "nvidia-smi-csv": "dflash_doctor.gpus.examples:example_findings",  # a snapshot, options as comments
    "log": "dflash_doctor.logs.examples:example_findings",  # a log excerpt
    "torch-layout": "dflash_doctor.guards.hazards:layout_example_findings",  # stand-in torch sources
    "guards-state": "dflash_doctor.guards.hazards:state_example_findings",  # guards facts (JSON)
    "repro-facts": "dflash_doctor.repro.findings:example_findings",  # a repro facts document (JSON)
    "pipeline-facts": "dflash_doctor.reference.findings:example_findings",  # a pipeline facts document (JSON)
    "live-facts": "dflash_doctor.supervise.findings:example_findings",  # run/attach per-process records (JSON)
}
EXAMPLE_FORMATS = tuple(EXAMPLE_RUNNERS)

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


def example_findings(rule: Rule, text: str) -> List[Finding]:
    """The findings `text`, written in `rule`'s example format, yields (its bad or good example)."""
    import importlib

    module, _, name = EXAMPLE_RUNNERS[rule.example_format].partition(":")
    return getattr(importlib.import_module(module), name)(text)


def lookup(code_or_name: str) -> Optional[Rule]:
    load_all()
    key = code_or_name.strip()
    return RULES.get(key.upper()) or _BY_NAME.get(key.lower())


def all_rules() -> list:
    load_all()
    return [RULES[c] for c in sorted(RULES)]


_DOMAINS = ("scan", "gpus", "logs", "guards", "repro", "pipeline", "live")
_loaded = False


def load_all() -> None:
    """Import every domain's rule table (plain data modules: no torch, no NVML)."""
    global _loaded
    if _loaded:
        return
    import importlib

    for domain in _DOMAINS:
        importlib.import_module(f"dflash_doctor.rules.{domain}")
    _loaded = True  # only once every table imported: a broken table fails every lookup, not just the first
