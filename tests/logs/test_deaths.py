"""Every death found, every cause named right: the real shapes of fixtures/logs (stand-ins, see its README) and
real Python processes and threads dying on this machine."""
from __future__ import annotations

import subprocess
import sys

import pytest

from dflash_doctor.logs.options import LogOptions
from dflash_doctor.logs.source import scan_log
from tests.conftest import REPO
from tests.logs.test_scan import scan_text

FIXTURES = REPO / "fixtures" / "logs"


def scan_fixture(name):
    return scan_log(str(FIXTURES / name), LogOptions())


def found(report):
    return sorted((f.code, f.evidence.get("thread"), f.line) for f in report.findings)


def deaths(report):
    return {name: (t["died"]["code"], t["died"]["last_step"], t["died"]["gpu"])
            for name, t in report.facts["threads"].items() if t["died"]}


def test_rank_prefixed_tracebacks_interleaved_are_told_apart():
    report = scan_fixture("rank_prefixed.log")
    assert found(report) == [("DFD502", "rank1", 12), ("DFD511", "rank0", 13)]
    # torch 2.1 printed 'total capacty': the GPU is still read
    assert deaths(report) == {"rank0": ("DFD511", 3, None), "rank1": ("DFD502", 2, 1)}


def test_torchrun_summary_names_the_root_cause_rank():
    report = scan_fixture("torchrun_summary.log")
    assert found(report) == [("DFD514", "rank2", 7)]
    finding = report.findings[0]
    assert (finding.evidence["signal"], finding.evidence["pid"], finding.evidence["local_rank"]) == ("SIGKILL", 4244, 2)
    root = report.facts["root_cause"]
    assert (root["rank"], root["signal"], root["host"]) == (2, "SIGKILL", "gpu-node-3")
    threads = report.facts["threads"]
    assert threads["rank2"]["died"]["root_cause"] and threads["rank2"]["died"]["last_step"] == 41
    # the ranks torchrun stopped afterwards are dead too, as collateral, with no finding of their own
    assert {n: t["died"]["kind"] for n, t in threads.items()} == {
        "rank0": "collateral", "rank1": "collateral", "rank2": "signal"}


def test_nccl_watchdog_abort_with_only_cpp_frames():
    report = scan_fixture("nccl_abort.log")
    assert found(report) == [("DFD512", "rank1", 4)]
    assert report.findings[0].evidence["inner_cause"] == "collective timeout"
    assert deaths(report) == {"rank1": ("DFD512", 118, None)}


def test_triton_out_of_resources_is_not_a_cuda_oom():
    report = scan_fixture("triton_oor.log")
    assert found(report) == [("DFD510", "main", 7)]
    evidence = report.findings[0].evidence
    assert (evidence["resource"], evidence["required"], evidence["hardware_limit"]) == ("shared memory", 131072, 101376)


def test_jit_trace_form_is_not_the_thread_race():
    report = scan_fixture("jit_trace.log")
    assert found(report) == [("DFD509", "main", 7)]
    assert "not a thread race" in report.findings[0].message


def test_py_spy_dump_of_the_compile_lock_deadlock():
    report = scan_fixture("pyspy_hang.log")
    assert found(report) == [("DFD515", "main", 7)]
    finding = report.findings[0]
    assert finding.severity.value == "error" and finding.evidence["cycle"] == "compile-lock-autograd"
    assert [t["thread"] for t in finding.evidence["threads"]] == ["MainThread", "drafter-0", "Thread-7"]
    assert not deaths(report)  # a hang is nobody's death


def test_recompile_limit_made_fatal_by_fullgraph_is_one_error():
    report = scan_fixture("recompile_fullgraph.log")
    assert found(report) == [("DFD506", "main", 7)]
    finding = report.findings[0]
    assert finding.severity.value == "error" and "runs it uncompiled" not in finding.message
    assert finding.evidence["function"] == "attend (/workspace/dflash_model.py:211)"
    assert finding.evidence["limit"] == "recompile_limit" and finding.evidence["fatal"]


def test_signals_from_the_shell_the_kernel_and_dataloader_workers():
    report = scan_fixture("signals.log")
    assert sorted((f.line, f.evidence["signal"], f.evidence["pid"]) for f in report.findings) == [
        (2, "SIGBUS", 8812), (3, "SIGSEGV", 8790), (4, "SIGKILL", 8801), (5, "SIGKILL", None)]
    assert {f.code for f in report.findings} == {"DFD514"}


def test_oom_phrasings_carry_their_gpu():
    report = scan_fixture("oom_variants.log")
    assert sorted((f.code, f.evidence["thread"], f.evidence["gpu"]) for f in report.findings) == [
        ("DFD502", "main", 6), ("DFD502", "rank3", 3), ("DFD502", "worker-5", 5)]


@pytest.mark.parametrize("name, lines", [
    # 'Exception in thread Exception in thread drafter-0:' ... 'drafter-1:' (the header cut by another thread's)
    ("split_thread_headers.log", (7, 14)),
    # ... and drafter-0's traceback cut after its first frame by drafter-1's whole traceback
    ("interrupted_traceback.log", (14, 10)),
])
def test_interleaved_thread_tracebacks_blame_each_thread_for_its_own_exception(name, lines):
    # Both shapes are what CPython 3.11 printed for two threads dying together (its excepthook writes a line in
    # several pieces and may switch threads between them). Interleaving inside a line cannot be untangled and
    # is not claimed: the two exceptions then share one line.
    report = scan_fixture(name)
    assert found(report) == [("DFD501", "drafter-0", lines[0]), ("DFD502", "drafter-1", lines[1])]


CHILD_PROCESS = r'''
import multiprocessing
def work():
    raise ValueError("bad shard 7")
if __name__ == "__main__":
    p = multiprocessing.get_context("spawn").Process(target=work, name="loader-3")
    p.start()
    p.join()
'''


@pytest.mark.timeout(120)
def test_a_real_child_process_death_is_named_after_the_process(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD_PROCESS)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    report = scan_text(proc.stderr)
    assert [(f.code, f.evidence["thread"], f.evidence["exception"]) for f in report.findings] == [
        ("DFD513", "loader-3", "ValueError")]


def test_main_thread_traceback_is_a_death_unless_the_worker_goes_on():
    death = "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\nKeyError: 'input_ids'\n"
    assert [(f.code, f.evidence["thread"]) for f in scan_text("[rank1]: step=3 9 Ktok/s\n" + death).findings] == [
        ("DFD513", "main")]
    handled = ("Traceback (most recent call last):\n  File \"t.py\", line 9, in step\n"
               "torch.OutOfMemoryError: CUDA out of memory. GPU 2 has a total capacity of 80 GiB\n"
               "step=4 loss=2.1 9.1 Ktok/s\nstep=5 loss=2.0 9.0 Ktok/s\n")
    report = scan_text(handled)
    assert [(f.code, f.severity.value, f.evidence["survived"]) for f in report.findings] == [
        ("DFD502", "warning", True)]
    assert report.facts["threads"]["main"]["died"] is None


def test_agent_line_with_an_exit_code_is_a_rank_death():
    report = scan_text("E1129 api.py:869] failed (exitcode: 1) local_rank: 3 (pid: 77) of binary: /usr/bin/python\n")
    assert [(f.code, f.evidence["thread"], f.evidence["exitcode"]) for f in report.findings] == [
        ("DFD513", "rank3", 1)]


def test_agent_sending_sigterm_is_not_a_death():
    text = "W1129 api.py:897] Sending process 4243 closing signal SIGTERM\n"
    assert scan_text(text).findings == []


def test_a_crash_dump_after_fatal_python_error_is_the_crash_not_a_hang():
    text = ("Fatal Python error: Segmentation fault\n\nThread 0x00007f0f4e7f0740 (most recent call first):\n"
            '  File "/w/train.py", line 12 in step\n')
    assert [(f.code, f.evidence["signal"]) for f in scan_text(text).findings] == [("DFD514", "SIGSEGV")]


def test_a_summary_pasted_from_its_middle_still_names_the_rank():
    text = ("  rank      : 3 (local_rank: 3)\n  exitcode  : -11 (pid: 812)\n  error_file: <N/A>\n"
            "  traceback : Signal 11 (SIGSEGV) received by PID 812\n=====================================\n")
    assert [(f.code, f.evidence["thread"], f.evidence["signal"]) for f in scan_text(text).findings] == [
        ("DFD514", "rank3", "SIGSEGV")]


@pytest.mark.parametrize("line, signal", [
    ("Process finished with exit code 139 (interrupted by signal 11: SIGSEGV)", "SIGSEGV"),
    ('Thread 1 "python" received signal SIGSEGV, Segmentation fault.', "SIGSEGV"),
    ("subprocess.CalledProcessError: Command 'python train.py' died with <Signals.SIGKILL: 9>.", "SIGKILL"),
    ("torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGBUS", "SIGBUS"),
    ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
     "SIGBUS"),
    ("**Killed**", "SIGKILL"), ("`Segmentation fault(core dumped)`", "SIGSEGV"), ("已杀死", "SIGKILL"),
])
def test_signal_wordings(line, signal):
    assert [(f.code, f.evidence["signal"]) for f in scan_text(line + "\n").findings] == [("DFD514", signal)]


def test_the_watchdog_abort_known_by_its_cpp_frames_alone():
    text = ("frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long> >) "
            "+ 0x1d2 (0x1554e9e0f8f2 in /usr/lib/python3/torch/lib/libtorch_cuda.so)\n"
            "frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x233 (0x1554e9e16333 in libtorch_cuda.so)\n")
    report = scan_text(text)
    assert [(f.code, f.evidence["inner_cause"]) for f in report.findings] == [("DFD512", "collective timeout")]


def test_device_side_assert_is_its_own_kind_not_an_illegal_memory_access():
    text = ('  File "/w/train.py", line 18, in forward\n    loss = F.cross_entropy(out, labels)\n'
            "RuntimeError: CUDA error: device-side assert triggered\n")
    assert [(f.code, f.evidence["thread"]) for f in scan_text(text).findings] == [("DFD517", "main")]
