"""DFD514: a worker process killed by a signal (SIGKILL, SIGSEGV, SIGABRT, SIGBUS, ...). How each tool prints it
is signal_wordings.py."""
from __future__ import annotations

from typing import Any, Dict, Optional

from dflash_doctor.findings import Severity
from dflash_doctor.rules.logs.model import RuleLine, RuleScanner, declare
from dflash_doctor.rules.logs.signal_wordings import SIGNAL_LINE, signal_details
from dflash_doctor.rules.registry import Rule


def _signal_line(scanner: RuleScanner, line: RuleLine, details: Dict[str, Any]) -> Optional[str]:
    if "Fatal Python error" in line.body or "received signal" in line.body:
        scanner.memory.fatal_error_line = line.lineno  # faulthandler's (or gdb's) thread dump follows: the crash's
    if details.get("cancelled") and scanner.is_dead(line.worker):
        return None  # the scheduler's closing line for a job a line above already said it killed
    return line.worker


def _per_signal(worker: str, details: Dict[str, Any]) -> tuple:
    # a DataLoader worker's crash is printed twice (by the worker, then by the loader with its pid)
    return (worker, details.get("signal"), "DataLoader" if details.get("worker_kind") else details.get("pid"))


LOG_KILLED_BY_SIGNAL = declare(Rule(
    code="DFD514",
    name="log-killed-by-signal",
    severity=Severity.ERROR,
    summary="a worker process was killed by a signal (SIGKILL, SIGSEGV, SIGABRT, SIGBUS, ...)",
    rationale=(
        "A process killed by a signal prints no Python traceback: what is left is torchrun's 'Signal 9 "
        "(SIGKILL) received by PID N' or 'exitcode: -9', DeepSpeed's 'exits with return code = -9', the shell's "
        "'Killed' or 'Segmentation fault (core dumped)', the kernel's 'Out of memory: Killed process N', a "
        "DataLoader worker's 'Unexpected segmentation fault encountered in worker', or faulthandler's 'Fatal "
        "Python error' (its thread dump is the crash's stack, not a hang); zsh reports 'zsh: segmentation fault' "
        "or 'zsh: killed'; other launchers and handlers use their own words (MosaicML composer's 'Rank 2 crashed "
        "with exit code -7', Slurm's 'Detected 8 oom-kill event(s)' in a job's cgroup, PaddlePaddle's 'FatalError: "
        "`Segmentation fault` is detected by the operating system'). The signal says where to look: SIGKILL is usually the host OOM killer, SIGSEGV a native crash, SIGABRT a C++ "
        "abort (often the NCCL watchdog, DFD512), SIGBUS a full /dev/shm, SIGTERM the launcher stopping workers "
        "after another rank failed."
    ),
    fix="Follow the signal's meaning in the evidence; for SIGKILL check `dmesg` for the OOM killer and host RAM.",
    example_format="log",
    bad=(
        "E1129 09:41:10.771000 4001 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
        "local_rank: 2 (pid: 4244) of binary: /usr/bin/python3\n"
    ),
    good=(
        "W1129 09:41:10.771000 4001 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 4244 "
        "closing signal SIGTERM\n"
    ),
), triggers=("SIG", "oom-kill event", "exceeded memory limit", "CANCELLED AT", "exitcode: -", "FAILED (exitcode -", "Received ", "Signal: ", "Caught signal", "AddressSanitizer", "BadAlloc", "SignalException", "with exit code", "exited with code", "memory pressure", "Killed", "Segmentation fault", "Aborted", "Bus error",
             "Terminated", "Floating point exception", "Fatal Python error", "killed by signal",
             "encountered in worker", "encountered in DataLoader worker", "exits with return code", "what():",
             "exit code", "exit status", "已杀死",
             "段错误", "zsh: ", "(core dumped)"),
    fatal=True,
    pattern=SIGNAL_LINE, details=signal_details, on_line=_signal_line, line_is_death=True, death_kind="signal",
    finding_key=_per_signal, explains_cut_traceback=False,
    next_steps=lambda found, threads, count: [
        "dmesg -T | grep -i -e 'killed process' -e 'out of memory': SIGKILL is usually the host's OOM killer (host "
        "RAM, not GPU memory)"] if any(f.evidence.get("signal") == "SIGKILL" for f in found) else None,
    describe=lambda d: (f"{d['worker_kind']} " if d.get("worker_kind") else "")
    + f"killed by {d.get('signal') or 'a signal'}"
    + (f" (pid {d['pid']})" if d.get("pid") else "") + (f": {d['meaning']}" if d.get("meaning") else ""))
