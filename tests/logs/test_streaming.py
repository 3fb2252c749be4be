"""Constant memory on large logs (measured in a child process) and --follow on a file that grows."""
from __future__ import annotations

import json
import os
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


def _driver(steps):
    """should_stop for follow_file: runs the next file operation each time the reader has caught up, then stops."""
    calls = {"n": 0}

    def should_stop():
        if calls["n"] < len(steps):
            steps[calls["n"]]()
        calls["n"] += 1
        return calls["n"] > len(steps) + 1

    return should_stop


def death(thread):
    return f"Exception in thread {thread}:\n_queue.Empty\n"


def test_follow_survives_rotation_without_losing_the_lines_written_before_it(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(death("x-0"))

    def append_then_rotate():
        with open(log, "a") as out:
            out.write(death("y-0"))  # written after the reader caught up, just before the rename
        log.rename(tmp_path / "train.log.1")
        log.write_text(death("z-0"))

    report = follow_file(str(log), LogOptions(), should_stop=_driver([append_then_rotate]), sleep=lambda s: None)
    assert sorted((f.evidence["thread"], f.line) for f in report.findings) == [("x-0", 2), ("y-0", 4), ("z-0", 2)]
    assert report.facts["restarts"] == 1


def test_follow_waits_through_delete_and_recreate(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(death("x-0"))
    steps = [log.unlink, lambda: None, lambda: log.write_text(death("z-0"))]
    report = follow_file(str(log), LogOptions(), should_stop=_driver(steps), sleep=lambda s: None)
    assert sorted(f.evidence["thread"] for f in report.findings) == ["x-0", "z-0"]


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(60)
def test_follow_cli_survives_the_file_being_deleted_and_recreated(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(death("x-0"))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "dflash_doctor", "logs", str(log), "--follow", "--max-seconds", "4",
                             "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO)
    time.sleep(1.5)
    log.unlink()
    time.sleep(0.5)
    log.write_text(death("z-0"))
    out, err = proc.communicate(timeout=40)
    assert proc.returncode == 1, err
    doc = json.loads(out)
    assert sorted(f["evidence"]["thread"] for f in doc["findings"]) == ["x-0", "z-0"]
    assert "internal error" not in err


EVENTS = (
    ["Exception in thread {t}:", "Traceback (most recent call last):", '  File "/w/train.py", line 640, in run',
     "    out = flex(q, k, v)", "RuntimeError: Detected that you are using FX to symbolically trace a "
     "dynamo-optimized function. This is not supported at the moment."],
    ["Exception in thread {t}:", "Traceback (most recent call last):", '  File "/w/train.py", line 702, in run',
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 80 GiB"],
    ["Exception in thread {t}:", "Traceback (most recent call last):", "_queue.Empty"],
)


def sampled_log(seed: int, size: int) -> bytes:
    import random

    rnd = random.Random(seed)
    alive = [f"drafter-{n}" for n in range(8)]
    lines, step = [], 0
    while sum(len(line) + 1 for line in lines) < size:
        step += 1
        lines += [f"2026-11-29 09:00:00 INFO [{t}] step={step} loss=2.1 {7 + rnd.random():.2f} Ktok/s" for t in alive]
        lines.append(f"2026-11-29 09:00:00 INFO loader refilled queue {step}")
        if len(alive) > 2 and rnd.random() < 0.002:
            victim = alive.pop(rnd.randrange(len(alive)))
            lines += [line.format(t=victim) for line in rnd.choice(EVENTS)]
        if rnd.random() < 0.001:
            lines.append(f"[rank{rnd.randrange(8)}]:[E1129 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught "
                         "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600067 "
                         "milliseconds before timing out.")
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_large_blocks_find_every_death_exactly_as_line_by_line(seed):
    # Blocks over 64 KiB go through the prefilter and sample progress; deaths, their lines, causes and the last
    # step each dead worker logged must not depend on that.
    import io

    from dflash_doctor.logs.reader import iter_lines
    from dflash_doctor.logs.scanner import LogScanner
    from dflash_doctor.logs.source import scan_stream

    data = sampled_log(seed, 1_500_000)
    sampled = scan_stream(io.BytesIO(data), "big.log", LogOptions())
    assert sampled.facts["progress_sampled"]
    exact = LogScanner("big.log", LogOptions())
    for lineno, raw in enumerate(iter_lines(io.BytesIO(data)), start=1):
        exact.feed(raw, lineno)
    full = exact.finish()

    def events(report):
        return sorted((f.code, f.line, f.message) for f in report.findings if f.code not in ("DFD503", "DFD507"))

    def died(report):
        return {name: t["died"] for name, t in report.facts["threads"].items() if t["died"]}

    assert events(sampled) == events(full) and len(events(full)) >= 2
    assert died(sampled) == died(full)
