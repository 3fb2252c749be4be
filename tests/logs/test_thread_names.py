"""Thread names from the formats trainers print: a logger record naming the thread that caught and logged an error
(fixtures/logs/logged/*.log: real output of fixtures/logs/programs/logged_errors.py under four logging formats),
a per-GPU tag on every line, a thread's traceback without its header."""
from __future__ import annotations

import pytest

from dflash_doctor.logs.logged import UNKNOWN_THREAD, logged_by
from tests.logs.test_scan import scan_fixture, scan_text


def dead(report):
    return sorted(name for name, facts in report.facts["threads"].items() if facts["died"])


@pytest.mark.parametrize("name", ["bracketed_thread", "colon_separated", "all_bracketed", "dash_separated"])
def test_a_caught_and_logged_error_is_an_error_of_the_thread_the_record_names_not_a_death(name):
    report = scan_fixture(f"logged/{name}.log")
    assert sorted((f.code, f.evidence["thread"], f.evidence["caught"]) for f in report.findings) == [
        ("DFD501", "gpu-worker-1", True), ("DFD518", "gpu-worker-2", True)]
    assert dead(report) == []
    assert report.facts["threads"]["gpu-worker-1"]["last_step"] == 4  # it went on after the error


@pytest.mark.parametrize("record,thread", [
    ("2026-12-06 08:06:29,400 drafter-1 ERROR trainer: drafter step 2 failed", "drafter-1"),
    ("ERROR 2026-12-06 08:06:32,497 [ThreadPoolExecutor-0_1] shard 0 failed", "ThreadPoolExecutor-0_1"),
    ("2026-12-06 08:06:29,400 [Thread-3 (fill)] WARNING: retrying the batch", "Thread-3 (fill)"),
    ("ERROR:gpu-worker-1:drafter:step 2 failed", "gpu-worker-1"),
    # not a thread's record: the main thread's, a record with no thread, vLLM's file:line, an info line
    ("2026-12-06 08:06:29,400 MainThread ERROR trainer: failed", None),
    ("ERROR:root:something broke", None),
    ("ERROR 05-04 12:23:00 [multiproc_executor.py:380] WorkerProc hit an exception", None),
    ("2026-12-06 08:06:29,400 drafter-1 INFO trainer: step=2", None),
])
def test_the_thread_a_logger_record_names(record, thread):
    assert logged_by(record) == thread


def test_a_gpu_tag_on_a_tracebacks_lines_names_its_worker_and_the_others_go_on():
    report = scan_fixture("logged/gpu_tagged_threads.log")
    assert [(f.code, f.evidence["thread"], f.line) for f in report.findings] == [("DFD513", "gpu2", 9)]
    assert dead(report) == ["gpu2"]
    assert sorted(report.facts["threads"]) == ["gpu0", "gpu1", "gpu2"]  # the tag names the others' lines too


def test_a_threads_traceback_without_its_header_is_an_unknown_threads_death_not_mains():
    report = scan_fixture("logged/unnamed_thread_frames.log")
    assert [(f.code, f.evidence["thread"]) for f in report.findings] == [("DFD508", UNKNOWN_THREAD)]
    assert dead(report) == [UNKNOWN_THREAD]


def test_the_main_threads_own_traceback_stays_mains():
    report = scan_text('Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
                       "    main()\nValueError: bad config\n")
    assert [(f.code, f.evidence["thread"]) for f in report.findings] == [("DFD513", "main")]
