"""The fixture tree: the scan reports exactly the inline markers, the broken files as problems, and exit 5."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from dflash_doctor.rules.scan import SCAN_RULES
from dflash_doctor.scan import scan_paths

REPO = Path(__file__).resolve().parents[2]
FIXTURES = "fixtures/scan"
# `# DFD101:12` or `# DFD101:12, DFD201:5`: code and 1-based column (flake8-bugbear's eval-file style), so a column
# regression (SARIF consumers place annotations by it) fails here.
MARKER = re.compile(r"#\s*(DFD\d{3}:\d+(?:\s*,\s*DFD\d{3}:\d+)*)\s*$")
LOOSE_MARKER = re.compile(r"#\s*DFD\d{3}\b")
BROKEN = {"fixtures/scan/broken_syntax.py", "fixtures/scan/latin1_bytes.py"}
SKIPPED_DIRS = ("node_modules", "site-packages", "vendored_env")


def fixture_files() -> list:
    """The .py files the scan of the fixture tree reads (the skipped folders left out; the broken files in)."""
    return [path for path in sorted((REPO / FIXTURES).rglob("*.py"))
            if not any(part in SKIPPED_DIRS for part in path.relative_to(REPO).parts)]


def expected_markers() -> set:
    expected = set()
    for path in fixture_files():
        relative = path.relative_to(REPO).as_posix()
        if relative in BROKEN:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            match = MARKER.search(line)
            if match:
                for marker in match.group(1).split(","):
                    code, column = marker.strip().split(":")
                    expected.add((relative, number, int(column), code))
            else:
                assert not LOOSE_MARKER.search(line), f"{relative}:{number}: a marker without its column"
    return expected


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def test_markers_cover_every_rule():
    # every rule that judges files (DFD302 is judged after them, on noqa comments, and has its own tests)
    assert {code for _, _, _, code in expected_markers()} == {
        code for code, entry in SCAN_RULES.items() if not entry.after_files}


@pytest.mark.parametrize("jobs,parallel_min_files", [(1, 96), (2, 1)], ids=["in-process", "process-pool"])
def test_fixture_scan_reports_exactly_the_markers(jobs, parallel_min_files):
    report = scan_paths([FIXTURES], jobs=jobs, parallel_min_files=parallel_min_files, transformers=lambda: None)
    found = {(f.path.replace(os.sep, "/"), f.line, f.column, f.code) for f in report.findings}
    assert found == expected_markers()
    assert {p.subject.replace(os.sep, "/") for p in report.problems} == BROKEN
    reasons = {p.subject.replace(os.sep, "/"): p.reason for p in report.problems}
    assert reasons["fixtures/scan/broken_syntax.py"] == "syntax error at line 4: expected ':'"
    assert reasons["fixtures/scan/latin1_bytes.py"] == "cannot decode as utf-8: byte 0xe9 at line 1"
    assert report.exit_code() == 5
    assert report.facts["jobs"] == jobs
    # drafter/loops.py, drafter/model.py, workers/fused.py, workers/jit.py, programs/split/src/model.py and
    # tracing/tracers.py hold no trigger word: only the call-graph pass reads them; flexproj's layers are judged
    # against the compile sites of bench.py and train.py. (a pool worker may also load a file another worker
    # parsed: at least those six)
    loaded = report.facts["loaded_for_call_chains"]
    assert loaded == 6 if jobs == 1 else loaded >= 6
    assert report.facts["loaded_for_flex_coverage"] >= 2
    assert report.facts["files"] == len(fixture_files())  # a fixture added for a new rule is counted, not typed


def test_weight_checkpointing_trainer_is_clean():
    report = scan_paths([f"{FIXTURES}/train_pipeline.py", f"{FIXTURES}/clean_step.py"])
    assert report.findings == [] and report.problems == []
    assert report.facts["parsed"] == 2


def test_thread_chain_evidence_crosses_files():
    report = scan_paths([FIXTURES], select="DFD201")
    by_line = {f.line: f for f in report.findings if f.path.endswith("pipeline.py")}
    nested = by_line[55]
    assert nested.evidence["chain"] == [
        "nested_loop (fixtures/scan/drafter/loops.py:13)",
        "compiled_loop (fixtures/scan/drafter/loops.py:5)",
        "fused_loss (fixtures/scan/drafter/model.py:15)",
    ]
    assert nested.evidence["compiled"] == {"name": "fused_loss", "path": "fixtures/scan/drafter/model.py", "line": 15}
    subclass = by_line[26]
    assert subclass.evidence["spawn"] == "Thread subclass"
    assert subclass.evidence["chain"][-1] == "Drafter.step_fn (fixtures/scan/drafter/model.py:27)"


@pytest.mark.timeout(120)
def test_cli_json_and_exit_code(cli):
    run = cli("scan", FIXTURES, "--format", "json")
    assert run.returncode == 5, run.stderr
    document = json.loads(run.stdout)
    assert document["command"] == "scan" and document["exit_code"] == 5
    found = {(f["path"], f["line"], f["column"], f["code"]) for f in document["findings"]}
    assert found == expected_markers()
    assert {p["subject"] for p in document["problems"]} == BROKEN
    assert document["facts"]["rule_counts"] == {
        code: sum(1 for marker in expected_markers() if marker[3] == code) for code in document["facts"]["rules"]}


@pytest.mark.timeout(120)
def test_cli_sarif_is_repo_relative_with_one_rule_per_code(cli):
    run = cli("scan", FIXTURES, "--format", "sarif")
    assert run.returncode == 5, run.stderr
    sarif = json.loads(run.stdout)
    assert sarif["version"] == "2.1.0"
    rules = sarif["runs"][0]["tool"]["driver"]["rules"]
    ids = [rule["id"] for rule in rules]
    assert len(ids) == len(set(ids))
    results = sarif["runs"][0]["results"]
    assert {r["ruleId"] for r in results} <= set(ids)
    located = {
        (r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
         r["locations"][0]["physicalLocation"]["region"]["startLine"],
         r["locations"][0]["physicalLocation"]["region"]["startColumn"], r["ruleId"])
        for r in results
    }
    assert located == expected_markers()
    for result in results:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]


@pytest.mark.timeout(120)
def test_cli_usage_errors_are_one_line(cli):
    missing = cli("scan", "no/such/folder")
    assert missing.returncode == 2
    assert missing.stderr.strip() == "dflash-doctor: error: no such file or directory: no/such/folder"
    unknown = cli("scan", FIXTURES, "--select", "DFD999")
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(120)
def test_cli_fail_on_and_select(cli):
    run = cli("scan", f"{FIXTURES}/aliases.py", "--fail-on", "error", "--format", "json")
    assert run.returncode == 0
    assert json.loads(run.stdout)["exit_code"] == 0
    run = cli("scan", f"{FIXTURES}/aliases.py", "--select", "DFD101", "--format", "json")
    assert {f["code"] for f in json.loads(run.stdout)["findings"]} == {"DFD101"}
    assert run.returncode == 1


def test_library_shapes_are_judged_on_supported_releases():
    report = scan_paths([f"{FIXTURES}/library_shapes.py"], jobs=1, transformers=lambda: None)
    assert [(f.line, f.code, f.severity.value) for f in report.findings] == [
        (22, "DFD102", "info"), (36, "DFD102", "warning"), (44, "DFD101", "warning"), (48, "DFD101", "warning"),
        (59, "DFD104", "warning"), (78, "DFD101", "warning"), (88, "DFD104", "warning")]
    old = report.findings[0]
    assert old.evidence["old_torch_only"] == (
        "in the else of `if is_torch_version('>=', '1.11.0')`, which needs torch < 1.11.0")
    assert old.message.endswith("torch.compile, and so the race, needs 2.0)")
