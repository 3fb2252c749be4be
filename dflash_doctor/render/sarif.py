"""SARIF 2.1.0, shaped so GitHub code scanning accepts it: every rule described, repo-relative URIs, stable
fingerprints, and a location on every result.

Findings about the environment rather than a repository file (guards, gpus, logs, repro) have no path, or a path
outside the repository (a line of the installed torch). GitHub rejects a result without a location and cannot
show a file it does not have, so they are placed on line 1 of the project's dependency manifest (the file that
pins the torch they are about), or on the pseudo artifact `ENVIRONMENT_ARTIFACT` when the project has none.
`properties.environmentFinding` says the location is a placement, not a line to blame;
`properties.originalLocation` keeps an outside file's URI and line.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Optional

from dflash_doctor import TOOL_NAME, __version__
from dflash_doctor.findings import Finding, Problem, Report, Severity
from dflash_doctor.render.paths import relative_uri, repo_root
from dflash_doctor.printable import without_surrogates
from dflash_doctor.render.rule_links import rule_anchor
from dflash_doctor.rules import all_rules
from dflash_doctor.rules.registry import Rule

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/dflash-doctor/dflash-doctor"
RULES_DOC_URI = f"{INFORMATION_URI}/blob/main/docs/rules.md"
FINGERPRINT_KEY = "dflashDoctor/v1"
# Where pathless findings go, in order of preference: the files that decide which torch a project runs.
MANIFESTS = ("pyproject.toml", "requirements.txt", "setup.py", "setup.cfg", "environment.yml", "Pipfile")
ENVIRONMENT_ARTIFACT = "dflash-doctor-environment"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def environment_artifact(root: Path) -> str:
    """The repo-relative file that carries findings without a path (see the module docstring)."""
    for name in MANIFESTS:
        if (root / name).is_file():
            return name
    return ENVIRONMENT_ARTIFACT


def _rule_entry(rule: Rule) -> dict:
    fix = f"\n\nFix: {rule.fix}" if rule.fix else ""
    fix_md = f"\n\n**Fix:** {rule.fix}" if rule.fix else ""
    lexer = "python" if rule.example_format in ("python", "torch-layout") else ""
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": rule.rationale},
        "help": {
            "text": f"{rule.rationale}{fix}",
            "markdown": (
                f"{rule.rationale}{fix_md}\n\nFires on:\n\n```{lexer}\n{rule.bad.rstrip()}\n```\n\n"
                f"Clean:\n\n```{lexer}\n{rule.good.rstrip()}\n```"
            ),
        },
        "helpUri": f"{RULES_DOC_URI}#{rule_anchor(rule)}",
        "defaultConfiguration": {"level": _LEVEL[rule.severity]},
        "properties": {"tags": [_domain_tag(rule.code)], "precision": "high"},
    }


def _domain_tag(code: str) -> str:
    return code[:4] + "xx"


def _fingerprint(finding: Finding, uri: str) -> str:
    # Stable across runs and line shifts: code, file and the finding's own evidence, not its line number.
    # Environment findings hash without their placement, so adding a manifest later does not reopen them.
    evidence = json.dumps(dict(finding.evidence), sort_keys=True, default=str)
    digest = hashlib.sha256(f"{finding.code}|{uri}|{finding.message}|{evidence}".encode()).hexdigest()
    return digest[:32]


def _location(uri: str, line: int, column: Optional[int]) -> dict:
    region = {"startLine": max(1, line)}
    if column:
        region["startColumn"] = max(1, column)
    artifact = {"uri": uri}
    if not uri.startswith("file:"):
        artifact["uriBaseId"] = "%SRCROOT%"
    return {"physicalLocation": {"artifactLocation": artifact, "region": region}}


def _result(finding: Finding, index: dict, root: Path, fallback_uri: str) -> dict:
    properties: Dict[str, object] = {"name": finding.name, "evidence": dict(finding.evidence)}
    uri = relative_uri(finding.path, root) if finding.path else ""
    if uri and not uri.startswith("file:"):
        location = _location(uri, finding.line or 1, finding.column)
        fingerprint = _fingerprint(finding, uri)
    else:
        # No file, or a file outside the repository (torch's own source, a log elsewhere): GitHub can show
        # neither, so the result goes on the stable environment artifact and keeps where it really points.
        if uri:
            properties["originalLocation"] = f"{uri}:{finding.line}" if finding.line else uri
        location = _location(fallback_uri, 1, None)
        properties["environmentFinding"] = True
        fingerprint = _fingerprint(finding, "")
    return {
        "ruleId": finding.code,
        "ruleIndex": index[finding.code],
        "level": _LEVEL[finding.severity],
        "message": {"text": finding.message},
        "locations": [location],
        "partialFingerprints": {FINGERPRINT_KEY: fingerprint},
        "properties": properties,
    }


def _deduplicate_fingerprints(results: list) -> None:
    """Two identical findings in one file would share a fingerprint and GitHub would merge them: number repeats."""
    seen: dict = {}
    for result in results:
        fingerprint = result["partialFingerprints"][FINGERPRINT_KEY]
        seen[fingerprint] = seen.get(fingerprint, 0) + 1
        if seen[fingerprint] > 1:
            result["partialFingerprints"][FINGERPRINT_KEY] = f"{fingerprint}:{seen[fingerprint]}"


def _problem_text(problem: Problem) -> str:
    hint = f" ({problem.hint})" if problem.hint else ""
    return f"could not check {problem.subject}: {problem.reason}{hint}"


def sarif_document(report: Report, exit_code: int, root: Optional[Path] = None) -> dict:
    root = (root or repo_root()).resolve()
    rules = all_rules()
    index = {rule.code: i for i, rule in enumerate(rules)}
    fallback_uri = environment_artifact(root)
    results = [_result(f, index, root, fallback_uri) for f in report.sorted_findings()]
    _deduplicate_fingerprints(results)
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
            "automationDetails": {"id": f"{TOOL_NAME}/{report.command}/"},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": root.as_uri().rstrip("/") + "/"}},
            "columnKind": "unicodeCodePoints",
            "results": results,
            "invocations": [{
                "executionSuccessful": not report.problems,
                "exitCode": exit_code,
                "toolExecutionNotifications": [
                    {"level": "warning", "message": {"text": _problem_text(p)}}
                    for p in report.problems
                ],
            }],
            "properties": {"command": report.command},
        }],
    }


def _valid_unicode(value: Any) -> Any:
    """The document with every string valid Unicode: a file name that is not UTF-8 (lone surrogates) would
    otherwise reach the JSON as escapes that strict SARIF consumers reject."""
    if isinstance(value, str):
        return without_surrogates(value)
    if isinstance(value, dict):
        return {without_surrogates(str(key)): _valid_unicode(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_valid_unicode(item) for item in value]
    return value


def render_sarif(report: Report, exit_code: int) -> str:
    return json.dumps(_valid_unicode(sarif_document(report, exit_code)), indent=2,
                      default=lambda value: without_surrogates(str(value)))
