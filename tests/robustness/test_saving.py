"""`pipeline --save DIR`: checked before training, a failed save is reported as a failed save, and what a
kill -9 during a save left behind is removed by the next start. Real saves, a real file-size limit
(`ulimit -f`), a real process killed with SIGKILL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.robustness.harness import assert_one_error_line, run

TINY = ["pipeline", "--device", "cpu", "--preset", "tiny", "--steps", "2"]


@pytest.mark.timeout(120)
def test_a_drafter_pt_that_is_a_folder_fails_before_training(tmp_path):
    (tmp_path / "ckpt" / "drafter.pt").mkdir(parents=True)
    result = run(*TINY, "--save", tmp_path / "ckpt", cwd=tmp_path, timeout=90, limit_memory=False)
    assert_one_error_line(result, 2, "drafter.pt is a folder")
    assert "step=" not in result.stderr  # no training happened


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(200)
def test_a_full_disk_during_the_save_is_a_failed_save_not_a_dead_worker(tmp_path):
    """`ulimit -f 64` (KiB): the checkpoint cannot be written, the training itself ended well."""
    result = run(*TINY, "--save", tmp_path / "ckpt", "-f", "json", cwd=tmp_path, timeout=180, limit_memory=False,
                 file_size=64 * 1024)
    document = json.loads(result.stdout)
    assert result.returncode == 4, result
    assert document["findings"] == [], document["findings"]  # no DFD801 "died in training"
    [problem] = document["problems"]
    assert problem["subject"] == f"--save {tmp_path / 'ckpt'}" and "File too large" in problem["reason"]
    assert document["facts"]["saved_to"] is None
    assert all(w["outcome"] == "ok" for w in document["facts"]["workers"]), document["facts"]["workers"]
    assert os.listdir(tmp_path / "ckpt") == [], "a temporary or a torn checkpoint was left"


def _temporary_of_a_writer(folder, killed: bool):
    """A real process that opens a save temporary as save_drafter names it; killed with SIGKILL mid-write,
    or left running (a save in progress)."""
    code = ("import os, sys, time; path = os.path.join(sys.argv[1], f'.drafter.pt.{os.getpid()}.abcd1234.tmp'); "
            "open(path, 'wb').write(b'half a checkpoint'); print(path, flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    path = proc.stdout.readline().strip()
    if killed:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    return proc, path


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(200)
def test_the_next_start_removes_what_a_killed_save_left_and_only_that(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    _, left_by_the_dead = _temporary_of_a_writer(folder, killed=True)
    live, in_progress = _temporary_of_a_writer(folder, killed=False)
    try:
        result = run(*TINY, "--save", folder, "-f", "json", cwd=tmp_path, timeout=180, limit_memory=False)
        assert result.returncode == 0, result
        assert not os.path.exists(left_by_the_dead)
        assert os.path.exists(in_progress), "a live writer's temporary was removed"
        assert sorted(os.listdir(folder)) == sorted(["drafter.pt", os.path.basename(in_progress)])
        resumed = run(*TINY, "--save", folder, "--resume", "-f", "json", cwd=tmp_path, timeout=180,
                      limit_memory=False)
        assert resumed.returncode == 0 and json.loads(resumed.stdout)["facts"]["start_step"] == 2, resumed
    finally:
        live.kill()
        live.wait(10)
