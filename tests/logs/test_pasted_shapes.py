"""Shapes that issue pastes give the fatal kinds (held-out batch F, benchmarks/logs_heldout): markdown around the
log, progress bars redrawn over a line's start, IPython's traceback header, the kernel's own assertion lines, the
old watchdog's uncaught timeout, zsh's crash reports, Ray prefixes whose lines name a rank. Each is a stand-in
written here, checked alone and inside 2 MB of progress lines (tests/logs/test_wordings.findings)."""
from __future__ import annotations

import pytest

from tests.logs.test_wordings import findings


@pytest.mark.parametrize("line,signal", [
    ("segmentation fault (core dumped)\n", "SIGSEGV"),
    ("zsh: segmentation fault (core dumped)  python train.py --cfg a.yaml\n", "SIGSEGV"),
    ("zsh: killed     python train.py\n", "SIGKILL"),
    ("zsh: bus error  python train.py\n", "SIGBUS"),
])
def test_zsh_and_lowercase_crash_reports(line, signal):
    progress = "Epoch 1/5:  11%|#         | 10/90 [00:01<00:08,  8.95img/s, loss=0.03]\n"
    assert findings(progress + line) == [("DFD514", "main", None, signal)]


@pytest.mark.parametrize("prose", [
    "the run was killed by the scheduler at night\n",
    "a segmentation fault happens sometimes, see above\n",
])
def test_prose_about_a_crash_is_not_one(prose):
    assert findings(prose) == []


def test_a_code_fence_glued_to_a_thread_header():
    text = ("```Exception in thread Thread-9 (_pin_memory_loop):\n"
            "Traceback (most recent call last):\n"
            '  File "/usr/lib/python3.10/threading.py", line 1016, in _bootstrap_inner\n'
            "    self.run()\n"
            '  File "/usr/lib/python3.10/multiprocessing/reduction.py", line 159, in recvfds\n'
            "    raise EO\n")
    assert findings(text) == [("DFD508", "Thread-9 (_pin_memory_loop)", None, None)]


def test_a_quoted_traceback_is_read_inside_its_quote_markers():
    text = ("> > Traceback (most recent call last):\n"
            '> >   File "train.py", line 12, in <module>\n'
            "> >     step()\n"
            "> > KeyError: 'labels'\n")
    assert findings(text) == [("DFD513", "main", None, None)]


def test_a_rank_prefix_that_lost_its_bracket_under_a_redrawn_bar():
    text = ("rank1]: Traceback (most recent call last):                  | 4/84 [00:52<17:32,  0.08it/s]\n"
            '[rank1]:   File "/work/main.py", line 186, in <module>\n'
            "[rank1]:     cli_main()\n"
            '[rank1]:   File "/work/main.py", line 164, in cli_main\n')
    assert findings(text) == [("DFD513", "rank1", None, None)]


def test_ipython_header_names_the_exception_when_the_paste_is_cut():
    text = ("W1126 16:03:16.529 1228 torch/_dynamo/convert_frame.py:844] [1/8] torch._dynamo hit "
            "config.cache_size_limit (8)\n"
            "W1126 16:03:16.529 1228 torch/_dynamo/convert_frame.py:844] [1/8]    function: 'update' "
            "(/home/u/opt/utils.py:694)\n"
            "---------------------------------------------------------------------------\n"
            "CacheLimitExceeded                        Traceback (most recent call last)\n"
            "Cell In[21], line 5\n"
            "      4 for i in range(runs):\n"
            "----> 5     result = train_run(1e-3)\n")
    report_findings = findings(text)
    assert report_findings == [("DFD506", "main", None, None)]
    from tests.logs.test_scan import scan_text

    (finding,) = [f for f in scan_text(text).findings if f.code == "DFD506"]
    assert finding.severity.value == "error" and "stopped the run" in finding.message


def test_ipython_traceback_that_ends_is_read_like_any_other():
    text = ("KeyError                                  Traceback (most recent call last)\n"
            "Cell In[3], line 2\n"
            "----> 2 batch['labels']\n"
            "KeyError: 'labels'\n")
    assert findings(text) == [("DFD513", "main", None, None)]


def test_kernel_assertion_lines_alone_are_a_device_side_assert():
    text = "".join(
        f"../aten/src/ATen/native/cuda/Indexing.cu:1308: indexSelectLargeIndex: block: [56,0,0], thread: "
        f"[{i},0,0] Assertion `srcIndex < srcSelectDimSize` failed.\n" for i in range(3))
    assert findings(text) == [("DFD517", "main", None, None)]


def test_a_glibc_assert_is_not_a_device_side_assert():
    text = "python: ../nptl/pthread_mutex_lock.c:81: __pthread_mutex_lock: Assertion `mutex->__data.__owner == 0' failed.\n"
    assert "DFD517" not in [code for code, *_ in findings(text)]


def test_the_old_watchdog_throwing_its_timeout_is_an_abort_of_that_rank():
    text = ("[E ProcessGroupNCCL.cpp:456] Some NCCL operations have failed or timed out. Due to the asynchronous "
            "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.\n"
            "[E ProcessGroupNCCL.cpp:461] To avoid data inconsistency, we are taking the entire process down.\n"
            "terminate called after throwing an instance of 'std::runtime_error'\n"
            "  what():  [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=923, "
            "OpType=REDUCE, Timeout(ms)=1800000) ran for 1806745 milliseconds before timing out.\n")
    assert findings(text) == [("DFD512", "rank7", None, None)]


def test_a_timeout_line_cut_inside_its_phrase_is_still_a_timeout():
    text = ("[1763]   1%|          | 24/1752 [01:08<1:22:56,  2.88s/it][rank5]:[E602 11:17:52.185 "
            "ProcessGroupNCCL.cpp:632] [Rank 5] Watchdog caught collective operati\n")
    assert findings(text) == [("DFD504", "rank5", None, None)]


def test_a_ray_actor_whose_lines_name_a_rank_is_that_rank():
    actor = "(TrainerActor pid=3946, ip=10.0.0.4) "
    text = (actor + "[2024-12-24 23:47:14,381 E 3946 4620] logging.cc:101: Unhandled exception: "
            "N3c1016DistBackendErrorE. what(): [PG ID 0 PG GUID 0(default_pg) Rank 6] Process group watchdog "
            "thread terminated with exception: [Rank 6] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=970, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 milliseconds\n"
            + actor + "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618"
            " (most recent call first):\n"
            + actor + "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7fa0 in libc10.so)\n")
    assert findings(text) == [("DFD512", "rank6", None, None)]


# -- held-out batch G ---------------------------------------------------------------------------------------------

def test_a_python_fatal_error_other_than_a_signal_is_an_abort():
    text = ("[rank0]:[titan] step: 20  loss:  6.1  tps: 5,120\n"
            "[rank0]:Fatal Python error: none_dealloc: deallocating None\n"
            "[rank0]:Thread 0x00007f10aa7fc640 (most recent call first):\n"
            "[rank0]:  <no Python frame>\n")
    assert findings(text) == [("DFD514", "rank0", None, "SIGABRT")]


def test_a_crash_dump_with_unindented_frames_is_the_crash_not_a_hang():
    text = ("Fatal Python error: Segmentation fault\n\n"
            "Thread 0x00007f9fb1cff700 (most recent call first):\n\n"
            "Thread 0x00007fa040e2b700 (most recent call first):\n"
            'File "/opt/py/lib/python3.10/threading.py", line 324 in wait\n'
            'File "/opt/py/lib/python3.10/queue.py", line 180 in get\n\n'
            "Current thread 0x00007fa2972464c0 (most recent call first):\n"
            'File "/work/env.py", line 498 in compute_reward\n')
    assert findings(text) == [("DFD514", "main", None, "SIGSEGV")]


def test_a_py_spy_dump_with_its_thread_ids_edited_out_is_still_a_dump():
    text = ('Thread (idle): "MainThread"\n'
            "    wait (threading.py:359)\n"
            "    get (queue.py:180)\n"
            "    ...\n"
            'Thread (idle): "Thread-7 (_pin_memory_loop)"\n'
            "    select (selectors.py:415)\n"
            "    _poll -> poll -> get\n")
    assert findings(text) == [("DFD515", "main", None, None)]


def test_a_thread_header_printed_after_a_redrawn_progress_bar():
    text = ("  0%|          | 0/117 [00:00<?, ?it/s]Exception in thread Thread-2:\n"
            "Traceback (most recent call last):\n"
            '  File "C:\\\\Python38\\\\lib\\\\threading.py", line 932, in _bootstrap_inner\n'
            "    self.run()\n"
            "ValueError: not enough values to unpack (expected 2, got 0)\n")
    assert findings(text) == [("DFD508", "Thread-2", None, None)]


def test_a_single_backtick_and_markdown_bold_around_log_lines():
    header = "`Exception in thread Thread-1 (_pin_memory_loop):\nTraceback (most recent call last):\n"
    assert findings(header + '  File "/opt/py/threading.py", line 1016, in _bootstrap_inner\n') == [
        ("DFD508", "Thread-1 (_pin_memory_loop)", None, None)]
    bold = ("Traceback (most recent call last):\n"
            '  File "train.py", line 88, in <module>\n'
            "**    loss = criterion(logits, labels)**\n"
            "**RuntimeError: CUDA error: device-side assert triggered**\n")
    assert findings(bold) == [("DFD517", "main", None, None)]


def test_a_watchdog_termination_names_its_cuda_cause_but_is_the_abort_of_that_rank():
    text = ("  what():  [PG ID 2 PG GUID 3 Rank 1] Process group watchdog thread terminated with exception: CUDA "
            "error: an illegal memory access was encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
            "might be incorrect.\n")
    assert findings(text) == [("DFD512", "rank1", None, None)]


# -- held-out batch H ---------------------------------------------------------------------------------------------

def test_a_bare_exception_ends_its_traceback():
    text = ("Traceback (most recent call last):\n"
            '  File "/srv/model_runner.py", line 216, in initialize\n'
            "    raise Exception(\n"
            "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 7 has a "
            "total capacity of 95.00\n")
    assert findings(text) == [("DFD502", "main", 7, None)]


def test_the_watchdog_of_recent_releases_shown_only_by_its_frames():
    text = ("frame #4: c10d::ProcessGroupNCCL::Watchdog::runLoop() + 0x969 (0x7f36a3a5c499 in libtorch_cuda.so)\n"
            "frame #5: c10d::ProcessGroupNCCL::Watchdog::run() + 0xdf (0x7f36a3a5e40f in libtorch_cuda.so)\n"
            "Exception raised from run at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2063 (most "
            "recent call first):\n")
    assert findings(text) == [("DFD512", "main", None, None)]


def test_a_path_component_is_not_a_thread_name():
    text = ("E0526 16:36:24.875000 140417 torch/distributed/elastic/multiprocessing/api.py:826] failed (exitcode: "
            "-11) local_rank: 0 (pid: 101091) of binary: /home/u/ml/lf-071/venv/bin/python\n")
    assert findings(text) == [("DFD514", "rank0", None, "SIGSEGV")]


def test_the_old_elastic_agents_child_failed_banner():
    assert findings("Child process 32378 (local_rank 0) FAILED (exitcode 1)\n") == [("DFD513", "rank0", None, None)]
    assert findings("Child process 32378 (local_rank 2) FAILED (exitcode -9)\n") == [
        ("DFD514", "rank2", None, "SIGKILL")]


def test_a_shell_crash_report_glued_to_a_progress_bar():
    text = "[Info: train_Ep_11: loss: 4.38e+02]:  20%|| 11/56 [00:02<00:08,  5.02it/s]Segmentation fault (core dumped)\n"
    assert findings(text) == [("DFD514", "main", None, "SIGSEGV")]


def test_a_torchrun_summary_cut_before_its_failures_still_says_the_script_failed():
    text = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
            "============================================================\n"
            "recipes/finetune.py FAILED\n"
            "------------------------------------------------------------\n"
            "Failures:\n"
            "[\n")
    assert findings(text) == [("DFD513", "main", None, None)]


def test_docker_compose_service_prefixes_are_read_like_a_host_prefix():
    text = ("sglang-1  | Process 310: sglang::scheduler_TP7\n"
            "sglang-1  | Python v3.12.12 (/usr/bin/python3.12)\n"
            "sglang-1  | \n"
            'sglang-1  | Thread 310 (active): "MainThread"\n'
            "sglang-1  |     _apply (penaltylib/min_new_tokens.py:78)\n"
            'sglang-1  | Thread 402 (idle): "Thread-1 (_read_thread)"\n'
            "sglang-1  |     _recv (compile_worker/subproc_pool.py:60)\n")
    assert findings(text) == [("DFD515", "sglang-1", None, None)]


def test_a_traceback_header_split_by_a_redrawn_bar():
    text = ("model.safetensors: 100%|##########| 1.2G/1.2G [00:20<00:00, 59MB/s]Traceback (most recent cal\n"
            "l last):\n"
            '  File "/work/train_pretrain.py", line 18, in <module>\n'
            "    trainer.train()\n"
            "  Fi\n")
    assert findings(text) == [("DFD513", "main", None, None)]


def test_a_thread_header_that_lost_its_first_word():
    text = ("### Call-stack\n"
            "in thread Thread-3:\n"
            "Traceback (most recent call last):\n"
            '  File "C:\\\\Python37\\\\lib\\\\threading.py", line 926, in _bootstrap_inner\n'
            "    self.run()\n")
    assert findings(text) == [("DFD508", "Thread-3", None, None)]


# -- held-out batch I ---------------------------------------------------------------------------------------------

def test_frames_pasted_without_their_header_are_a_traceback():
    from tests.logs.test_scan import scan_text

    text = ('  File "/srv/deepspeed/comm/torch.py", line 192, in broadcast\n'
            "    return torch.distributed.broadcast(tensor=tensor, src=src)\n"
            '  File "/srv/torch/distributed/distributed_c10d.py", line 1436, in wrapper\n')
    # read in full blocks only (a pasted excerpt): a sampled multi-megabyte log finds no trigger word here
    assert [(f.code, f.evidence["thread"]) for f in scan_text(text).findings] == [("DFD513", "main")]


def test_vllm_logger_prefixes_on_every_traceback_line():
    prefix = "(VllmWorker rank=2 pid=504) ERROR 05-04 12:23:00 [multiproc_executor.py:380] "
    text = (prefix + "Traceback (most recent call last):\n"
            + prefix + '  File "/opt/vllm/worker.py", line 179, in determine_num_available_blocks\n'
            + prefix + "    self.model_runner.profile_run()\n"
            + prefix + "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert findings(text) == [("DFD511", "rank2", None, None)]


def test_a_rank_prefix_inside_a_ray_prefix_names_the_rank():
    text = ("(RayWorkerWrapper pid=92234) [rank1]:[E1203 10:00:00.000 ProcessGroupNCCL.cpp:1418] [Rank 12] "
            "Collective WorkNCCL(SeqNum=1, OpType=BROADCAST) raised the following async exception: NCCL error: "
            "remote process exited or there was a network error, NCCL version 2.20.5\n")
    assert findings(text) == [("DFD516", "rank1", None, None)]


@pytest.mark.parametrize("line,signal", [
    ("WARNING:torch.distributed.elastic.agent.server.api:Received 1 death signal, shutting down workers\n",
     "SIGHUP"),
    ("[dsw-5419:02077] Signal: Segmentation fault (11)\n", "SIGSEGV"),
    ("(raylet) [2025-04-01 10:00:00,000 E 123 123] (raylet) node_manager.cc:3041: 1 Workers (tasks / actors) "
     "killed due to memory pressure (OOM), 0 Workers crashed due to other reasons\n", "SIGKILL"),
])
def test_more_ways_a_process_is_killed(line, signal):
    assert [(code, sig) for code, _, _, sig in findings(line)] == [("DFD514", signal)]


def test_the_older_watchdog_shown_only_by_its_frames():
    text = ("frame #5: c10d::ProcessGroupNCCL::watchdogHandler() + 0x77c (0x7fc91a8545ac in libtorch_cuda.so)\n"
            "frame #6: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x10c (0x7fc91a8548cc in libtorch_cuda.so)\n"
            "Exception raised from ncclCommWatchdog at\n")
    assert findings(text) == [("DFD512", "main", None, None)]


def test_a_deepspeed_launcher_line_cut_before_its_return_code():
    text = ("[2023-07-21 10:00:00,000] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', "
            "'train.py', '--local_rank=1', '--deepspeed', 'ds_config.json'\n")
    assert findings(text) == [("DFD513", "rank1", None, None)]


def test_a_root_cause_cut_before_its_rank_and_a_launcher_traceback_alone():
    summary = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
               "train.py FAILED\n"
               "Root Cause (first observed failure):\n"
               "[0]:\n"
               "  time      : 2023-01-01_00:00:00\n")
    assert findings(summary) == [("DFD513", "main", None, None)]
    launcher = ("Traceback (most recent call last):\n"
                '  File "/opt/py/lib/python3.8/site-packages/torch/distributed/launch.py", line 193, in <module>\n'
                "    main()\n"
                '  File "/opt/py/lib/python3.8/site-packages/torch/distributed/elastic/multiprocessing/api.py", line')
    assert findings(launcher + "\n") == [("DFD513", "main", None, None)]


def test_a_py_spy_header_glued_to_the_pasters_prose():
    text = ('py-spy dump of rank 0:  Thread 59633 (active): "MainThread"\n'
            "    all_reduce (vllm/distributed/device_communicators/symm_mem.py:88)\n"
            "    forward (model.py:120)\n")
    assert findings(text) == [("DFD515", "main", None, None)]


# -- held-out batch J ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line,signal", [
    ("ptuning/train.sh: torch.distributed.elastic.multiprocessing.api.SignalException: Process 8665 got signal: 1\n",
     "SIGHUP"),
    ("Process finished with exit code 137 (interrupted by signal 9: SIGKILL)\n", "SIGKILL"),
    ("Process finished with exit code 137 \uff08interrupted by signal 9\uff1a SIGKILL\uff09\n", "SIGKILL"),
    ("Unexpected bus ERROR encountered in worker. This might be caused by insufficient shared memory (shm)\n",
     "SIGBUS"),
    ("trainer exited with code 139\n", "SIGSEGV"),
])
def test_signal_deaths_as_launchers_ides_and_translations_print_them(line, signal):
    assert [(code, sig) for code, _, _, sig in findings(line)] == [("DFD514", signal)]


def test_a_normal_exit_code_from_an_ide_is_not_a_signal():
    assert findings("Process finished with exit code 0\n") == []


def test_a_root_cause_cut_before_its_exit_code_leaves_the_signal_deaths_shown_in_full():
    text = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
            "train.py FAILED\n"
            "Failures:\n"
            "[1]:\n"
            "  rank      : 1 (local_rank: 1)\n"
            "  exitcode  : -7 (pid: 100)\n"
            "  traceback : Signal 7 (SIGBUS) received by PID 100\n"
            "Root Cause (first observed failure):\n"
            "[0]:\n"
            "  rank      : 0 (local_rank: 0)\n")
    assert ("DFD514", "rank1", None, "SIGBUS") in findings(text)


def test_an_old_ray_pid_prefix_keeps_a_threads_traceback_together():
    text = ("(pid=24123) Exception in thread Thread-1:\n"
            "(pid=24123) Traceback (most recent call last):\n"
            '(pid=24123)   File "/usr/lib/python3.6/threading.py", line 916, in _bootstrap_inner\n'
            "(pid=24123)     self.run()\n"
            "(pid=24123) _queue.Empty\n")
    assert findings(text) == [("DFD508", "Thread-1", None, None)]


# -- held-out batch K ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line,signal", [
    ("SIGABRT(6), PID: 3154296, Thread 3154296:\n", "SIGABRT"),
    ("[node0262:1016852:0:1020747] Caught signal 11 (Segmentation fault: address not mapped to object at "
     "address 0x8)\n", "SIGSEGV"),
    (" Out of memory:Killed process 217423\uff08python\uff09total-vm:112518872kB\n", "SIGKILL"),
])
def test_crash_handlers_of_c10_ucx_and_a_terse_oom_killer(line, signal):
    assert [(code, sig) for code, _, _, sig in findings(line)] == [("DFD514", signal)]


def test_rocm_kernel_assertions_are_device_side_asserts():
    text = ("/pytorch/aten/src/ATen/native/hip/Indexing.hip:1292: indexSelectLargeIndex: Device-side assertion "
            "`srcIndex < srcSelectDimSize' failed.\n") * 2
    assert findings(text) == [("DFD517", "main", None, None)]


def test_inductors_out_of_resource_reraised_as_out_of_memory_is_triton_not_cuda():
    text = ("torch._inductor.exc.InductorError: RuntimeError: No valid triton configs.\n"
            "OutOfMemoryError: out of resource: triton_tem_fused_flex_attention_0\n"
            "Required: 139776  Hardware limit: 101376\n")
    assert [code for code, *_ in findings(text)] == ["DFD510"]
    assert findings("# out of resource: shared memory, Required: 131074, Hardware limit: 101376.\n") == [
        ("DFD510", "main", None, None)]


def test_a_node_name_before_a_rank_prefix_and_a_runners_stream_tag():
    pdsh = ('worker-5: [rank22]:   File "/work/main_new.py", line 307, in <module>\n'
            "worker-5: [rank22]:     main()\n")
    from tests.logs.test_scan import scan_text

    assert [(f.code, f.evidence["thread"]) for f in scan_text(pdsh).findings] == [("DFD513", "rank22")]
    tagged = ("bench.node-3.nolog [stderr] [rank6]:[E909 09:55:35.239 ProcessGroupNCCL.cpp:1515] [PG 0 "
              "(default_pg) Rank 6] Process group watchdog thread terminated \n"
              "with exception: [Rank 6] Watchdog caught collective operation timeout\n")
    assert ("DFD512", "rank6", None, None) in findings(tagged)


def test_process_group_info_records_of_a_clean_shutdown_are_not_errors():
    text = ("I0228 14:05:56.114109 1619334 ProcessGroupNCCL.cpp:484] [Rank 3] found async exception when checking "
            "for NCCL errors: NCCL communicator encountered error set by ProcessGroupNCCL: Process Group shutdown "
            "on rank 3\n"
            "# 7  c10d::ProcessGroupNCCL::watchdogHandler()\n")
    assert findings(text) == []


# -- held-out batch L ---------------------------------------------------------------------------------------------

def test_a_traceback_header_cut_right_after_most_glued_to_a_bar():
    text = "  0%|          | 0/769 [00:00<?, ?it/s]Traceback (most r\n"
    assert findings(text) == [("DFD513", "main", None, None)]


def test_a_py_spy_header_under_its_command_with_no_threads_pasted():
    text = ("py-spy dump --pid 14310\n"
            "Process 14310: /usr/local/bin/python -u /opt/swift/cli/sft.py --load /models/GLM-4 --save /out\n")
    assert findings(text) == [("DFD515", "main", None, None)]
    assert findings("Process 14310: /usr/local/bin/python -u train.py\n") == []


def test_a_c10_error_backtrace_through_the_watchdog_thread():
    text = ("(RayWorkerVllm pid=7046) frame #3: c10d::ProcessGroupNCCL::WorkNCCL::finishedGPUExecutionInternal() const"
            " + 0x80 (0x7f4da9f2f250 in libtorch_cuda.so)\n"
            "(RayWorkerVllm pid=7046) frame #5: c10d::ProcessGroupNCCL::workCleanupLoop() + 0x11a (0x7f4d in "
            "libtorch_cuda.so)\n")
    assert findings(text) == [("DFD512", "RayWorkerVllm pid=7046", None, None)]



def test_a_flattened_watchdog_dump_whose_what_is_cut_after_the_rank():
    text = ("> frame #6: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x14d (0x7f8f in libtorch_cuda.so) frame #7: "
            "+ 0x145c0 (0x7f90 in libtorch.so) frame #8: clone + 0x44 (0x7f90 in libc.so.6)\n"
            "> \n"
            "> , PIL._imagingft, msgpack._cmsgpack, ray._raylet what(): [PG ID 2 PG GUID 3 Rank 7\n")
    assert findings(text) == [("DFD512", "rank7", None, None)]

def test_dataloader_signal_lines_wrapped_or_in_paddles_words():
    wrapped = "DataLoader worker (pid 270071) is killed by signal: \nBus error. It is possible that ...\n"
    assert [code for code, *_ in findings(wrapped)] == ["DFD514"]
    paddle = ("ERROR: Unexpected BUS error encountered in DataLoader worker. This might be caused by insufficient "
              "shared memory (shm)\n")
    assert findings(paddle) == [("DFD514", "main", None, "SIGBUS")]


# -- held-out batch M ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line,signal", [
    ("==12==ERROR: AddressSanitizer: SEGV on unknown address 0x000000000010 (pc 0x7f3e bp 0x7ffd T0)\n", "SIGSEGV"),
    ("(RayWorkerWrapper pid=2191173) *** SIGSEGV received at time=1746500000 on cpu 131 ***\n", "SIGSEGV"),
    ("terminate called after throwing an instance of 'paddle::memory::allocation::BadAlloc'\n", "SIGABRT"),
])
def test_sanitizer_absl_and_allocation_failure_deaths(line, signal):
    assert [(code, sig) for code, _, _, sig in findings(line)] == [("DFD514", signal)]


def test_paddles_out_of_memory_and_a_python_reported_collective_timeout():
    assert findings("Out of memory error on GPU 0. Cannot allocate 6.93GB memory on GPU 0, available memory is "
                    "only 1.2GB.\n") == [("DFD502", "main", 0, None)]
    timeout = ("RuntimeError: [Rank 1] Caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, "
               "Timeout(ms)=10800000) ran for 10800031 milliseconds before timing out.\n")
    assert ("DFD504", "rank1", None, None) in findings(timeout)


def test_the_recompile_limit_as_dynamos_unsupported_is_fatal():
    from tests.logs.test_scan import scan_text

    report = scan_text("torch._dynamo.exc.Unsupported: Dynamo recompile limit exceeded\n")
    assert [(f.code, f.severity.value) for f in report.findings] == [("DFD506", "error")]


def test_a_stderr_tag_a_viewer_line_number_and_a_wrapped_launcher_line():
    tagged = ("stderr: torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
              "stderr: test_script.py FAILED\n"
              "stderr: Failures:\n"
              "stderr: [1]:\n"
              "stderr:   rank      : 1 (local_rank: 1)\n"
              "stderr:   exitcode  : -7 (pid: 211)\n")
    assert findings(tagged) == [("DFD514", "rank1", None, "SIGBUS")]
    numbered = "[12]     raise ValueError(\n[13] ValueError: Tried to step 100002 times.\n"
    assert findings(numbered) == [("DFD513", "main", None, None)]
    wrapped = ("[2024-01-01 10:00:00,000] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', "
               "'train.py', '--local_rank=7', '--deeps\n"
               "peed', 'ds.json'] exits with return code = -9\n")
    assert findings(wrapped) == [("DFD514", "rank7", None, "SIGKILL")]


def test_paddles_cpp_traceback_is_not_a_python_one_and_richs_boxed_one_is():
    paddle = ("C++ Traceback (most recent call last):\n"
              "--------------------------------------\n"
              "0   paddle::memory::allocation::Allocator::Allocate(unsigned long)\n")
    assert findings(paddle) == []
    rich = ("\u256d\u2500\u2500\u2500 Traceback (most recent call last) \u2500\u2500\u2500\u256e\n"
            "\u2502 /opt/py/runpy.py:196 in _run_module_as_main                \u2502\n")
    assert findings(rich) == [("DFD513", "main", None, None)]


def test_gdb_and_pystack_thread_dumps_of_a_hung_process():
    gdb = ('Thread 7 (Thread 0x7f64ab6dc000 (LWP 2791195) "executor_server"):\n'
           "#0  0x00007f6b84ad7ab4 in read () from /lib/libpthread.so.0\n"
           "#1  0x00007f6b1a2c in ibv_get_async_event () from /lib/libibverbs.so.1\n")
    assert findings(gdb) == [("DFD515", "main", None, None)]
    pystack = ("Traceback for thread 4242 (python3.12) [] (most recent call last):\n"
               '    (Python) File "/usr/lib/python3.12/threading.py", line 1032, in _bootstrap\n'
               '    (Python) File "/srv/test_hang.py", line 12, in wait_forever\n')
    assert findings(pystack) == [("DFD515", "main", None, None)]


def test_a_gdb_dump_with_cpp_frames_and_a_cut_thread_is_one_dump():
    text = ('Thread 7 (Thread 0x7f64ab6dc000 (LWP 2791195) "executor_server"):\n'
            "#0  0x00007f6b84ad7ab4 in read () from /lib/libpthread.so.0\n"
            "#2  0x00007f6b8811f042 in wrap_ibv_get_async_event(ibv_context*, ibv_async_event*) () from /lib/libnccl.so.2\n"
            "#3  0x00007f6b88141b54 in ncclIbAsyncThreadMain(void*) () from /lib/libnccl.so.2\n"
            "\n"
            'Thread 6 (Thread 0x7f64abedd000 (LWP 2791192) "executor_server"):\n'
            "#0  0x00007f6b84ad7ab4 in read () from /lib/libpthread.so.0\n"
            "#1  0x00007578d8031d57 in c10::ThreadPool::main_loop(unsigned long) ()\n"
            "   from /opt/torch/lib/libc10.so\n"
            "Thread 5 (Thread 0x7f694efde000 (LWP 2790932)\n")
    assert findings(text) == [("DFD515", "main", None, None)]


def test_gdb_backtraces_taken_by_hand_between_prose_are_one_hang_dump():
    from tests.logs.test_scan import scan_text

    text = ("I attached a debugger; most threads look like this:\n"
            "```\n"
            "(gdb) bt\n"
            "#0  0x000075791e330117 in ?? () from /lib/libc.so.6\n"
            "#1  0x000075791e332a41 in pthread_cond_wait () from /lib/libc.so.6\n"
            "```\n"
            "\n"
            "The interesting one is thread 2:\n"
            "```\n"
            "(gdb) thr 2\n"
            "[Switching to thread 2 (Thread 0x75786a7ff640 (LWP 51477))]\n"
            "(gdb) bt\n"
            "#0  0x000075791e3b381c in read () from /lib/libc.so.6\n"
            "#1  0x0000757911caa98d in read (__nbytes=271, __fd=<optimized out>)\n"
            "    at /usr/include/bits/unistd.h:38\n")
    # '(gdb) bt' is read in full blocks only (a pasted excerpt), like frames pasted without their header
    report = scan_text(text)
    assert [(f.code, f.line, len(f.evidence["threads"])) for f in report.findings] == [("DFD515", 3, 2)]


def test_gdb_on_a_crash_is_the_crash_and_gdb_stopping_a_live_process_is_not_a_death():
    from tests.logs.test_scan import scan_text

    crash = ('Thread 1 "python" received signal SIGSEGV, Segmentation fault.\n'
             "0x00007ffff7a5e1c0 in at::native::foo () from /opt/torch/lib/libtorch_cuda.so\n"
             "(gdb) bt\n"
             "#0  0x00007ffff7a5e1c0 in at::native::foo () from /opt/torch/lib/libtorch_cuda.so\n")
    assert [(f.code, f.evidence.get("signal")) for f in scan_text(crash).findings] == [("DFD514", "SIGSEGV")]
    stopped = ("Program received signal SIGINT, Interrupt.\n"
               "(gdb) bt\n"
               "#0  0x00007ffff7a5e1c0 in read () from /lib/libc.so.6\n")
    assert [f.code for f in scan_text(stopped).findings] == ["DFD515"]


# -- held-out batch N ---------------------------------------------------------------------------------------------

def test_an_rfc3339_timestamp_before_every_line():
    stamp = "2024-05-26T03:20:45.253031734Z "
    text = (stamp + "Traceback (most recent call last):\n"
            + stamp + '  File "/srv/finetune.py", line 891, in <module>\n'
            + stamp + "    main()\n"
            + stamp + "RuntimeError: shape mismatch\n")
    assert findings(text) == [("DFD513", "main", None, None)]


def test_frames_pasted_flush_left_or_as_rich_boxes_without_their_header():
    from tests.logs.test_scan import scan_text

    flush_left = ('File "/srv/sglang/managers/scheduler.py", line 1787, in run_scheduler_process\n'
                  "scheduler = Scheduler(server_args, port_args, gpu_id)\n"
                  'File "/srv/sglang/model_executor/model_runner.py", line 178, in init\n'
                  "min_per_gpu_memory = s\n")
    rich = ("\u2502   1023 \u2502   \u2502   pids_str = ', '.join(str(w.pid) for w in failed)            \u2502\n"
            "\u2502 \u2771 1024 \u2502   \u2502   raise RuntimeError('DataLoader worker (pid(s) {}) exited'  \u2502\n"
            "\u2502   1025 \u2502   \u2502   if isinstance(e, queue.Empty):                            \u2502\n"
            "\u2570\n")
    # read in full blocks only (a pasted excerpt), like indented frames without their header
    for text in (flush_left, rich):
        assert [(f.code, f.evidence["thread"]) for f in scan_text(text).findings] == [("DFD513", "main")]


def test_a_rank_traceback_glued_to_a_progress_bar():
    text = ("Training progress:   0%|          | 70/60000 [00:10<2:02:41,  8.14it/s, Loss=2.69][rank1]: Traceback "
            "(most recent call last):\n"
            '[rank1]:   File "train.py", line 224, in training\n'
            "[rank1]:     viewpoint_cam = train_view_loader.get_view()\n"
            "[rank1]: _queue.Empty\n")
    assert findings(text) == [("DFD513", "rank1", None, None)]


def test_a_loggers_message_before_a_traceback_cut_before_its_exception():
    prefix = "(VllmWorkerProcess pid=761) ERROR 07-24 08:26:01 multiproc_worker_utils.py:226] "
    text = (prefix + "Exception in worker VllmWorkerProcess while processing method init_device: NCCL error: "
            "unhandled cuda error (run with NCCL_DEBUG=INFO for details), Traceback (most recent call last):\n"
            + prefix + '  File "/srv/vllm/executor/multiproc_worker_utils.py", line 223, in _run_worker_process\n')
    assert findings(text) == [("DFD516", "VllmWorkerProcess pid=761", None, None)]


@pytest.mark.parametrize("text,codes", [
    ("- **Exception Type:** torch.OutOfMemoryError\n- **Exception Message:** Allocation on device \n", ["DFD502"]),
    ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n", ["DFD513"]),
    ('Exception in thread "main" java.lang.OutOfMemoryError: Java heap space\n', []),
    ("Done writing 67 indices in 536 bytes .\nFatal Python error: PyCOND_WAIT(gil_cond) failed\n", ["DFD514"]),
])
def test_out_of_memory_classes_and_python_fatal_errors(text, codes):
    assert [code for code, *_ in findings(text)] == codes


def test_a_torchrun_summary_cut_before_its_root_cause_reports_every_rank_it_lists():
    entry = ("[{n}]:\n  time      : 2024-01-31_11:56:39\n  host      : node0\n  rank      : {n} (local_rank: {n})\n"
             "  exitcode  : 1 (pid: 3603{n})\n  error_file: <N/A>\n")
    text = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "============================================================\n"
            "train.py FAILED\n"
            "------------------------------------------------------------\n"
            "Failures:\n" + "".join(entry.format(n=n) for n in (1, 2, 3)))
    assert findings(text) == [("DFD513", f"rank{n}", None, None) for n in (1, 2, 3)]


# -- held-out batch O ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("ERROR:composer.cli.launcher:Rank 2 crashed with exit code -7.\n", [("DFD514", "rank2", None, "SIGBUS")]),
    ("ERROR:composer.cli.launcher:Rank 1 crashed with exit code 1.\n", [("DFD513", "rank1", None, None)]),
    ("slurmstepd: error: Detected 8 oom-kill event(s) in step 59137890.batch cgroup. Some of your processes may "
     "have been killed by the cgroup out-of-memory handler.\n", [("DFD514", "main", None, "SIGKILL")]),
])
def test_composer_and_slurm_report_deaths_in_their_own_words(text, expected):
    assert findings(text) == expected


def test_a_slurm_job_step_is_not_a_training_step():
    text = ("Traceback (most recent call last):\n"
            '  File "/srv/ray/tune/tune.py", line 272, in run\n'
            "    raise TuneError(\"Trials did not complete\", errored_trials)\n"
            "ray.tune.error.TuneError: ('Trials did not complete', [seed:5591])\n"
            "slurmstepd: error: Detected 8 oom-kill event(s) in step 59137890.batch cgroup.\n")
    # a 'step' after the traceback would mean the process went on (a handled error): this one is a job step's id
    assert findings(text) == [("DFD513", "main", None, None), ("DFD514", "main", None, "SIGKILL")]


@pytest.mark.parametrize("banner", [
    "FatalError: `Segmentation fault` is detected by the operating system.\n\n",
    "FatalError: A serious error (Segmentation fault) is detected by the operating system. (at /paddle/init.cc:303)\n",
])
def test_paddles_signal_handler_and_the_shells_line_are_one_crash(banner):
    text = ("C++ Traceback (most recent call last):\n"
            "--------------------------------------\n"
            "0   paddle::framework::SignalHandle(char const*, int)\n\n"
            "----------------------\nError Message Summary:\n----------------------\n"
            + banner
            + "  [SignalInfo: *** SIGSEGV (@0x0) received by PID 3118 (TID 0x7f1ae8cf3700) from PID 0 ***]\n\n"
            "Segmentation fault (core dumped)\n")
    assert findings(text) == [("DFD514", "main", None, "SIGSEGV")]


# -- held-out batch P ---------------------------------------------------------------------------------------------

def test_an_older_kernels_oom_kill_line_alone():
    text = ("[ 4018.450000] Killed process 935 (python) total-vm:113656kB, anon-rss:102104kB, file-rss:0kB\n"
            "[ 4022.980000] oom_reaper: reaped process 935 (python), now anon-rss:0kB\n")
    assert findings(text) == [("DFD514", "main", None, "SIGKILL")]


def test_a_root_cause_entry_cut_before_its_rank_leaves_the_listed_failures():
    entry = ("stderr: [{n}]:\nstderr:   host      : node0\nstderr:   rank      : {n} (local_rank: {n})\n"
             "stderr:   exitcode  : 1 (pid: 117{n})\n")
    text = ("stderr: torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
            "stderr: ============================================================\n"
            "stderr: /srv/test_script.py FAILED\n"
            "stderr: ------------------------------------------------------------\n"
            "stderr: Failures:\n" + "".join(entry.format(n=n) for n in (1, 2))
            + "stderr: ------------------------------------------------------------\n"
            "stderr: Root Cause (first observed failure):\n"
            "stderr: [0]:\n"
            "stderr:   time\n")
    found = findings(text)
    assert ("DFD513", "rank1", None, None) in found and ("DFD513", "rank2", None, None) in found


def test_torchx_role_and_local_rank_before_the_global_rank():
    prefix = "B-nemo-ft3/0 [default1]:[rank9]: "
    text = (prefix + '  File "/srv/torch/distributed/distributed_c10d.py", line 2780, in broadcast\n'
            + prefix + "    work = group.broadcast([tensor], opts)\n"
            + prefix + "torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving "
            "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: wait timeout "
            "after 600000ms\n")
    # a rendezvous that never completed: not a collective that ran past its timeout (DFD504)
    assert findings(text) == [("DFD513", "rank9", None, None)]


def test_a_runners_date_prefix_and_tensorflows_nccl_abort():
    text = ("2023/10/26 12:12:06 job-1-0:293:765 [0] NCCL INFO proxy.cc:614 -> 2 [Proxy Thread]\n"
            "2023/10/26 12:12:06 2023-10-26 12:12:06.704113: E nccl_collective.cc:461] NCCL communication aborted: "
            "unhandled system error\n")
    assert [code for code, *_ in findings(text)] == ["DFD516"]


def test_a_cut_traceback_right_after_its_cause_is_the_same_death():
    text = ("THCudaCheck FAIL file=/opt/THC/THCReduceAll.cuh line=327 error=59 : device-side assert triggered\n"
            "Traceback (most recent call last):\n"
            '  File "./tools/train.py", line 102, in <module>\n'
            "    main()\n")
    assert findings(text) == [("DFD517", "main", None, None)]


def test_a_cpp_terminate_whose_reason_is_an_out_of_memory():
    text = ("terminate called after throwing an instance of 'std::runtime_error'\n"
            "  what():  [TM][ERROR] CUDA runtime error: out of memory /lmdeploy/src/turbomind/utils/allocator.h:233\n")
    assert [code for code, *_ in findings(text)] == ["DFD502"]


# -- held-out batch Q ---------------------------------------------------------------------------------------------

def test_older_timeouts_take_their_processes_down_without_another_finding():
    timeout = ("[E ProcessGroupNCCL.cpp:457] [Rank {n}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1"
               ", OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800035 milliseconds before timing out.\n")
    text = (timeout.format(n=3) + timeout.format(n=2)
            + "[E ProcessGroupNCCL.cpp:471] Some NCCL operations have failed or timed out. Due to the asynchronous "
            "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.\n"
            "[E ProcessGroupNCCL.cpp:477] To avoid data inconsistency, we are taking the entire process down.\n")
    assert findings(text) == [("DFD504", "rank2", None, None), ("DFD504", "rank3", None, None)]


def test_the_prefixs_global_rank_names_the_worker_not_the_sub_groups_rank_in_the_message():
    line = ("[rank{g}]:[E218 04:54:22.86 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=216, OpType=ALLTOALL_BASE, Timeout(ms)=600000) ran for 600045 milliseconds "
            "before timing out.\n")
    assert findings(line.format(g=13) + line.format(g=15)) == [("DFD504", "rank13", None, None),
                                                                 ("DFD504", "rank15", None, None)]


def test_the_heartbeat_monitors_fatal_record_wrapped_by_the_terminal():
    text = ("[rank6]:[F429 14:03:49.385 ProcessGroupNCCL.cpp:1554] [PG ID 0 PG GUID \n"
            "0(default_pg) Rank 6] [PG ID 0 PG GUID 0(default_pg) Rank 6] Terminating the process after attempting "
            "to dump debug info, due to ProcessGroupNCCL\n")
    assert findings(text) == [("DFD512", "rank6", None, None)]


def test_a_ray_process_that_named_its_rank_keeps_it_on_unprefixed_lines():
    text = ("(WorkerDict pid=3943529) [rank0]:[E816 01:09:38.26 ProcessGroupNCCL.cpp:627] [Rank 0] To avoid data "
            "inconsistency, we are taking the entire process down.\n"
            "(WorkerDict pid=3943529) Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/"
            "ProcessGroupNCCL.cpp:609 (most recent call first):\n")
    assert findings(text) == [("DFD512", "rank0", None, None)]


@pytest.mark.parametrize("text,expected", [
    ("```\nexitcode  : -11 (pid: 5277) (SIGSEGV)\n```\n", [("DFD514", "main", None, "SIGSEGV")]),
    ("`\"[rank0]: AttributeError: 'FullyShardedDataParallel' object has no attribute '_streams'\"`\n",
     [("DFD513", "rank0", None, None)]),
])
def test_one_line_left_of_a_summary_or_quoted_inline(text, expected):
    assert findings(text) == expected


def test_a_bare_header_then_frames_behind_a_doubled_rank_prefix_through_records_wrapper():
    text = ("Traceback (most recent call last):\n"
            '[rank0]:[rank0]:   File "/srv/train.py", line 215, in <module>\n'
            "[rank0]:[rank0]:     main(config, logger)\n"
            '[rank0]:[rank0]:   File "/srv/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, '
            "in wrapper\n"
            "[rank0]:[rank0]:     return f(*args, **kwargs)\n"
            '[rank0]:[rank0]:   File "/srv/model.py", line 61, in forward\n')
    # torchrun's @record wrapper is on the worker's main too: this is rank 0's traceback, not the launcher's
    assert findings(text) == [("DFD513", "rank0", None, None)]


# -- held-out batch R ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("and it said 'Segmentation fault (core dumped)', what can I do?\n", [("DFD514", "main", None, "SIGSEGV")]),
    ("process killed by signal 9\nprogram finished with exit code -1\n", [("DFD514", "main", None, "SIGKILL")]),
    ("slurmstepd: error: Job 7518 exceeded memory limit (626359956 > 512000000), being killed\n"
     "slurmstepd: error: *** JOB 7518 ON node3 CANCELLED AT 2022-06-10T17:11:35 ***\n",
     [("DFD514", "main", None, "SIGKILL")]),
    ("slurmstepd: error: *** JOB 7519 ON node3 CANCELLED AT 2022-06-10T17:11:35 DUE TO TIME LIMIT ***\n",
     [("DFD514", "main", None, "SIGTERM")]),
    ("Fri Sep 22 11:52:15 2017[1,7]<stderr>:./train.sh: line 207: 10558 Segmentation fault      ./trainer --x=1\n",
     [("DFD514", "rank7", None, "SIGSEGV")]),
    ("SystemError: (Fatal) DataLoader process (pid 1104) exited is killed by signal: Killed. (at data_loader.cc:181)\n",
     [("DFD514", "main", None, "SIGKILL")]),
])
def test_crash_and_kill_reports_of_shells_schedulers_and_mpi(text, expected):
    assert findings(text) == expected


@pytest.mark.parametrize("text,code", [
    ("node1:3018451:3018451 [0] enqueue.cc:1085 NCCL WARN Cuda failure 'out of memory'\n", "DFD502"),
    ("node1:392:494 [2] enqueue.cc:54 NCCL WARN Cuda failure 'invalid resource handle'\n", "DFD516"),
    ("node2:25169:25849 [2] NCCL WARN NET/IB : Got completion from peer 10.0.0.1<43129> with error 4, opcode 0\n",
     "DFD516"),
    ("HCA-19: Test NCCL failure common.cu:1204 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '\n",
     "DFD516"),
    ("  what():  [10:44:35] src/storage/pooled_storage_manager.h:107: cudaMalloc failed: out of memory\n", "DFD502"),
])
def test_nccl_and_mxnet_in_their_own_records(text, code):
    assert [found[0] for found in findings(text)] == [code]


# -- held-out batch S ---------------------------------------------------------------------------------------------

def test_a_traceback_flattened_onto_one_line():
    cut = ('> Traceback (most recent call last): File "finetune.py", line 534, in fire.Fire(train) File '
           '"/usr/lib/python3.8/site-packages/fire/core.py", line 141, in Fire component_trace = _Fire(comp\n')
    assert findings(cut) == [("DFD513", "main", None, None)]
    whole = ('Traceback (most recent call last): File "train.py", line 9, in <module> loss.backward() RuntimeError: '
             "CUDA error: an illegal memory access was encountered\n")
    assert findings(whole) == [("DFD511", "main", None, None)]
    launcher_line = ("E0201 10:55:55.9 290975 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: "
                     '1) local_rank: 1 (pid: 291192) of binary: /usr/bin/python3 Traceback (most recent call last): '
                     'File "/opt/bin/accelerate", line 8, in <module>\n')
    assert ("DFD513", "rank1", None, None) in findings(launcher_line)


def test_open_mpis_signal_report_without_its_host_prefix():
    text = (" *** Process received signal ***\n"
            " Signal: Segmentation fault (11)\n"
            " Signal code: Address not mapped (1)\n"
            "Failing at address: 0xfffffee8\n")
    assert findings(text) == [("DFD514", "main", None, "SIGSEGV")]


# -- held-out batch T ---------------------------------------------------------------------------------------------

def test_ipython_frames_pasted_without_their_header():
    from tests.logs.test_scan import scan_text

    text = ("File ~/anaconda3/lib/python3.8/site-packages/pytorch_lightning/strategies/launchers/multiprocessing.py:113"
            ", in _MultiProcessingLauncher.launch(self, function, trainer, *args, **kwargs)\n"
            "    111     process_args = [trainer, function, args, kwargs, return_queue]\n"
            "--> 113 mp.start_processes(\n"
            "    114     self._wrapping_function,\n")
    # read in full blocks only (a pasted excerpt), like the other frames without a header
    assert [(f.code, f.evidence["thread"]) for f in scan_text(text).findings] == [("DFD513", "main")]
    with_header = ("---------------------------------------------------------------------------\n"
                   "RuntimeError                              Traceback (most recent call last)\n"
                   "File ~/work/train.py:12, in step(batch)\n"
                   "---> 12 loss = model(batch)\n"
                   "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert findings(with_header) == [("DFD511", "main", None, None)]


# -- held-out batch U ---------------------------------------------------------------------------------------------

def test_rays_guesses_at_a_dead_actors_cause_are_not_its_cause():
    from tests.logs.test_scan import scan_text

    text = ("ray.exceptions.RayTaskError(RayActorError): ray::main_task() (pid=10066, ip=10.0.0.1)\n"
            '  File "/srv/verl/trainer/main_ppo.py", line 135, in main_task\n'
            "    trainer.fit()\n"
            "ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.\n"
            "\tclass_name: WorkerDict\n"
            "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR. There are some "
            "potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage.\n")
    # read in full (a pasted excerpt): Ray's header line opens no traceback in a sampled log, where the exception
    # and its guesses are read as separate lines
    assert [(f.code, f.evidence["thread"]) for f in scan_text(text).findings] == [("DFD513", "main")]


def test_a_traceback_after_a_signal_line_is_its_own_death():
    text = ("WARNING:torch.distributed.elastic.agent.server.api:Received 2 death signal, shutting down workers\n"
            "Traceback (most recent call last):\n"
            '  File "main.py", line 84, in <module>\n'
            "    main()\n")
    # a process killed by a signal prints no traceback after it: this one ended on its own (here, on SIGINT)
    assert [code for code, *_ in findings(text)] == ["DFD513", "DFD514"]


def test_a_lowercased_oom_message_in_a_sentence_still_names_its_gpu():
    text = "but I got `cuda out of memory, tried to allocate 50MiB(GPU 0; 1.96GiB totalcapacity;1.2GiB already`\n"
    assert findings(text) == [("DFD502", "main", 0, None)]


# -- held-out batch V ---------------------------------------------------------------------------------------------

def test_a_flattened_traceback_whose_lost_lines_kept_their_vllm_prefix():
    prefix = "(VllmWorker rank=0 pid=234357) ERROR 09-26 01:47:48 [multiproc_executor.py:546] "
    text = (prefix + "WorkerProc hit an exception." + prefix + "Traceback (most recent call last):" + prefix
            + 'File "/srv/vllm/v1/executor/multiproc_executor.py", line 541, in worker_busy_loop' + prefix
            + "output = func(*args, **kwargs)\n")
    assert findings(text) == [("DFD513", "rank0", None, None)]
