"""`dflash-doctor logs` as a user runs it: exit codes, JSON, stdin, --follow bounded by --max-seconds."""
from __future__ import annotations

import pytest

from tests.conftest import REPO, run_cli, run_cli_json

FIXTURES = REPO / "fixtures" / "logs"


@pytest.mark.timeout(60)
def test_seed_lines_from_stdin():
    proc, doc = run_cli_json("logs", "-", input=(FIXTURES / "seed003_grep.log").read_text())
    assert proc.returncode == 1
    assert [(f["code"], f["evidence"]["thread"], f["path"], f["line"]) for f in doc["findings"]] == [
        ("DFD501", "drafter-0", "<stdin>", 3)]
    assert doc["facts"]["threads"]["drafter-0"]["died"]["code"] == "DFD501"


@pytest.mark.timeout(60)
def test_clean_log_exits_0_and_fail_on_error_ignores_warnings(tmp_path):
    log = tmp_path / "ok.log"
    log.write_text("".join(f"[drafter-0] step={n} 7.1 Ktok/s\n" for n in range(1, 30)))
    assert run_cli("logs", log).returncode == 0
    proc = run_cli("logs", FIXTURES / "full_run.log", "--fail-on", "error")
    assert proc.returncode == 1  # DFD501 is an error
    proc = run_cli("logs", FIXTURES / "oom_dense.log", "--fail-on", "never")
    assert proc.returncode == 0


@pytest.mark.timeout(60)
def test_follow_is_bounded_and_reports_live_then_in_full(tmp_path):
    log = tmp_path / "train.log"
    log.write_text((FIXTURES / "seed003_grep.log").read_text())
    proc, doc = run_cli_json("logs", log, "--follow", "--max-seconds", "0.5")
    assert proc.returncode == 1
    assert [(f["code"], f["line"]) for f in doc["findings"]] == [("DFD501", 3)]
    live = [line for line in proc.stderr.splitlines() if " DFD501 " in line]
    assert len(live) == 1 and live[0].startswith(f"{log}:3:")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, message", [
    (["-", "--follow"], "--follow needs a file"),
    ([str(FIXTURES / "missing.log")], "cannot read"),
    ([str(FIXTURES / "full_run.log"), "--thread-pattern", "(oops"], "--thread-pattern"),
    ([str(FIXTURES / "full_run.log"), "--drop", "1.5"], "--drop"),
])
def test_usage_errors(args, message):
    proc = run_cli("logs", *args, input="")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr and "Traceback" not in proc.stderr
