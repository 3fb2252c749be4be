"""The log scanner on the seeds' lines, full runs, real Python thread deaths, and its streaming edge cases."""
from __future__ import annotations

import io
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_doctor.errors import UsageError
from dflash_doctor.logs.worker_progress import ProgressTracker
from dflash_doctor.logs.reader import iter_lines
from dflash_doctor.logs.options import LogOptions
from dflash_doctor.logs.scanner import LogScanner
from dflash_doctor.logs.source import scan_stream
from tests.conftest import REPO

FIXTURES = REPO / "fixtures" / "logs"


def scan_text(text: str, **options):
    return scan_stream(io.BytesIO(text.encode() if isinstance(text, str) else text), "t.log", LogOptions(**options))


def scan_fixture(name):
    with open(FIXTURES / name, "rb") as handle:
        return scan_stream(handle, name, LogOptions())


def found(report):
    return sorted((f.code, f.evidence.get("thread"), f.evidence.get("gpu"), f.line) for f in report.findings)


def test_seed_grep_lines_give_the_fx_race_of_drafter_0():
    report = scan_fixture("seed003_grep.log")
    assert found(report) == [("DFD501", "drafter-0", None, 3)]
    assert report.findings[0].evidence["block_line"] == 1 and report.findings[0].path == "seed003_grep.log"
    death = report.facts["threads"]["drafter-0"]["died"]
    assert (death["exception"], death["code"], death["line"]) == ("RuntimeError", "DFD501", 3)


def test_full_run():
    report = scan_fixture("full_run.log")
    assert found(report) == [
        ("DFD501", "drafter-0", None, 66), ("DFD503", "main", None, 68), ("DFD506", "main", None, 52),
        ("DFD507", "drafter-2", None, 70)]
    by_code = {f.code: f for f in report.findings}
    drop = by_code["DFD503"].evidence
    assert (drop["from"], drop["to"], drop["from_line"]) == (21500.0, 14100.0, 68)
    assert by_code["DFD506"].evidence["function"] == "attend (/workspace/dflash_model.py:211)"
    assert by_code["DFD501"].evidence["last_step"] == 12
    threads = report.facts["threads"]
    assert {name: (t["last_step"], t["last_tok_s"]) for name, t in threads.items()} == {
        "drafter-0": (12, 7100.0), "drafter-1": (40, 7200.0), "drafter-2": (14, 7150.0), "main": (40, 14100.0)}
    assert threads["drafter-0"]["died"]["last_frame"] == (
        "/usr/lib/python3.12/site-packages/torch/_dynamo/eval_frame.py:843 in compile_wrapper")


def test_oom_inside_the_dense_path():
    report = scan_fixture("oom_dense.log")
    assert found(report) == [("DFD502", "drafter-1", 6, 9), ("DFD505", "main", None, 2)]
    assert report.facts["repeats"] == {"DFD505": 1}


def test_nccl_watchdog_one_finding_per_rank():
    report = scan_fixture("nccl_watchdog.log")
    assert sorted((f.code, f.evidence["rank"], f.line) for f in report.findings) == [
        ("DFD504", 0, 1), ("DFD504", 1, 2)]
    assert report.findings[0].evidence["timeout_ms"] == 600000
    assert report.facts["repeats"] == {"DFD504": 1}


THREAD_DEATH = r'''
import threading
def fx_race():
    raise RuntimeError("Detected that you are using FX to symbolically trace a dynamo-optimized function. "
                       "This is not supported at the moment.")
def oom():
    class OutOfMemoryError(RuntimeError):
        pass
    OutOfMemoryError.__module__, OutOfMemoryError.__qualname__ = "torch", "OutOfMemoryError"
    raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total capacity of "
                           "79.10 GiB of which 1.02 GiB is free.")
def chained():
    try:
        {}["missing"]
    except KeyError as exc:
        raise ValueError("bad batch") from exc
for name, target in (("drafter-0", fx_race), ("target-2", oom), ("loader-1", chained)):
    t = threading.Thread(target=target, name=name)
    t.start()
    t.join()
print("[drafter-1] step=3 7.1 Ktok/s", flush=True)
'''


@pytest.mark.timeout(60)
def test_real_python_thread_deaths_are_classified():
    proc = subprocess.run([sys.executable, "-c", THREAD_DEATH], capture_output=True, text=True, timeout=60)
    report = scan_text(proc.stderr + proc.stdout)
    assert found(report) == [
        ("DFD501", "drafter-0", None, report.findings[0].line),
        ("DFD502", "target-2", 2, next(f.line for f in report.findings if f.code == "DFD502")),
        ("DFD508", "loader-1", None, next(f.line for f in report.findings if f.code == "DFD508")),
    ]
    died = {name: t["died"]["exception"] for name, t in report.facts["threads"].items() if t["died"]}
    assert died == {"drafter-0": "RuntimeError", "target-2": "torch.OutOfMemoryError", "loader-1": "ValueError"}
    lines = (proc.stderr + proc.stdout).splitlines()
    assert lines[report.findings[0].line - 1].startswith("RuntimeError: Detected that you are using FX")


def test_a_single_noisy_line_is_not_a_drop_and_a_sustained_one_is_one_finding():
    healthy = "".join(f"step={n} 21.{n % 3} Ktok/s\n" for n in range(1, 31))
    noisy = healthy + "step=31 3.0 Ktok/s\n" + "".join(f"step={n} 21.5 Ktok/s\n" for n in range(32, 40))
    assert scan_text(noisy).findings == []
    dropped = healthy + "".join(f"step={n} 9.{n % 2} Ktok/s\n" for n in range(31, 80))
    report = scan_text(dropped)
    assert [(f.code, f.evidence["from_line"], f.evidence["sustained_at_line"]) for f in report.findings] == [
        ("DFD503", 31, 35)]


def test_drop_thresholds_are_options():
    text = "".join(f"step={n} 100 tok/s\n" for n in range(1, 11)) + "".join(
        f"step={n} 80 tok/s\n" for n in range(11, 20))
    assert scan_text(text).findings == []  # 20 % is less than the default 30 %
    assert [(f.code, f.evidence["at_end"]) for f in scan_text(text, drop=0.1).findings] == [("DFD503", False)]
    # nine low samples are not the ten --sustain asks for; the log ending on them is the end-of-log test's case
    assert [(f.code, f.evidence["at_end"]) for f in scan_text(text, drop=0.1, sustain=10).findings] == [
        ("DFD503", True)]
    assert scan_text(text + "step=20 100 tok/s\n", drop=0.1, sustain=10).findings == []


def test_progress_tracker_rebases_after_a_drop():
    tracker = ProgressTracker(window=3, sustain=2, drop=0.3)
    events = [e for i, v in enumerate([100, 100, 100, 50, 50, 50, 50, 20, 20], 1)
              for e in tracker.throughput("t", v, i)]
    assert [(e.baseline, e.level, e.from_line) for e in events] == [(100, 50, 4), (50, 20, 8)]


def test_stall_needs_peers_to_advance_more_than_the_threads_own_cadence():
    slow_logger = "".join(f"[a-0] step={n * 50}\n[b-0] step={n * 50}\n" for n in range(1, 5))
    # a-0 logs every 50 steps; b-0 advancing 60 steps past a-0's last line is not a stall (< 3 x 50) ...
    assert scan_text(slow_logger + "".join(f"[b-0] step={n}\n" for n in range(201, 261))).findings == []
    # ... 160 steps is
    report = scan_text(slow_logger + "".join(f"[b-0] step={n}\n" for n in range(201, 361)))
    assert [(f.code, f.evidence["thread"], f.evidence["last_step"]) for f in report.findings] == [
        ("DFD507", "a-0", 200)]


def test_thread_pattern_option():
    text = "".join(f"<w{n % 2}> step={n // 2}\n" for n in range(2, 6)) + "".join(
        f"<w1> step={n}\n" for n in range(3, 40))
    assert scan_text(text).findings == []  # the default pattern sees no thread names: one 'main' series
    report = scan_text(text, thread_pattern=r"<(w\d)>")
    assert [(f.code, f.evidence["thread"]) for f in report.findings] == [("DFD507", "w0")]
    for bad in ("(unclosed", "no-group"):
        with pytest.raises(UsageError, match="--thread-pattern"):
            LogScanner("x", LogOptions(thread_pattern=bad))


def test_block_without_its_exception_line_is_a_death_with_unknown_cause():
    report = scan_text("Exception in thread target-1:\n[drafter-1] step=1 7 Ktok/s\n")
    assert [(f.code, f.evidence["thread"], f.evidence["exception"]) for f in report.findings] == [
        ("DFD508", "target-1", None)]


def test_crlf_invalid_utf8_and_a_runaway_line():
    text = (b"Exception in thread drafter-0:\r\n    raise RuntimeError(\r\n"
            b"RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function\xff\r\n"
            + b"x" * 300_000 + b"\n[drafter-1] step=2 Ktok/s\n")
    report = scan_text(text)
    assert found(report) == [("DFD501", "drafter-0", None, 3)]
    assert report.facts["lines"] == 5


@settings(max_examples=80, deadline=None)
@given(st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=30),
       st.integers(1, 17), st.booleans())
def test_chunked_reader_yields_exactly_the_lines(lines, chunk, trailing_newline):
    data = b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")
    expected = data.split(b"\n")
    if expected and expected[-1] == b"":
        expected.pop()
    assert list(iter_lines(io.BytesIO(data), max_line=1000, chunk=chunk)) == expected


def test_reader_cuts_long_lines():
    data = b"a" * 50 + b"\n" + b"b" * 10 + b"\n"
    assert list(iter_lines(io.BytesIO(data), max_line=8, chunk=4)) == [b"a" * 8, b"b" * 8]


def test_nccl_watchdog_stuck_line():
    report = scan_text("[rank2]:[E1129 ProcessGroupNCCL.cpp:1500] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
                       "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress\n")
    assert [(f.code, f.evidence["rank"], f.evidence["stuck_s"]) for f in report.findings] == [("DFD504", 2, 480)]


@pytest.mark.parametrize("text, tok_s, step", [
    ("[drafter-0] step=12 loss=2.1 7.1 Ktok/s", 7100.0, 12), ("21500 tokens/s", 21500.0, None),
    ("a=2.3,8.3Ktok/s", 8300.0, None), ("speed 3.5 M tok/s", 3.5e6, None), ("tok/s", None, None),
    ("step=5 global_step=7", None, 5), ("global_step=7 Step: 9", None, 9), ("steps=3 step 4", None, 4),
    ("2026-11-29 09:00:00 INFO [worker-3] STEP 7 | 9 tok/s", 9.0, 7),
])
def test_progress_parsing(text, tok_s, step):
    from dflash_doctor.logs import throughput

    assert (throughput.throughput(text), throughput.step(text)) == (tok_s, step)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["drafter", "target", "worker_x"]), st.integers(0, 99), st.integers(0, 10 ** 6),
       st.decimals(0, 999, places=1), st.sampled_from(["", "K", "M", "k"]),
       st.sampled_from(["[{t}] step={s} loss=2.1 {v} {u}tok/s", "2026-11-29 INFO [{t}] step={s} {v}{u}tok/s",
                        "{t} | step: {s} | {v} {u}tok/s", "[{t}] lr=1e-4,{v}{u}tok/s step {s}",
                        "thread={t} step={s} tput={v} {u}tokens/s"]))
def test_fast_and_general_progress_paths_agree(role, n, step, value, unit, shape):
    thread = f"{role}-{n}"
    line = shape.format(t=thread, s=step, v=value, u=unit)
    facts = scan_text(line + "\n").facts["threads"]
    scale = {"": 1, "K": 1e3, "k": 1e3, "M": 1e6}[unit]
    assert list(facts) == [thread]
    assert (facts[thread]["last_step"], facts[thread]["last_tok_s"]) == (step, pytest.approx(float(value) * scale))


LOG_LINES = st.sampled_from([
    "[drafter-0] step={n} loss=2.1 {v} Ktok/s", "[drafter-1] step={n} loss=2.0 {v}Ktok/s",
    "[target-2] step={n} {v} tok/s", "2026-11-29 INFO [rank1] step: {n} tput {v} tok/s",
    "step={n} [drafter-0] {v} tok/s", "[drafter-0] lr=1e-4 {v} tok/s", "[drafter-0] stepper={n} {v} tok/s",
    "Exception in thread drafter-{m}:", "Traceback (most recent call last):", '  File "train.py", line {n}, in run',
    "    loss = step(batch)",
    "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {m} has a total capacity",
    "[rank{m}]:[E1129 ProcessGroupNCCL.cpp:1500] Watchdog caught collective operation timeout",
    "noise {n} with a [bracket] and the word tok", "", "   ", "\tstep {n}", "\xff\xfe garbage",
])


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(LOG_LINES, st.integers(0, 300), st.integers(1, 99999), st.integers(0, 3)), max_size=80),
       st.booleans(), st.sampled_from([None, r"\[(?P<thread>[a-z]+-\d+)\]"]))
def test_block_scan_equals_line_by_line(rows, trailing_newline, thread_pattern):
    # scan_stream feeds whole blocks through a regex fast path; feeding each line must give the same report.
    lines = [shape.format(n=n, v=v / 10, m=m).encode("utf-8", "surrogateescape") for shape, n, v, m in rows]
    data = b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")
    blocks = scan_stream(io.BytesIO(data), "t.log", LogOptions(thread_pattern=thread_pattern))
    by_line = LogScanner("t.log", LogOptions(thread_pattern=thread_pattern))
    for lineno, raw in enumerate(iter_lines(io.BytesIO(data)), start=1):
        by_line.feed(raw, lineno)
    one = by_line.finish()
    assert [f.to_dict() for f in blocks.findings] == [f.to_dict() for f in one.findings]
    assert blocks.facts == one.facts
