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
    # a role that gives the rank ('rank=2') names the worker by it, as '[rank2]:' would
    assert findings(text) == [("DFD513", "VllmWorker TP1 pid=9", None, None), ("DFD513", "rank2", None, None)]


# -- deaths with part of their text missing ------------------------------------------------------------------


@pytest.mark.parametrize("line,worker,exception", [
    ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.\n",
     "main", "RuntimeError"),
    ("[rank5]: **RuntimeError: Expected to mark a variable ready only once**. This error is caused by\n",
     "rank5", "RuntimeError"),
    ("> torch.AcceleratorError: CUDA error: unspecified launch failure\n", "main", "torch.AcceleratorError"),
    ("RuntimeError:cuda error:unspecified launch failure\n", "main", "RuntimeError"),
])
def test_an_exception_line_without_its_traceback_is_a_death(line, worker, exception):
    report = scan_text(line)
    assert [(f.code, f.evidence["thread"], f.evidence["exception"]) for f in report.findings] == [
        ("DFD513", worker, exception)]
    assert report.facts["threads"].get(worker, {}).get("died") or worker == "main"


@pytest.mark.parametrize("line", [
    "UserWarning: TypedStorage is deprecated\n",
    "Error: no such file\n",
    "ERROR: could not connect\n",
    "2024-05-01 10:00:00 ERROR trainer: RuntimeError: retry 1 of 3\n",
    "    raise RuntimeError('DataLoader worker exited unexpectedly')\n",
])
def test_lines_that_only_look_like_an_exception_are_not_deaths(line):
    assert scan_text(line).findings == []


def test_a_bare_exception_then_progress_from_the_same_worker_was_handled():
    text = ("[rank1]: step=10 loss=2.0 tok/s=9000\n"
            "[rank1]: ValueError: bad sample 17, skipped\n"
            "[rank1]: step=11 loss=2.0 tok/s=9000\n")
    assert [f.code for f in scan_text(text).findings] == []


def test_a_bare_exception_whose_message_names_the_cause_on_the_next_line_is_that_cause():
    text = "RuntimeError: TensorStorage tensor.h 168\ncuda failed with error 2 out of memory.\n"
    assert findings(text) == [("DFD502", "main", None, None)]


def test_a_traceback_cut_before_its_exception_is_still_a_death():
    text = ("INFO starting\n"
            "Traceback (most recent call last):\n"
            '  File "/workspace/train.py", line 125, in <module>\n'
            "    train(opt)\n"
            '  File "/workspace/train.py", line 118, in train\n')
    report = scan_text(text)
    assert [(f.code, f.evidence["thread"], f.evidence["exception"]) for f in report.findings] == [
        ("DFD513", "main", None)]
    assert "not in the log" in report.findings[0].message


def test_torchruns_own_traceback_cut_short_is_not_another_death():
    text = ("E0801 13:23:20.000000 1 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) "
            "local_rank: 3 (pid: 33054) of binary: /usr/bin/python3\n"
            "Traceback (most recent call last):\n"
            '  File "/usr/bin/torchrun", line 10, in <module>\n'
            "    sys.exit(main())\n"
            '  File "/opt/torch/distributed/launcher/api.py", line 139, in __call__\n')
    assert [(f.code, f.evidence["thread"]) for f in scan_text(text).findings] == [("DFD513", "rank3")]


@pytest.mark.parametrize("before", ["Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__>",
                                    "2020-01-19 23:16:16,356\tERROR trainer.py:357 -- Error in train call, "
                                    "attempting to recover"])
def test_a_traceback_the_program_went_on_from_is_not_a_death(before):
    text = (before + "\nTraceback (most recent call last):\n"
            '  File "/workspace/train.py", line 40, in step\n'
            "    out = model(batch)\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of "
            "79.1 GiB\n")
    report = scan_text(text)
    assert [(f.code, f.severity.value, f.evidence.get("survived")) for f in report.findings] == [
        ("DFD502", "warning", True)]
    assert not any(t["died"] for t in report.facts["threads"].values())


# -- C++ aborts, Windows exit codes, NCCL's last words, old Dynamo ---------------------------------------------


def test_an_uncaught_cpp_exception_is_an_abort_with_its_reason():
    text = ("terminate called after throwing an instance of 'c10::Error'\n"
            "  what():  CUDA error: unspecified launch failure (insert_events at CUDACachingAllocator.cpp:764)\n"
            "frame #0: c10::Error::Error(c10::SourceLocation, std::string const&) + 0x33 (0x7fe2 in libc10.so)\n")
    report = scan_text(text)
    assert [(f.code, f.evidence["signal"]) for f in report.findings] == [("DFD514", "SIGABRT")]
    assert "unspecified launch failure" in report.findings[0].message


@pytest.mark.parametrize("what,code", [
    ("  what():  CUDA error: an illegal memory access was encountered", "DFD511"),
    ("  what():  [Rank 7] NCCL watchdog thread terminated with", "DFD512"),
])
def test_a_cpp_abort_whose_reason_a_rule_names_is_that_rule(what, code):
    text = "terminate called after throwing an instance of 'std::runtime_error'\n" + what + "\n"
    assert [c for c, *_ in findings(text)] == [code]


@pytest.mark.parametrize("line,signal", [
    ("Process finished with exit code -1073741819 (0xC0000005)", "SIGSEGV"),
    ("Process finished with exit code -1073741795 (0xC000001D)", "SIGILL"),
    ("train.exe exited with exit code 3221225477", "SIGSEGV"),
])
def test_windows_crash_exit_codes(line, signal):
    assert findings(line + "\n") == [("DFD514", "main", None, signal)]


def test_a_normal_exit_code_is_not_a_crash():
    assert findings("Process finished with exit code 0\n") == []


def test_nccl_failed_or_timed_out_alone_is_the_watchdog_taking_the_process_down():
    text = ("[rank2]:[E220 01:25:08.728702337 ProcessGroupNCCL.cpp:681] [Rank 2] Some NCCL operations have failed or "
            "timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
            "corrupted/incomplete data.\n")
    assert findings(text) == [("DFD512", "rank2", None, None)]


def test_2022_torchdynamo_cache_size_limit_wording():
    text = ("[2022-10-14 15:59:22,874] torchdynamo.convert_frame: [WARNING] torchdynamo hit config.cache_size_limit "
            "(64)\n   function: 'forward' (/opt/torchvision/models/resnet.py:284)\n")
    assert [c for c, *_ in findings(text)] == ["DFD506"]


# -- serving logs: the steady rate, not the bursty one -------------------------------------------------------


def test_vllm_stats_read_the_generation_rate_not_the_prompt_rate():
    line = ("INFO 05-19 10:13:{s:02d} [loggers.py:271] Engine 000: Avg prompt throughput: {p} tokens/s, Avg generation "
            "throughput: 1200.0 tokens/s, Running: 18 reqs, Waiting: 4 reqs\n")
    text = "".join(line.format(s=i, p=("18032.5" if i % 3 == 0 else "0.0")) for i in range(12))
    report = scan_text(text)
    assert report.findings == [] and report.facts["threads"]["main"]["last_rate"] == 1200.0


def test_sglang_decode_rate_in_parentheses_and_prefill_input_rate_skipped():
    text = ("[2026-04-05 20:02:51] Decode batch, #running-req: 32, gen throughput (token/s): 1635.11, #queue-req: 0\n"
            "[2026-04-05 20:02:51] Prefill batch, #new-seq: 1, input throughput (token/s): 559.53\n"
            "[2026-04-05 20:02:52] Prefill batch, #new-seq: 1, input throughput (token/s): 120.00\n")
    report = scan_text(text)
    assert report.findings == [] and report.facts["threads"]["main"]["last_rate"] == 1635.11


# -- pastes that lost their shape ----------------------------------------------------------------------------


def test_a_traceback_pasted_without_indentation_keeps_its_frames():
    text = ("Traceback (most recent call last):\n"
            'File "/opt/bin/train", line 8, in\n'
            "sys.exit(main())\n"
            'File "/opt/lib/trainer.py", line 922, in train_step\n'
            "output = self.network(data)\n"
            "KeyError: 'image'\n")
    report = scan_text(text)
    assert [(f.code, f.evidence["thread"], f.evidence["exception"]) for f in report.findings] == [
        ("DFD513", "main", "KeyError")]
    assert report.facts["threads"]["main"]["died"]["last_frame"] == "/opt/lib/trainer.py:922 in train_step"


def test_a_traceback_cut_right_after_its_header_is_still_a_death():
    report = scan_text("For gpu:0. Running epoch: 3\nTraceback (most recent call last):\n  Fil\n")
    assert [(f.code, f.evidence["thread"]) for f in report.findings] == [("DFD513", "main")]


def test_pdsh_node_prefixes_name_the_worker():
    text = ("10.0.0.7: NCCL version 2.14.3+cuda11.7\n"
            "10.0.0.8: Traceback (most recent call last):\n"
            '10.0.0.8:   File "/workspace/train.py", line 14, in <module>\n'
            "10.0.0.8:     main()\n"
            "10.0.0.8: ValueError: bad config\n")
    assert [(f.code, f.evidence["thread"]) for f in scan_text(text).findings] == [("DFD513", "10.0.0.8")]


def test_an_exception_line_in_quotes_is_still_one():
    text = '" RuntimeError: [enforce fail at alloc_cpu.cpp:81] data. DefaultCPUAllocator: not enough memory."\n'
    assert [(f.code, f.evidence["exception"]) for f in scan_text(text).findings] == [("DFD513", "RuntimeError")]


def test_host_memory_allocation_failure_is_not_a_cuda_oom():
    text = ("RuntimeError: [enforce fail at alloc_cpu.cpp:73] . DefaultCPUAllocator: can't allocate memory: you tried "
            "to allocate 116813856768 bytes. Error code 12 (Cannot allocate memory)\n")
    assert [c for c, *_ in findings(text)] == ["DFD513"]
