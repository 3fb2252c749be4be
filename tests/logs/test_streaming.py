"""Constant memory on large logs (measured in a child process) and --follow on a file that grows."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from dflash_doctor.logs.options import LogOptions
from dflash_doctor.logs.source import follow_file
from tests.conftest import REPO

# Writes a log of about SIZE bytes shaped like a real run (progress of 8 threads, info noise, a thread death every
# few thousand lines), then scans it and prints how much the peak RSS grew during the scan.
MEASURE = r'''
import json, resource, sys
sys.path.insert(0, sys.argv[3])
from dflash_doctor.logs.options import LogOptions
from dflash_doctor.logs.source import scan_stream

path, size = sys.argv[1], int(sys.argv[2])
with open(path, "w") as out:
    written, step = 0, 0
    while written < size:
        lines = []
        for _ in range(100):
            step += 1
            lines += [f"2026-11-29 09:00:00 INFO [worker-{t}] step={step} loss=2.{step % 97:02d} "
                      f"{7 + (step * t) % 3}.{step % 10} Ktok/s" for t in range(8)]
            lines.append(f"2026-11-29 09:00:00 INFO data loader refilled queue {step}, 128 samples")
        lines += [f"Exception in thread worker-{8 + step // 100}:", "Traceback (most recent call last):",
                  '  File "/w/train.py", line 10, in run', "    boom()", f"ValueError: batch {step} is bad"]
        text = "\n".join(lines) + "\n"
        out.write(text)
        written += len(text)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with open(path, "rb") as handle:
    report = scan_stream(handle, path, LogOptions())
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_kib": after - before, "lines": report.facts["lines"],
                  "findings": len(report.findings), "suppressed": report.facts["suppressed"]}))
'''


def measure(tmp_path, size):
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path / f"log{size}"), str(size), str(REPO)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.timeout(240)
def test_memory_stays_flat_as_the_log_grows(tmp_path):
    small, large = measure(tmp_path, 1_500_000), measure(tmp_path, 6_000_000)
    assert large["lines"] > 3.5 * small["lines"]
    assert large["findings"] > 3.5 * small["findings"]  # one DFD508 per dead worker
    # Holding the 6 MB log, or its lines, would grow RSS by 6 MiB or more beyond the small run; streaming stays
    # within the 1 MiB read chunk, bounded per-thread state and the per-rule finding cap.
    assert large["growth_kib"] < small["growth_kib"] + 3 * 1024, (small, large)
    assert large["growth_kib"] < 8 * 1024, (small, large)


def test_follow_sees_lines_as_they_are_written(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("[drafter-0] step=1 7.1 Ktok/s\n")
    seen, done = [], threading.Event()

    def writer():
        with open(log, "a") as out:
            time.sleep(0.2)
            out.write("Exception in thread drafter-0:\n    raise RuntimeError(\n")
            out.flush()
            time.sleep(0.2)
            out.write("RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized "
                      "function. This is not supported at the moment.\n")
            out.flush()
        done.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    # stop once the writer is done and the finding has been delivered live (or at the deadline)
    report = follow_file(str(log), LogOptions(), should_stop=lambda: (done.is_set() and seen)
                         or time.monotonic() > deadline, on_findings=seen.extend, poll=0.05)
    thread.join(timeout=10)
    assert [(f.code, f.line, f.evidence["thread"]) for f in seen] == [("DFD501", 4, "drafter-0")]
    assert [(f.code, f.line) for f in report.findings] == [("DFD501", 4)]
    assert time.monotonic() < deadline


def test_follow_rereads_a_truncated_file(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("filler line\n" * 50)
    calls = {"n": 0}

    def truncate_then_stop():
        calls["n"] += 1
        if calls["n"] == 1:
            log.write_text("Exception in thread target-1:\n_queue.Empty\n")
        return calls["n"] > 3

    report = follow_file(str(log), LogOptions(), should_stop=truncate_then_stop, sleep=lambda s: None)
    # line numbers restart with the new file content, so they still point into the log
    assert [(f.code, f.line) for f in report.findings] == [("DFD508", 2)]
