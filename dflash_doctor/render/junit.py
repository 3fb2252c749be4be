"""JUnit XML: one test case per finding (failure) and per problem (error), so CI servers list each hazard."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from dflash_doctor import TOOL_NAME
from dflash_doctor.findings import Report


def render_junit(report: Report, exit_code: int) -> str:
    findings = report.sorted_findings()
    suite = ET.Element(
        "testsuite",
        name=f"{TOOL_NAME} {report.command}",
        tests=str(max(1, len(findings) + len(report.problems))),
        failures=str(len(findings)),
        errors=str(len(report.problems)),
        skipped="0",
    )
    for finding in findings:
        where = f"{finding.path}:{finding.line}" if finding.path else report.command
        case = ET.SubElement(suite, "testcase", classname=f"{TOOL_NAME}.{finding.code}", name=f"{finding.name} {where}")
        failure = ET.SubElement(case, "failure", type=finding.severity.value, message=f"{finding.code} {finding.message}")
        failure.text = "\n".join(f"{k}: {v}" for k, v in finding.evidence.items()) or finding.message
    for problem in report.problems:
        case = ET.SubElement(suite, "testcase", classname=f"{TOOL_NAME}.problem", name=problem.subject)
        error = ET.SubElement(case, "error", type="could-not-check", message=problem.reason)
        error.text = problem.hint
    if not findings and not report.problems:
        ET.SubElement(suite, "testcase", classname=TOOL_NAME, name=f"{report.command} clean")
    suites = ET.Element("testsuites", name=TOOL_NAME)
    suites.append(suite)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)
