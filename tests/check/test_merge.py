"""run_check composes the parts' Reports: findings and problems merged, facts kept per part, and a part whose
dependency is missing becomes a Problem while the others still run."""
from __future__ import annotations

import itertools

import pytest

from dflash_doctor.check import CheckPlan, default_parts, run_check
from dflash_doctor.errors import MissingDependency, UsageError
from dflash_doctor.findings import EXIT_FINDINGS, EXIT_PROBLEMS, FailOn, Problem, Report, Severity
from dflash_doctor.rules import lookup


def _ticks(step=0.5):
    counter = itertools.count()
    return lambda: next(counter) * step


def _scan():
    return Report("scan", findings=[lookup("DFD201").finding(path="train.py", line=9, column=1)],
                  facts={"files": 3})


def _guards():
    return Report("guards", findings=[lookup("DFD601").finding(evidence={"torch": "2.13.0"})],
                  facts={"verdict": "vulnerable"})


def _no_torch():
    raise MissingDependency("the guards need torch, which is not importable here; install it with: pip install torch")


def test_parts_merge_in_order_with_their_facts():
    report = run_check(parts={"guards": _guards, "scan": _scan}, clock=_ticks())
    assert report.command == "check"
    assert report.findings == [_scan().findings[0], _guards().findings[0]]
    assert report.facts == {
        "parts": ["scan", "guards"],
        "seconds": {"scan": 0.5, "guards": 0.5},
        "scan": {"files": 3},
        "guards": {"verdict": "vulnerable"},
        "environment_findings": "as reported",
    }
    assert report.exit_code(FailOn.WARNING) == EXIT_FINDINGS
    assert report.exit_code(FailOn.NEVER) == 0


def test_environment_findings_are_downgraded_when_no_thread_calls_compiled_code():
    clean_scan = Report("scan", facts={"files": 3})
    report = run_check(parts={"scan": lambda: clean_scan, "guards": _guards}, clock=_ticks())
    [finding] = report.findings
    assert (finding.code, finding.severity, finding.message) == ("DFD601", Severity.INFO, _guards().findings[0].message)
    assert finding.evidence["torch"] == "2.13.0" and finding.evidence["severity_from_rule"] == "error"
    assert finding.evidence["check"].startswith("downgraded to info by check")
    assert report.facts["environment_findings"] == "downgraded to info (no DFD201)"
    assert report.exit_code(FailOn.WARNING) == 0
    assert report.exit_code(FailOn.INFO) == EXIT_FINDINGS


def test_assume_threads_or_a_missing_scan_keep_environment_findings_at_full_severity():
    clean_scan = Report("scan")
    kept = run_check(CheckPlan(assume_threads=True), parts={"scan": lambda: clean_scan, "guards": _guards})
    assert [f.severity for f in kept.findings] == [Severity.ERROR]

    def scan_cannot_run():
        raise MissingDependency("scan needs something")

    unknown = run_check(parts={"scan": scan_cannot_run, "guards": _guards})
    assert [f.severity for f in unknown.findings] == [Severity.ERROR]
    assert unknown.facts["environment_findings"] == "as reported"


def test_missing_torch_turns_the_guards_into_a_problem_and_the_scan_still_runs():
    report = run_check(parts={"scan": _scan, "guards": _no_torch}, clock=_ticks())
    assert [f.code for f in report.findings] == ["DFD201"]
    [problem] = report.problems
    assert problem.subject == "guards" and "pip install torch" in problem.reason
    assert "the scan ran without it" in problem.hint
    assert report.facts["parts"] == ["scan"] and "guards" not in report.facts
    assert report.exit_code(FailOn.WARNING) == EXIT_FINDINGS | EXIT_PROBLEMS


def test_a_plain_import_error_of_a_dependency_is_a_problem_too():
    def needs_triton():
        raise ModuleNotFoundError("No module named 'triton'", name="triton")

    report = run_check(parts={"scan": lambda: Report("scan"), "guards": needs_triton}, clock=_ticks())
    assert [p.subject for p in report.problems] == ["guards"]
    assert report.problems[0].reason.startswith("needs triton, which is not importable here")


def test_a_broken_install_of_our_own_package_is_not_hidden():
    def broken():
        raise ModuleNotFoundError("No module named 'dflash_doctor.guards'", name="dflash_doctor.guards")

    with pytest.raises(ModuleNotFoundError):
        run_check(parts={"guards": broken})


def test_usage_errors_propagate():
    def bad_path():
        raise UsageError("no such file or folder: nope/")

    with pytest.raises(UsageError):
        run_check(parts={"scan": bad_path, "guards": _guards})


def test_a_parts_own_exit_code_contract_does_not_leak():
    repro = Report("repro", problems=[], facts={"verdict": "not reproduced"}, exit_code_override=3)
    report = run_check(parts={"scan": lambda: Report("scan"), "repro": lambda: repro}, clock=_ticks())
    assert report.exit_code(FailOn.WARNING) == 0
    assert report.facts["parts"] == ["scan", "repro"]


def test_problems_of_a_part_that_ran_are_kept():
    scan = Report("scan", problems=[Problem("broken.py", "SyntaxError: invalid syntax (line 3)")])
    report = run_check(parts={"scan": lambda: scan}, clock=_ticks())
    assert report.problems == scan.problems and report.facts["parts"] == ["scan"]


def test_the_plan_decides_which_real_parts_run():
    assert list(default_parts(CheckPlan())) == ["scan", "guards"]
    assert list(default_parts(CheckPlan(repro=True))) == ["scan", "guards", "repro"]


def test_a_signal_keeps_the_finished_parts_and_says_what_did_not_finish():
    def interrupted():
        raise KeyboardInterrupt

    report = run_check(parts={"scan": _scan, "guards": _guards, "repro": interrupted}, clock=_ticks())
    # The JSON's order: the finished parts' facts, then `partial`, then the environment verdict.
    assert list(report.facts) == ["parts", "seconds", "scan", "guards", "partial", "environment_findings"]
    assert report.facts["parts"] == ["scan", "guards"] and "repro" not in report.facts["seconds"]
    assert report.facts["partial"] == {"stopped_by": "SIGINT", "unfinished": "part repro did not finish"}
    assert report.stopped_by == "SIGINT" and report.exit_code(FailOn.WARNING) == 130
    assert [p.subject for p in report.problems] == ["check"]
