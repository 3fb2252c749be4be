"""JUnit XML, so a CI server lists each hazard: one test case per finding, one erroring test case per problem
("could not check"), grouped in one test suite per part of the tool (scan, guards, repro...).

A finding is a failing case when it is one that failed the run (at or above --fail-on), and a passing case that
carries its details in <system-out> otherwise, so the CI server's red/green agrees with the exit code. A part
that ran clean still shows up as one passing case when the report names the parts it ran in `facts["parts"]`
(as `check` does), so "scan passed, guards failed" reads at a glance.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Callable, Dict, List, Optional

from dflash_doctor import TOOL_NAME
from dflash_doctor.findings import EXIT_FINDINGS, FailOn, Finding, Report, Severity
from dflash_doctor.printable import without_surrogates
from dflash_doctor.render.rule_links import code_domain

PROBLEMS_SUITE = "could-not-check"
# XML 1.0 cannot carry most control characters at all (not even escaped); log excerpts can contain them.
_ILLEGAL_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: object) -> str:
    # A file name that is not UTF-8 arrives with lone surrogates, which no UTF-8 document can hold.
    return _ILLEGAL_XML.sub("\ufffd", without_surrogates(str(text)))


def _where(finding: Finding) -> str:
    if not finding.path:
        return "environment"
    parts = [finding.path] + [str(n) for n in (finding.line, finding.column) if n]
    return ":".join(parts)


def failing_findings(report: Report, exit_code: int, fail_on: Optional[FailOn]) -> Callable[[Finding], bool]:
    """Which findings failed the run. Without `fail_on`, it is read back from the exit code: no findings bit
    means none did; otherwise the default threshold (warning), or info when only info findings could have."""
    if fail_on is None:
        if not exit_code & EXIT_FINDINGS:
            return lambda finding: False
        worst = max((f.severity.rank for f in report.findings), default=0)
        fail_on = FailOn.WARNING if worst >= Severity.WARNING.rank else FailOn.INFO
    return lambda finding: fail_on.trips(finding.severity)


def _finding_case(suite: ET.Element, finding: Finding, domain: str, failed: bool) -> None:
    attributes = {
        "classname": f"{TOOL_NAME}.{domain}.{finding.code}",
        "name": _clean(f"{finding.code} {finding.name} at {_where(finding)}"),
    }
    if finding.path:
        attributes["file"] = _clean(finding.path)
        if finding.line:
            attributes["line"] = str(finding.line)
    case = ET.SubElement(suite, "testcase", attributes)
    details = [f"{finding.severity.value}: {finding.code} {finding.name} at {_where(finding)}", finding.message]
    details += [f"{key}: {value}" for key, value in finding.evidence.items()]
    if failed:
        element = ET.SubElement(
            case, "failure", type=finding.severity.value, message=_clean(f"{finding.code} {finding.message}")
        )
    else:
        element = ET.SubElement(case, "system-out")
    element.text = _clean("\n".join(details))


def _suite(name: str, cases: int, failures: int, errors: int) -> ET.Element:
    return ET.Element(
        "testsuite", name=name, tests=str(cases), failures=str(failures), errors=str(errors), skipped="0",
        time="0",
    )


def render_junit(report: Report, exit_code: int, fail_on: Optional[FailOn] = None) -> str:
    failed = failing_findings(report, exit_code, fail_on)
    by_domain: Dict[str, List[Finding]] = {}
    for finding in report.sorted_findings():
        by_domain.setdefault(code_domain(finding.code), []).append(finding)
    parts = report.facts.get("parts") if isinstance(report.facts, dict) else None
    clean_parts = [p for p in parts if isinstance(p, str) and p not in by_domain] if isinstance(parts, list) else []

    suites = []
    for domain in sorted(by_domain):
        findings = by_domain[domain]
        failures = sum(1 for f in findings if failed(f))
        suite = _suite(f"{TOOL_NAME} {report.command}: {domain}", len(findings), failures, 0)
        for finding in findings:
            _finding_case(suite, finding, domain, failed(finding))
        suites.append(suite)
    for part in clean_parts:
        suite = _suite(f"{TOOL_NAME} {report.command}: {part}", 1, 0, 0)
        ET.SubElement(suite, "testcase", classname=f"{TOOL_NAME}.{part}", name=f"{part} clean")
        suites.append(suite)
    if report.problems:
        suite = _suite(f"{TOOL_NAME} {report.command}: {PROBLEMS_SUITE}", len(report.problems), 0,
                       len(report.problems))
        for problem in report.problems:
            case = ET.SubElement(suite, "testcase", classname=f"{TOOL_NAME}.{PROBLEMS_SUITE}",
                                 name=_clean(problem.subject))
            error = ET.SubElement(case, "error", type="could-not-check", message=_clean(problem.reason))
            error.text = _clean(problem.hint)
        suites.append(suite)
    if not suites:
        suite = _suite(f"{TOOL_NAME} {report.command}", 1, 0, 0)
        ET.SubElement(suite, "testcase", classname=TOOL_NAME, name=f"{report.command} clean")
        suites.append(suite)

    root = ET.Element(
        "testsuites",
        name=f"{TOOL_NAME} {report.command}",
        tests=str(sum(int(s.attrib["tests"]) for s in suites)),
        failures=str(sum(int(s.attrib["failures"]) for s in suites)),
        errors=str(sum(int(s.attrib["errors"]) for s in suites)),
        skipped="0",
        time="0",
    )
    root.extend(suites)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
