"""Older and launcher-specific wordings of the fatal kinds, each written here as a stand-in for what the tool
prints (THC's out-of-memory lines, torch's DataLoader signal handler, DeepSpeed's launcher, NCCL's 'NCCL Error N',
faulthandler's crash dump, vLLM's worker prefixes). Each is checked twice: alone (a small log, parsed in full) and
in the middle of 2 MB of progress lines (the prefilter and the sampled path), with the same findings."""
from __future__ import annotations

import pytest

from tests.logs.test_scan import scan_text

PADDING = "".join(f"[drafter-{i % 4}] step={i // 4} loss=2.10 7.0 Ktok/s\n" for i in range(60_000))


def findings(text):
    """(code, worker, gpu, signal) of each finding, alone and padded: both must agree."""
    def key(report):
        return sorted((f.code, f.evidence.get("thread"), f.evidence.get("gpu"), f.evidence.get("signal"))
                      for f in report.findings if f.code != "DFD503")
    alone = key(scan_text(text))
    padded = scan_text(PADDING + text + PADDING[:200_000])
    assert padded.facts["progress_sampled"]  # the large-log path: prefilter, then parse candidate lines only
    assert alone == key(padded)
    return alone


@pytest.mark.parametrize("text", [
    "THCudaCheck FAIL file=/opt/torch/lib/THC/generic/THCStorage.cu line=58 error=2 : out of memory\n",
    "RuntimeError: cuda runtime error (2) : out of memory at /opt/torch/lib/THC/generic/THCStorage.cu:58\n",
    "RuntimeError: CUDA error: out of memory\n",
    "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n",
    "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY\n",
    "RuntimeError: TensorStorage tensor.h 168\ncuda failed with error 2 out of memory.\n",
])
def test_older_and_lower_level_oom_wordings(text):
    assert [code for code, *_ in findings(text)] == ["DFD502"]


def test_an_old_oom_ending_a_traceback_is_the_cause_of_the_death():
    text = ("Traceback (most recent call last):\n"
            '  File "train.py", line 40, in <module>\n'
            "    loss.backward()\n"
            "RuntimeError: cuda runtime error (2) : out of memory at /opt/THC/THCStorage.cu:58\n")
    assert findings(text) == [("DFD502", "main", None, None)]


def test_the_host_oom_killer_is_not_a_cuda_oom():
    text = "[Mon Mar  3 08:24:00 2025] Out of memory: Killed process 7899 (python) total-vm:26184840kB\n"
    assert findings(text) == [("DFD514", "main", None, "SIGKILL")]


def test_a_dataloader_worker_crash_printed_by_the_worker_and_the_loader_is_one_finding():
    text = ("ERROR: Unexpected segmentation fault encountered in worker.\n" * 3
            + "Traceback (most recent call last):\n"
            '  File "/opt/torch/utils/data/_utils/signal_handling.py", line 66, in handler\n'
            "    _error_if_any_worker_fails()\n"
            "RuntimeError: DataLoader worker (pid 77) is killed by signal: Segmentation fault.\n")
    assert findings(text) == [("DFD514", "main", None, "SIGSEGV")]


@pytest.mark.parametrize("kind,signal", [("bus error", "SIGBUS"), ("floating-point exception", "SIGFPE")])
def test_the_dataloader_handler_names_its_signal(kind, signal):
    report = scan_text(f"ERROR: Unexpected {kind} encountered in worker.\n")
    assert [(f.code, f.evidence["signal"], f.evidence["worker_kind"]) for f in report.findings] == [
        ("DFD514", signal, "DataLoader worker")]


LAUNCH = ("[2024-05-01 10:00:00,000] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python3', '-u', "
          "'train.py', '--local_rank=3', '--deepspeed', 'ds.json'] exits with return code = {code}\n")


def test_deepspeed_launcher_signal_and_exit_code():
    killing = "[2024-05-01 10:00:00,000] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 4242\n"
    assert findings(killing + LAUNCH.format(code=-9)) == [("DFD514", "rank3", None, "SIGKILL")]
    assert findings(killing + LAUNCH.format(code=1)) == [("DFD513", "rank3", None, None)]
    assert findings(LAUNCH.format(code=0)) == []


def test_nccl_error_with_its_number():
    text = ("[rank0]:     work = group.alltoall_base(\n"
            "[rank0]: RuntimeError: NCCL Error 2: unhandled system error (run with NCCL_DEBUG=INFO for details)\n")
    assert findings(text) == [("DFD516", "rank0", None, None)]


def test_a_crash_dump_after_fatal_python_error_is_not_a_hang():
    text = ("Fatal Python error: Segmentation fault\n"
            "\n"
            "Thread 0x00007f0000000700 (most recent call first):\n"
            "  <no Python frame>\n"
            "\n"
            "Thread 0x00007f0000001700 (most recent call first):\n"
            '  File "/usr/lib/python3.10/threading.py", line 324 in wait\n'
            '  File "/usr/lib/python3.10/queue.py", line 180 in get\n'
            "\n"
            "Current thread 0x00007f0000002700 (most recent call first):\n"
            '  File "/workspace/env.py", line 88 in step\n')
    assert findings(text) == [("DFD514", "main", None, "SIGSEGV")]


def test_a_faulthandler_timeout_dump_is_still_a_hang():
    text = ("Timeout (0:10:00)!\n"
            "Thread 0x00007f0000001700 (most recent call first):\n"
            '  File "/usr/lib/python3.10/threading.py", line 324 in wait\n'
            "Current thread 0x00007f0000002700 (most recent call first):\n"
            '  File "/workspace/train.py", line 88 in step\n')
    assert [code for code, *_ in findings(text)] == ["DFD515"]


def test_vllm_worker_prefixes_with_a_role_and_nesting_name_the_worker():
    text = ("(EngineCore_0 pid=8) (VllmWorker TP1 pid=9) Process VllmWorker-1:\n"
            "(EngineCore_0 pid=8) (VllmWorker TP1 pid=9) Traceback (most recent call last):\n"
            '(EngineCore_0 pid=8) (VllmWorker TP1 pid=9)   File "/opt/vllm/worker.py", line 12, in busy_loop\n'
            "(EngineCore_0 pid=8) (VllmWorker TP1 pid=9)     output = self.execute()\n"
            "(EngineCore_0 pid=8) (VllmWorker TP1 pid=9) ValueError: bad batch\n"
            "(VllmWorker rank=2 pid=267) Process VllmWorker-2:\n"
            "(VllmWorker rank=2 pid=267) Traceback (most recent call last):\n"
            '(VllmWorker rank=2 pid=267)   File "/opt/vllm/worker.py", line 12, in busy_loop\n'
            "(VllmWorker rank=2 pid=267) KeyError: 'req-1'\n")
    assert findings(text) == [("DFD513", "VllmWorker TP1 pid=9", None, None),
                              ("DFD513", "VllmWorker rank=2 pid=267", None, None)]
