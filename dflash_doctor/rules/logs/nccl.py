"""NCCL and its process group: the watchdog's abort (DFD512), a collective that timed out (DFD504), a NCCL error
(DFD516)."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.rules.logs.model import (
    ABORT_LINES,
    UNNAMED,
    HeldLine,
    RuleLine,
    RuleScanner,
    declare,
)
from dflash_doctor.rules.logs.shared import gpu_details
from dflash_doctor.rules.registry import Rule

# '[PG 0 Rank 3]', '[Rank 3]' (a pasted line may be cut after the rank)
_RANK_MENTION = re.compile(r"\[(?:PG [^\]]{0,120}?)?Rank (?P<rank>\d+)(?:\]|\s*$)")


def _stopped_first(threads: Dict[str, dict]) -> Optional[str]:
    ranked = [(t["last_step"], name) for name, t in threads.items()
              if t.get("last_step") is not None and name != UNNAMED]
    if len(ranked) < 2:
        return None
    step, name = min(ranked)
    return f"{name}, last step {step}"


def _after_a_timeout(found: Sequence[Finding], threads: Dict[str, dict], count: int) -> Optional[List[str]]:
    if not any(f.evidence.get("inner_cause") in (None, "collective timeout") for f in found):
        return None
    first = _stopped_first(threads)
    where = f" ({first})" if first else ""
    return [f"a collective timed out: find the rank that stopped first{where} and read its own error or stack; the "
            "timeouts of the others follow from it"]


# The watchdog's abort is placed before the CUDA kinds (precedence.py): its termination line names them as its inner
# cause ('... watchdog thread terminated with exception: CUDA error: an illegal memory access ...').
_ABORT_INNER = (
    ("collective timeout", re.compile(r"Watchdog caught collective operation timeout|ran for \d+ milliseconds"
                                      r"|checkTimeout")),
    ("illegal memory access", re.compile(r"illegal memory access")),
    ("NCCL error", re.compile(r"NCCL error|nccl\w*Error|unhandled (?:cuda|system) error", re.I)),
    ("heartbeat monitor timeout", re.compile(r"Heartbeat monitor timed out|watchdog got stuck"
                                             r"|Terminating the process after attempting to dump debug info")),
)


# Older releases' end of a process after its collective timed out (scanner.py reads them as that timeout's end).
NCCL_TAKEN_DOWN = r"Some NCCL operations have failed or timed out|taking the entire process down"


def _abort_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    rank = _RANK_MENTION.search(text)
    inner = next((name for name, pattern in _ABORT_INNER if pattern.search(text)), None)
    return {"rank": int(rank.group("rank")) if rank else None, "inner_cause": inner}


_TAKEN_DOWN = re.compile(NCCL_TAKEN_DOWN)


def _abort_line(scanner: RuleScanner, line: RuleLine, details: Dict[str, Any]) -> Optional[str]:
    """C++ prints 'terminate called ...' without a rank, before or after the line that names it."""
    memory = scanner.memory
    worker = line.worker
    if worker == UNNAMED:
        last = memory.last_abort
        if last is not None and line.lineno - last.lineno <= ABORT_LINES:
            worker = last.worker
        elif _TAKEN_DOWN.search(line.body) and 0 <= line.lineno - memory.last_timeout <= ABORT_LINES:
            return None  # older releases: the timeouts just reported take their processes down
        else:
            if memory.held_abort is None:
                memory.held_abort = HeldLine(UNNAMED, line.lineno, line.body, details)
            return None
    memory.held_abort = None
    memory.last_abort = HeldLine(worker, line.lineno)
    return worker


LOG_NCCL_WATCHDOG_ABORT = declare(Rule(
    code="DFD512",
    name="log-nccl-watchdog-abort",
    severity=Severity.ERROR,
    summary="ProcessGroupNCCL's watchdog aborted the process (C++ terminate, no Python traceback)",
    rationale=(
        "When a collective times out or the CUDA context breaks, ProcessGroupNCCL's watchdog thread throws "
        "c10::DistBackendError in C++: 'terminate called after throwing an instance of 'c10::DistBackendError'' "
        "then 'what(): [PG 0 Rank 1] Process group watchdog thread terminated with exception: ...' and only C++ "
        "frames ('frame #0: c10::Error::Error(...)'). The process dies of SIGABRT and no Python traceback is "
        "printed, so the reason is the 'what()' text: a collective timeout (another rank stopped calling "
        "collectives), an illegal memory access, or a NCCL error. The evidence names which. Releases before the "
        "watchdog reported its own termination threw the timeout itself: 'terminate called after throwing an "
        "instance of 'std::runtime_error'' then 'what():  [Rank 7] Watchdog caught collective operation timeout'. "
        "When the watchdog itself hangs, the heartbeat monitor ends the process ('Heartbeat monitor timed out', "
        "'Terminating the process after attempting to dump debug info'). Older releases followed each timeout "
        "with 'Some NCCL operations have failed or timed out ... taking the entire process down': that is the "
        "timeout's own end, reported with it (DFD504)."
    ),
    fix=(
        "Read inner_cause: a timeout means look for the rank that stopped first (its own death or stall is the "
        "real cause); an illegal memory access see DFD511; a NCCL error see DFD516."
    ),
    example_format="log",
    bad=(
        "[rank1]:[E1129 09:40:02.414 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 1] Process group watchdog thread "
        "terminated with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, "
        "OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) ran for 600067 milliseconds before "
        "timing out.\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        "Exception raised from ncclCommWatchdog at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1599 (most "
        "recent call first):\n"
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f8a in libc10.so)\n"
    ),
    good=(
        "[rank1]:[I1129 09:30:02.414 ProcessGroupNCCL.cpp:2012] [PG 0 Rank 1] ProcessGroupNCCL initialized\n"
    ),
), triggers=("watchdog thread terminated", "ProcessGroupNCCL", "DistBackendError", "Some NCCL operations",
             "what():", "ncclCommWatchdog"),
    fatal=True,
    # Before the watchdog thread reported its own termination, it threw the timeout itself: 'terminate called
    # after throwing ... std::runtime_error' then 'what():  [Rank 7] Watchdog caught collective operation timeout'.
    pattern=re.compile(r"watchdog thread terminated(?: with\b|\s*$)"  # or wrapped
                       r"|what\(\):\s+\[(?:PG [^\]]{0,120}?)?Rank \d+\] Watchdog caught collective"
                       # the watchdog's what() cut right after the process group and rank it names
                       r"|what\(\):\s+\[PG [^\]]{0,120}?Rank \d+\]?\s*$"
                       r"|instance of '?c10::DistBackendError|Heartbeat monitor timed out"
                       # the heartbeat monitor's fatal record, when the watchdog itself hung
                       r"|Terminating the process after attempting to dump debug info"
                       r"|ProcessGroupNCCL::WorkNCCL::checkTimeout|Exception raised from (?:checkTimeout|ncclCommWatchdog)"
                       # torch >= 2.6 runs the watchdog as ProcessGroupNCCL::Watchdog ('Exception raised from run at
                       # .../ProcessGroupNCCL.cpp:2063', frames 'c10d::ProcessGroupNCCL::Watchdog::runLoop()')
                       r"|ProcessGroupNCCL::Watchdog::run|Exception raised from run(?:Loop)? at \S*ProcessGroupNCCL"
                       # a c10::Error's backtrace through the watchdog thread (printed when it terminated)
                       r"|frame #\d+: c10d::ProcessGroupNCCL::(?:ncclCommWatchdog|workCleanupLoop|watchdogHandler)\("
                       r"|" + NCCL_TAKEN_DOWN),
    details=_abort_details, on_line=_abort_line, line_is_death=True, records_only=True, next_steps=_after_a_timeout,
    describe=lambda d: "ProcessGroupNCCL's watchdog aborted the process"
    + (f" ({d['inner_cause']})" if d.get("inner_cause") else ""))


_NCCL_TIMEOUT = re.compile(
    r"(?:Watchdog caught|Caught) collective operation timeout: WorkNCCL\((?P<work>.*?)\) ran for (?P<ran>\d+) milliseconds"
    r"|watchdog got stuck for (?P<stuck>\d+) seconds"
)


def _timeout_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    rank = _RANK_MENTION.search(text)
    details: Dict[str, Any] = {"rank": int(rank.group("rank")) if rank else None}
    timed = _NCCL_TIMEOUT.search(text)
    if timed is not None and timed.group("ran"):
        limit = re.search(r"Timeout\(ms\)=(\d+)", timed.group("work"))
        details.update(work=timed.group("work"), ran_ms=int(timed.group("ran")),
                       timeout_ms=int(limit.group(1)) if limit else None)
    elif timed is not None:
        details["stuck_s"] = int(timed.group("stuck"))
    return details


def _timeout_message(details: Dict[str, Any]) -> str:
    if details.get("ran_ms") is not None:
        return f"NCCL collective timed out after {details['ran_ms'] / 1000:.0f} s ({details['work']})"
    if details.get("stuck_s") is not None:
        return f"NCCL watchdog stuck for {details['stuck_s']} s"
    return "NCCL collective timed out"


def _timeout_line(scanner: RuleScanner, line: RuleLine, details: Dict[str, Any]) -> Optional[str]:
    scanner.memory.last_timeout = line.lineno  # the abort lines that follow are this timeout's end
    return line.worker


LOG_NCCL_TIMEOUT = declare(Rule(
    code="DFD504",
    name="log-nccl-timeout",
    severity=Severity.ERROR,
    summary="NCCL collective timed out or the process-group watchdog fired",
    rationale=(
        "ProcessGroupNCCL's watchdog aborts a collective that ran past its timeout ('Watchdog caught collective "
        "operation timeout: WorkNCCL(...) ran for N milliseconds before timing out'). One rank that stopped "
        "calling collectives, for example because its worker thread died, hangs every other rank until then. "
        "One finding per rank; repeats are counted in the evidence."
    ),
    fix="Find the rank that stopped first (its last step is lowest in the facts) and why it stopped.",
    example_format="log",
    bad=(
        "[rank3]:[E321 02:07:08.414640780 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
        "Timeout(ms)=600000) ran for 600067 milliseconds before timing out.\n"
    ),
    good=(
        "[rank3]:[I321 02:07:08.414640780 ProcessGroupNCCL.cpp:2012] [PG 0 Rank 3] ProcessGroupNCCL initialized\n"
    ),
), triggers=("WorkNCCL", "ProcessGroupNCCL", "NCCL timeout"), fatal=True,
    # A pasted line cut inside the phrase ('... Watchdog caught collective operati') is still the timeout.
    # (work.wait() of older releases raised it in Python: 'RuntimeError: [Rank 1] Caught collective operation
    # timeout: WorkNCCL(...) ran for N milliseconds')
    pattern=re.compile(r"Watchdog caught collective(?: operation timeout|[\w ]{0,12}$)"
                       r"|\] Caught collective operation timeout|watchdog got stuck for \d+ seconds"
                       # (not the key-value store's 'store->get('0') got error: wait timeout' while a communicator
                       # is set up: a rank that never reached it, not a collective that ran too long)
                       r"|NCCL timeout|DistBackendError: (?!.*store->get).*?[Tt]imed? ?out"),
    details=_timeout_details, describe=_timeout_message, on_line=_timeout_line, records_only=True,
    next_steps=_after_a_timeout)

LOG_NCCL_ERROR = declare(Rule(
    code="DFD516",
    name="log-nccl-error",
    severity=Severity.ERROR,
    summary="NCCL reported an error (not a timeout): network, topology or a CUDA failure inside NCCL",
    rationale=(
        "'NCCL error in: .../ProcessGroupNCCL.cpp, unhandled system error' (or 'unhandled cuda error', "
        "'remote process exited or there was a network error', ncclInternalError; TensorFlow's 'NCCL "
        "communication aborted: unhandled system error') means a NCCL call failed, "
        "usually at the first collective: a network interface or InfiniBand setting, shared-memory limits in a "
        "container, mismatched NCCL versions, or a peer rank that already died. Unlike a timeout (DFD504) it fails "
        "fast and names the failing call."
    ),
    fix=(
        "Rerun with NCCL_DEBUG=INFO to see which transport failed; in containers give /dev/shm room (--shm-size) "
        "or set NCCL_SHM_DISABLE=1; pin NCCL_SOCKET_IFNAME; check whether another rank died first."
    ),
    example_format="log",
    bad=(
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/workspace/train.py", line 30, in <module>\n'
        "[rank0]:     dist.barrier()\n"
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version "
        "2.20.5\n"
    ),
    good=(
        "[rank0]: NCCL INFO Channel 00/02 :    0   1\n"
    ),
), triggers=("NCCL error", "NCCL Error", "ncclInternalError", "ncclSystemError", "ncclUnhandledCudaError",
             "ncclRemoteError", "ncclInvalidUsage", "NCCL communication aborted", "NCCL WARN", "NCCL failure"),
    fatal=True,
    # (TensorFlow's collectives: 'NCCL communication aborted: unhandled system error')
    pattern=re.compile(r"NCCL [Ee]rror|nccl(?:Internal|System|UnhandledCuda|Remote|InvalidUsage)Error"
                       r"|NCCL communication aborted: unhandled"
                       # NCCL's own records (NCCL_DEBUG=WARN) of a failed CUDA call or an InfiniBand completion error,
                       # and nccl-tests' 'Test NCCL failure common.cu:1204 'unhandled cuda error''
                       r"|NCCL WARN Cuda failure '|NCCL WARN NET/IB ?: Got completion from peer .* with (?:error|status)"
                       r"|Test NCCL failure \S+ '"),
    details=gpu_details, records_only=True,
    describe=lambda d: "NCCL error (a failed NCCL call, not a timeout)")
