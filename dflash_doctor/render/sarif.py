"""SARIF 2.1.0, shaped so GitHub code scanning accepts it: every rule described, repo-relative URIs."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

from dflash_doctor import TOOL_NAME, __version__
from dflash_doctor.findings import Finding, Report, Severity
from dflash_doctor.render.paths import relative_uri, repo_root
from dflash_doctor.rules import all_rules

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/dflash-doctor/dflash-doctor"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _rule_entry(rule) -> dict:
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": rule.rationale},
        "help": {
            "text": f"{rule.rationale}\n\nFix: {rule.fix}" if rule.fix else rule.rationale,
            "markdown": (
                f"{rule.rationale}\n\n**Fix:** {rule.fix}\n\n```\n{rule.bad}```" if rule.fix
                else f"{rule.rationale}\n\n```\n{rule.bad}```"
            ),
        },
        "helpUri": f"{INFORMATION_URI}/blob/main/docs/rules.md#{rule.code.lower()}",
        "defaultConfiguration": {"level": _LEVEL[rule.severity]},
        "properties": {"tags": [rule.code[:4] + "xx"]},
    }


def _fingerprint(finding: Finding, uri: Optional[str]) -> str:
    # Stable across runs and line shifts: code, file and the finding's own evidence, not its line number.
    evidence = json.dumps(dict(finding.evidence), sort_keys=True, default=str)
    digest = hashlib.sha256(f"{finding.code}|{uri}|{finding.message}|{evidence}".encode()).hexdigest()
    return digest[:32]


def _result(finding: Finding, index: dict, root: Path) -> dict:
    result = {
        "ruleId": finding.code,
        "ruleIndex": index[finding.code],
        "level": _LEVEL[finding.severity],
        "message": {"text": finding.message},
        "properties": {"name": finding.name, "evidence": dict(finding.evidence)},
    }
    uri = None
    if finding.path:
        uri = relative_uri(finding.path, root)
        region = {"startLine": max(1, finding.line or 1)}
        if finding.column:
            region["startColumn"] = max(1, finding.column)
        location = {"artifactLocation": {"uri": uri}, "region": region}
        if not uri.startswith("file:"):
            location["artifactLocation"]["uriBaseId"] = "%SRCROOT%"
        result["locations"] = [{"physicalLocation": location}]
    result["partialFingerprints"] = {"dflashDoctor/v1": _fingerprint(finding, uri)}
    return result


def sarif_document(report: Report, exit_code: int, root: Optional[Path] = None) -> dict:
    root = root or repo_root()
    rules = all_rules()
    index = {rule.code: i for i, rule in enumerate(rules)}
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": TOOL_NAME,
                "version": __version__,
                "semanticVersion": __version__,
                "informationUri": INFORMATION_URI,
                "rules": [_rule_entry(rule) for rule in rules],
            }},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": root.as_uri() + "/"}},
            "results": [_result(f, index, root) for f in report.sorted_findings()],
            "invocations": [{
                "executionSuccessful": not report.problems,
                "exitCode": exit_code,
                "toolExecutionNotifications": [
                    {"level": "warning", "message": {"text": f"{p.subject}: {p.reason}"}}
                    for p in report.problems
                ],
            }],
            "properties": {"command": report.command},
        }],
    }


def render_sarif(report: Report, exit_code: int) -> str:
    return json.dumps(sarif_document(report, exit_code), indent=2, default=str)
