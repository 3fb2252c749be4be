"""`dflash-doctor gpus` as a user runs it: exit codes, JSON, one-line errors, no torch or pynvml on --from."""
from __future__ import annotations

import re

import pytest

from tests.conftest import REPO, run_cli, run_cli_json

SEED = REPO / "fixtures" / "gpus" / "seed003_snapshot.csv"


def codes(doc):
    return sorted((f["code"], f["evidence"]["gpu"], f["evidence"]["role"]) for f in doc["findings"])


@pytest.mark.timeout(60)
def test_seed_from_stdin_with_roles_and_capacity():
    proc, doc = run_cli_json("gpus", "--from", "-", "--roles", "target=0-4,drafter=5-7", "--memory-total", "96GiB",
                             input=SEED.read_text())
    assert proc.returncode == 1 and doc["exit_code"] == 1
    assert codes(doc) == [("DFD401", 5, "drafter"), ("DFD402", 0, "target"), ("DFD402", 3, "target"),
                          ("DFD402", 4, "target"), ("DFD403", 2, "target")]
    assert doc["findings"][0]["path"] == "<stdin>"


@pytest.mark.timeout(60)
def test_malformed_csv_lines_set_the_problem_bit():
    proc, doc = run_cli_json("gpus", "--from", REPO / "fixtures" / "gpus" / "malformed.csv")
    assert proc.returncode == 5
    assert [p["subject"].rsplit(":", 1)[1] for p in doc["problems"]] == ["2", "3", "4"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, message", [
    (["--roles", "target=4-0"], "runs backwards"),
    (["--roles", "target=0-4,drafter=3-7"], "GPU 3 is in both"),
    (["--memory-total", "lots"], "--memory-total"),
    (["--watch"], "--watch and --samples sample NVML live"),
    (["--columns", "index,memory.used"], "lacks utilization.gpu"),
])
def test_usage_errors_are_one_line_exit_2(args, message):
    proc = run_cli("gpus", "--from", SEED, *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.timeout(60)
def test_missing_file_is_a_usage_error():
    proc = run_cli("gpus", "--from", REPO / "fixtures" / "gpus" / "nope.csv")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cannot read" in proc.stderr


@pytest.mark.timeout(60)
def test_no_nvml_here_is_one_line_and_exit_4():
    pytest.importorskip("pynvml")
    proc, doc = run_cli_json("gpus", "--samples", "1")
    if not doc["problems"]:
        pytest.skip("this machine has GPUs")
    assert proc.returncode == 4 and doc["findings"] == []
    problem_lines = [line for line in proc.stderr.splitlines() if line.startswith("could not check")]
    assert len(problem_lines) == 1 and "NVML" in problem_lines[0] and "Traceback" not in proc.stderr


@pytest.mark.timeout(60)
def test_reading_a_csv_imports_neither_torch_nor_pynvml():
    proc = run_cli("gpus", "--from", SEED, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 1
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "dflash_doctor" in imported and not imported & {"torch", "pynvml"}


@pytest.mark.timeout(60)
def test_text_output_has_the_table_and_findings():
    proc = run_cli("gpus", "--from", SEED, "--roles", "target=0-4,drafter=5-7", "--fail-on", "never")
    assert proc.returncode == 0
    finding_lines = [line.split() for line in proc.stdout.splitlines() if re.match(r"^\S+:\d+:\d+: DFD", line)]
    assert [(words[0].rsplit(":", 3)[1], words[1]) for words in finding_lines] == [
        ("1", "DFD402"), ("4", "DFD402"), ("5", "DFD402"), ("6", "DFD401")]
