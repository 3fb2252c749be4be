"""Training-log rules (DFD5xx): what `dflash-doctor logs` finds while streaming a log.

Each rule is declared once, in the module of its family, as a `LogRule` (model.py): its registry metadata (code,
name, rationale, fix, bad/good examples), the literal words the block prefilter looks for (`triggers`: a line holding
none of them is never parsed for the rule), the pattern that recognises it on a line or in an exception's
'Type: message', and its own behaviour as fields and hooks. Which rule takes a text several rules match is declared
in one place, precedence.py's PRECEDENCE; LOG_RULES below is the declared rules in that order, and the scanner
(dflash_doctor/logs/) derives its prefilter and its classification from it. Examples use example_format "log": plain
log excerpts, scanned by `dflash_doctor.logs.examples.run_example` (tests/test_rule_examples.py runs every one).
The texts are what torch, Python, NCCL, Triton and torchrun print (torch/_dynamo/eval_frame.py,
c10/cuda/CUDACachingAllocator.cpp, ProcessGroupNCCL.cpp, triton/runtime/errors.py,
torch/distributed/elastic/multiprocessing/errors/__init__.py, Lib/threading.py), written here as stand-ins.

The families:
    doctor_report.py   DFD522  dflash-doctor's own findings in a saved `run` output
    dataparallel.py    DFD519  an nn.DataParallel replica that failed in its thread
    fx_tracing.py      DFD509 DFD501 DFD518  torch.jit.trace over compiled code, the FX-tracing race, the patcher race
    gpu_faults.py      DFD510 DFD502 DFD511 DFD517  Triton out of resources, CUDA OOM, illegal access, device assert
    nccl.py            DFD512 DFD504 DFD516  the watchdog's abort, a collective timeout, a NCCL error
    dynamo.py          DFD506 DFD521 DFD520 DFD505  recompile limit, a limit not in a worker, first calls, dense path
    signals.py         DFD514  a signal death (its wordings: signal_wordings.py)
    hangs.py           DFD515 DFD507  a stuck process's stack dump, a stalled thread
    deaths.py          DFD508 DFD513  a thread's or a process's death no narrower rule explains
    throughput.py      DFD503  a throughput drop
"""
from __future__ import annotations

from typing import Dict, Tuple

from dflash_doctor.rules.logs.dataparallel import LOG_DATAPARALLEL_REPLICA
from dflash_doctor.rules.logs.deaths import LOG_PROCESS_DIED, LOG_THREAD_DIED
from dflash_doctor.rules.logs.doctor_report import LOG_DOCTOR_FINDING
from dflash_doctor.rules.logs.dynamo import (
    LIMIT_DEFAULTS,
    LOG_DENSE_ATTENTION_FALLBACK,
    LOG_RECOMPILE_LIMIT,
    LOG_SETTING_NOT_IN_WORKER,
    LOG_THREADS_RACED_FIRST_CALL,
)
from dflash_doctor.rules.logs.fx_tracing import LOG_FX_PATCHER_RACE, LOG_FX_TRACE_RACE, LOG_JIT_TRACE_COMPILED
from dflash_doctor.rules.logs.gpu_faults import (
    LOG_CUDA_DEVICE_ASSERT,
    LOG_CUDA_ILLEGAL_MEMORY_ACCESS,
    LOG_CUDA_OOM,
    LOG_TRITON_OUT_OF_RESOURCES,
)
from dflash_doctor.rules.logs.hangs import LOG_STACK_DUMP_HANG, LOG_THREAD_STALLED
from dflash_doctor.rules.logs.model import (
    ABORT_LINES,
    DECLARED,
    UNNAMED,
    Details,
    HeldLine,
    HeldRecompile,
    LineHook,
    LineMemory,
    LogRule,
    MatchHook,
    NextSteps,
    RuleLine,
    RuleScanner,
    declare,
)
from dflash_doctor.rules.logs.nccl import NCCL_TAKEN_DOWN, LOG_NCCL_ERROR, LOG_NCCL_TIMEOUT, LOG_NCCL_WATCHDOG_ABORT
from dflash_doctor.rules.logs.precedence import PRECEDENCE, Place, resolve
from dflash_doctor.rules.logs.shared import fix_line, fix_step, gpu_in
from dflash_doctor.rules.logs.signal_wordings import (
    SIGNAL_MEANING,
    SIGNAL_WORDINGS,
    SIGNALS,
    SignalDecoder,
    SignalReading,
    SignalWording,
    signal_wording,
)
from dflash_doctor.rules.logs.signals import LOG_KILLED_BY_SIGNAL
from dflash_doctor.rules.logs.throughput import LOG_THROUGHPUT_DROP

# Every declared rule, by code, in PRECEDENCE's order: the order in which the scanner tries them.
LOG_RULES: Dict[str, LogRule] = resolve(DECLARED)

# Which codes name why a worker died, for `status` and the views.
DEATH_CODES: Tuple[str, ...] = tuple(code for code, entry in LOG_RULES.items() if entry.fatal) + (
    LOG_THREAD_DIED.code, LOG_PROCESS_DIED.code)


def trigger_words() -> Tuple[str, ...]:
    return tuple(word for entry in LOG_RULES.values() for word in entry.triggers)


__all__ = [
    "ABORT_LINES", "DEATH_CODES", "DECLARED", "Details", "HeldLine", "HeldRecompile", "LIMIT_DEFAULTS",
    "LOG_CUDA_DEVICE_ASSERT", "LOG_CUDA_ILLEGAL_MEMORY_ACCESS", "LOG_CUDA_OOM", "LOG_DATAPARALLEL_REPLICA",
    "LOG_DENSE_ATTENTION_FALLBACK", "LOG_DOCTOR_FINDING", "LOG_FX_PATCHER_RACE", "LOG_FX_TRACE_RACE",
    "LOG_JIT_TRACE_COMPILED", "LOG_KILLED_BY_SIGNAL", "LOG_NCCL_ERROR", "LOG_NCCL_TIMEOUT", "LOG_NCCL_WATCHDOG_ABORT",
    "LOG_PROCESS_DIED", "LOG_RECOMPILE_LIMIT", "LOG_RULES", "LOG_SETTING_NOT_IN_WORKER", "LOG_STACK_DUMP_HANG",
    "LOG_THREADS_RACED_FIRST_CALL", "LOG_THREAD_DIED", "LOG_THREAD_STALLED", "LOG_THROUGHPUT_DROP",
    "LOG_TRITON_OUT_OF_RESOURCES", "LineHook", "LineMemory", "LogRule", "MatchHook", "NCCL_TAKEN_DOWN", "NextSteps",
    "PRECEDENCE", "Place", "RuleLine", "RuleScanner", "SIGNALS", "SIGNAL_MEANING", "SIGNAL_WORDINGS",
    "SignalDecoder", "SignalReading", "SignalWording", "UNNAMED", "declare", "fix_line", "fix_step", "gpu_in",
    "signal_wording", "trigger_words",
]
