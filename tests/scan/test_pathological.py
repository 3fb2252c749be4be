"""Sources built to hurt: a file that does not compile never passes for clean, and a huge one-line file scans in
time linear in its size with a bounded list of findings."""
from __future__ import annotations

import json
import time

import pytest

from dflash_doctor.rules.scan import CHECKPOINT_USE_REENTRANT_IMPLICIT
from dflash_doctor.scan import scan_paths
from dflash_doctor.scan.context import MAX_FINDINGS_PER_FILE

# Line 3 is indented with a tab after line 2's spaces: `python` raises TabError. No rule's trigger is in it.
TAB_ERROR = "def step(x):\n        y = x + 1\n\treturn y\n"
TAB_REASON = "syntax error at line 3: inconsistent use of tabs and spaces in indentation"


@pytest.mark.timeout(60)
def test_a_tab_error_named_on_the_command_line_is_a_problem(cli, tmp_path):
    (tmp_path / "t.py").write_text(TAB_ERROR)
    run = cli("scan", tmp_path / "t.py", "--format", "json", timeout=60)
    assert run.returncode == 4, run.stderr
    assert [p["reason"] for p in json.loads(run.stdout)["problems"]] == [TAB_REASON]


@pytest.mark.timeout(60)
def test_a_tab_error_found_by_walking_is_a_problem_too(tmp_path):
    (tmp_path / "t.py").write_text(TAB_ERROR)
    (tmp_path / "ok.py").write_text("def step(x):\n\treturn x\n")  # tabs only: valid
    report = scan_paths([str(tmp_path)], jobs=1)
    assert [(p.subject, p.reason) for p in report.problems] == [(str(tmp_path / "t.py"), TAB_REASON)]
    assert report.findings == []


@pytest.mark.timeout(60)
def test_a_syntax_error_named_on_the_command_line_is_a_problem_without_any_trigger(tmp_path):
    (tmp_path / "t.py").write_text("def step(x)\n    return x\n")
    report = scan_paths([str(tmp_path / "t.py")], jobs=1)
    assert [p.reason for p in report.problems] == ["syntax error at line 1: expected ':'"]


@pytest.mark.timeout(120)
def test_one_line_of_forty_thousand_calls_is_linear_and_its_findings_are_capped(cli, tmp_path):
    # Before the fix 20,000 such calls took 142 s (each finding re-normalised and re-hashed the whole line).
    calls = 40_000
    (tmp_path / "gen.py").write_text(
        "from torch.utils.checkpoint import checkpoint\n" + "; ".join(["checkpoint(f, x)"] * calls) + "\n")
    started = time.monotonic()
    run = cli("scan", tmp_path / "gen.py", "--format", "json", timeout=120)
    elapsed = time.monotonic() - started
    assert run.returncode == 5, run.stderr  # findings (1) and a problem (4)
    document = json.loads(run.stdout)
    assert len(document["findings"]) == MAX_FINDINGS_PER_FILE
    assert {f["code"] for f in document["findings"]} == {CHECKPOINT_USE_REENTRANT_IMPLICIT.code}
    assert len({f["evidence"]["fingerprint"] for f in document["findings"]}) == MAX_FINDINGS_PER_FILE
    assert document["problems"] == [{
        "subject": str(tmp_path / "gen.py"),
        "reason": f"{calls - MAX_FINDINGS_PER_FILE:,} more findings not listed: a file lists at most "
                  f"{MAX_FINDINGS_PER_FILE:,}",
        "hint": "generated code? exclude it with --exclude"}]
    assert elapsed < 60, f"{elapsed:.1f} s for {calls:,} calls on one line"
