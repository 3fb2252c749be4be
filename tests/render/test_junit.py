"""JUnit XML a CI server shows: a failing case per finding, an erroring case per problem, suites per part."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from dflash_doctor.findings import FailOn, Problem, Report
from dflash_doctor.render.junit import render_junit
from dflash_doctor.rules import all_rules, lookup


def _parse(report: Report, exit_code: int = 1, fail_on=None) -> ET.Element:
    text = render_junit(report, exit_code, fail_on)
    assert text.startswith("<?xml")
    return ET.fromstring(text)


def _suites(root: ET.Element) -> dict:
    return {suite.get("name"): suite for suite in root.findall("testsuite")}


def _environment_rule():
    return next(r for r in all_rules() if r.example_format != "python")


def test_findings_are_failures_grouped_by_part_with_consistent_counts():
    scan_a = lookup("DFD101").finding(path="src/train.py", line=3, column=5, evidence={"call": "checkpoint(f, x)"})
    scan_b = lookup("DFD201").finding(path="src/train.py", line=9, column=1)
    environment = _environment_rule().finding(evidence={"gpu": 5})
    root = _parse(Report("check", findings=[scan_b, environment, scan_a]))
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("3", "3", "0")
    suites = _suites(root)
    scan = suites["dflash-doctor check: scan"]
    assert (scan.get("tests"), scan.get("failures")) == ("2", "2")
    cases = scan.findall("testcase")
    assert [c.get("name") for c in cases] == [
        "DFD101 checkpoint-use-reentrant-true at src/train.py:3:5",
        "DFD201 compiled-call-in-thread at src/train.py:9:1",
    ]
    assert (cases[0].get("file"), cases[0].get("line")) == ("src/train.py", "3")
    failure = cases[0].find("failure")
    assert failure.get("type") == "warning"
    assert failure.get("message") == f"DFD101 {lookup('DFD101').summary}"
    assert "call: checkpoint(f, x)" in failure.text.splitlines()
    other = [s for name, s in suites.items() if name != "dflash-doctor check: scan"]
    assert len(other) == 1 and other[0].find("testcase").get("name").endswith("at environment")
    assert other[0].find("testcase").get("file") is None


def test_problems_are_errors_in_their_own_suite():
    root = _parse(Report("check", problems=[Problem("guards", "torch is not importable", "pip install torch")]), 4)
    suite = _suites(root)["dflash-doctor check: could-not-check"]
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("1", "0", "1")
    error = suite.find("testcase/error")
    assert (error.get("message"), error.text) == ("torch is not importable", "pip install torch")
    assert (root.get("errors"), root.get("failures")) == ("1", "0")


def test_clean_parts_named_in_facts_show_as_passing_cases():
    finding = lookup("DFD101").finding(path="a.py", line=1, column=1)
    root = _parse(Report("check", findings=[finding], facts={"parts": ["scan", "guards"]}))
    guards = _suites(root)["dflash-doctor check: guards"]
    [case] = guards.findall("testcase")
    assert case.get("name") == "guards clean" and list(case) == []
    assert (root.get("tests"), root.get("failures")) == ("2", "1")


def test_a_clean_report_has_one_passing_case():
    root = _parse(Report("scan"), 0)
    [suite] = root.findall("testsuite")
    [case] = suite.findall("testcase")
    assert list(case) == [] and case.get("name") == "scan clean"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("1", "0", "0")


def test_control_characters_from_logs_do_not_break_the_xml():
    finding = _environment_rule().finding("worker died\x1b[31m\x00 here", evidence={"tail": "a\x07b"})
    root = _parse(Report("logs", findings=[finding]))
    failure = root.find("testsuite/testcase/failure")
    assert failure.get("message").endswith("worker died\ufffd[31m\ufffd here")
    assert "tail: a\ufffdb" in failure.text


def _mixed() -> Report:
    return Report("check", findings=[
        lookup("DFD201").finding(path="a.py", line=1, column=1),                          # error
        lookup("DFD102").finding(path="a.py", line=2, column=1),                          # warning
        lookup("DFD103").finding(path="a.py", line=3, column=1),                          # info
    ])


def _outcomes(root: ET.Element) -> dict:
    return {c.get("name").split()[0]: ("failed" if c.find("failure") is not None else "passed")
            for c in root.iter("testcase")}


@pytest.mark.parametrize("fail_on, expected", [
    (FailOn.ERROR, {"DFD201": "failed", "DFD102": "passed", "DFD103": "passed"}),
    (FailOn.WARNING, {"DFD201": "failed", "DFD102": "failed", "DFD103": "passed"}),
    (FailOn.INFO, {"DFD201": "failed", "DFD102": "failed", "DFD103": "failed"}),
    (FailOn.NEVER, {"DFD201": "passed", "DFD102": "passed", "DFD103": "passed"}),
])
def test_red_and_green_follow_fail_on(fail_on, expected):
    report = _mixed()
    root = _parse(report, report.exit_code(fail_on), fail_on)
    assert _outcomes(root) == expected
    assert root.get("failures") == str(sum(1 for v in expected.values() if v == "failed"))
    passed_info = next(c for c in root.iter("testcase") if c.get("name").startswith("DFD103"))
    if expected["DFD103"] == "passed":
        assert passed_info.find("system-out").text.startswith("info: DFD103")


def test_without_fail_on_the_exit_code_decides():
    report = _mixed()
    assert set(_outcomes(_parse(report, 0)).values()) == {"passed"}
    assert _outcomes(_parse(report, 1)) == {"DFD201": "failed", "DFD102": "failed", "DFD103": "passed"}
    only_info = Report("scan", findings=[lookup("DFD103").finding(path="a.py", line=3, column=1)])
    assert _outcomes(_parse(only_info, 1)) == {"DFD103": "failed"}


def test_the_cli_passes_fail_on_to_junit(tmp_path):
    # One DFD201 (error) and one DFD102 (warning): with --fail-on error only the error is a failing case.
    from tests.conftest import run_cli

    source = tmp_path / "train.py"
    source.write_text(
        "import threading\nimport torch\nfrom torch.utils.checkpoint import checkpoint\n"
        "step = torch.compile(lambda x: x)\n"
        "def work():\n    step(1)\n    checkpoint(work)\n"
        "threading.Thread(target=work).start()\n"
    )
    proc = run_cli("scan", str(source), "--format", "junit", "--fail-on", "error", timeout=60)
    root = ET.fromstring(proc.stdout)
    assert proc.returncode == 1, proc.stderr
    failed = [case.get("name").split()[0] for case in root.iter("testcase") if case.find("failure") is not None]
    assert failed == ["DFD201"]
    assert (root.get("tests"), root.get("failures")) == ("2", "1")
