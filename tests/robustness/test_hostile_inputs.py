"""Inputs that are not regular files never hang a command or fill memory: a FIFO nobody writes, /dev/zero (as
a file, or as a `.py` symlink in a scanned folder). Each ends within its bound with a problem or a usage error
naming the input, never a traceback; what else was asked for is still checked."""
from __future__ import annotations

import json
import os

import pytest

from tests.robustness.harness import assert_no_crash, run

BOUND_S = 5  # every case below answers in well under a second once fixed; a hang is killed here


@pytest.fixture
def hostile(tmp_path):
    """A folder with one good file, a FIFO and a /dev/zero symlink, each named like a source file."""
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "good.py").write_text("import torch\ntorch.utils.checkpoint.checkpoint(f, x, use_reentrant=True)\n")
    os.mkfifo(folder / "fifo.py")
    (folder / "zero.py").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.log")
    return tmp_path


def _refused(result, name: str) -> None:
    """Ended without a crash, with exit 2 (one line) or the problems bit, naming the input."""
    assert_no_crash(result)
    assert result.returncode == 2 or result.returncode & 4, result
    assert name in result.stderr, result


@pytest.mark.parametrize("command", ["scan", "check"])
def test_scan_of_a_folder_with_a_fifo_and_dev_zero_reports_both_and_scans_the_rest(hostile, command):
    extra = ["--no-probes"] if command == "check" else []
    result = run(command, hostile / "src", *extra, "--format", "json", timeout=BOUND_S)
    document = json.loads(result.stdout)
    assert result.returncode & 4, result
    subjects = " ".join(p["subject"] for p in document["problems"])
    assert "fifo.py" in subjects and "zero.py" in subjects, document["problems"]
    assert [f["code"] for f in document["findings"] if f["path"] and f["path"].endswith("good.py")] == ["DFD101"]


def test_scan_of_a_fifo_named_directly(hostile):
    _refused(run("scan", hostile / "src" / "fifo.py", timeout=BOUND_S), "fifo.py")


def test_report_of_a_folder_with_a_fifo_is_written(hostile):
    result = run("report", hostile / "src", "--no-probes", timeout=BOUND_S)
    assert_no_crash(result)
    assert result.returncode == 0 and "fifo.py" in result.stdout, result


@pytest.mark.parametrize("source", ["/dev/zero", "FIFO"])
def test_report_refuses_a_repro_json_that_is_not_a_regular_file(hostile, source):
    path = hostile / "fifo.log" if source == "FIFO" else source
    result = run("report", hostile / "src" / "good.py", "--no-probes", "--repro-json", path, timeout=BOUND_S)
    assert result.returncode == 2 and "not a regular file" in result.stderr, result
    assert_no_crash(result)


@pytest.mark.parametrize("source", ["/dev/zero", "FIFO"])
def test_logs_of_a_device_or_a_fifo_without_writer(hostile, source):
    path = hostile / "fifo.log" if source == "FIFO" else source
    _refused(run("logs", path, timeout=BOUND_S), str(path))


@pytest.mark.parametrize("source", ["/dev/zero", "FIFO"])
def test_gpus_from_a_device_or_a_fifo_without_writer(hostile, source):
    path = hostile / "fifo.log" if source == "FIFO" else source
    _refused(run("gpus", "--from", path, timeout=BOUND_S), str(path))


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run); a million rows through the CLI
def test_gpus_from_stdin_is_capped():
    from dflash_doctor.gpus.csv_snapshot import MAX_ROWS

    # Past the row cap (a day of `nvidia-smi -l 1` on 8 GPUs), within the harness's memory limit and time bound:
    # readings are folded per GPU as they stream, so memory stays flat, and the rest is a problem, not a read.
    flood = b"0, 1000, 50\n" * (MAX_ROWS + 10)
    result = run("gpus", "--from", "-", stdin=flood, timeout=BOUND_S * 2)
    assert result.returncode & 4, result
    assert f"more than {MAX_ROWS:,} rows" in result.stderr


def test_a_regular_file_still_works_beside_them(hostile):
    result = run("scan", hostile / "src" / "good.py", "--format", "json", timeout=BOUND_S)
    assert result.returncode == 1 and [f["code"] for f in json.loads(result.stdout)["findings"]] == ["DFD101"]
