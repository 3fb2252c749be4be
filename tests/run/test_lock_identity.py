"""`run` compares locks by the object, not by the text that names them (real threads, real locks, real processes):
a healthy pipeline whose three stages each use `self.lock` is never a deadlock, while a ring of three locks and a
deadlock through `.acquire()` are named and killed on request."""
from __future__ import annotations

import json
import signal
import sys

import pytest

from tests.run.helpers import program


def _findings(path):
    return json.loads(path.read_text())["findings"]


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(90)
def test_three_stages_each_using_self_lock_run_to_the_end_and_are_no_deadlock(cli, tmp_path):
    # Before locks were told apart by identity this program was killed with 137 as a lock-order cycle.
    out = tmp_path / "run.json"
    proc = cli("run", "--on-hang", "kill", "-f", "json", "-o", out, "--", sys.executable,
               program("stage_pipeline.py"), "8", timeout=80)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("packed ")
    assert _findings(out) == []


@pytest.mark.timeout(90)
@pytest.mark.parametrize("script, threads, holds", [
    ("lock_ring.py", ["stage-0", "stage-1", "stage-2"], "locks[i]"),
    ("acquire_transfer.py", ["pay-alice", "pay-bob"], "source.lock"),
])
@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
def test_a_ring_of_three_locks_and_an_acquire_deadlock_are_named_and_killed(cli, tmp_path, script, threads, holds):
    out = tmp_path / "run.json"
    proc = cli("run", "--on-hang", "kill", "-f", "json", "-o", out, "--", sys.executable, program(script),
               timeout=80)
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    finding, = _findings(out)
    assert finding["code"] == "DFD903"
    assert sorted(finding["evidence"]["threads"]) == threads
    assert all(f"{name} holds {holds} and waits for" in " ".join(finding["evidence"]["chain"]) for name in threads)
    assert finding["path"].endswith(script)


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(90)
def test_two_threads_queued_behind_a_slow_holder_are_never_a_deadlock(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "--on-hang", "kill", "-f", "json", "-o", out, "--", sys.executable,
               program("slow_holder.py"), "6", timeout=80)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "done"
    assert _findings(out) == []
