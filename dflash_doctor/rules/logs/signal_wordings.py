"""How a signal death is printed (DFD514's wordings): by torchrun, DeepSpeed, torch.multiprocessing, the shell,
the kernel's OOM killer, faulthandler, Slurm, Windows and others; each wording with its own decoder and an example
(tests/logs/test_signal_wordings.py reads each back), and the one pattern of them all that the rule searches."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Optional, Tuple

from dflash_doctor.rules.logs.shared import DS_LOCAL_RANK


# Signal deaths: torchrun's summary ('Signal 9 (SIGKILL) received by PID 4242'), its agent ('failed (exitcode:
# -9) local_rank: 0 (pid: 4242)'), torch.multiprocessing ('process 0 terminated with signal SIGSEGV'),
# subprocess ('died with <Signals.SIGKILL: 9>'), the shell ('Killed', 'Segmentation fault (core dumped)'), the
# kernel's OOM killer and faulthandler ('Fatal Python error: Segmentation fault').
SIGNALS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
           11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}
_SHELL_SIGNALS = {"Killed": "SIGKILL", "Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT",
                  "Bus error": "SIGBUS", "Illegal instruction": "SIGILL", "Floating point exception": "SIGFPE",
                  "Terminated": "SIGTERM", "已杀死": "SIGKILL", "段错误": "SIGSEGV",  # bash in a zh_CN locale
                  # zsh: 'zsh: segmentation fault (core dumped)  python train.py', 'zsh: killed  python ...'
                  "segmentation fault": "SIGSEGV", "bus error": "SIGBUS", "killed": "SIGKILL", "abort": "SIGABRT",
                  "illegal hardware instruction": "SIGILL", "floating point exception": "SIGFPE",
                  "terminated": "SIGTERM", "illegal instruction": "SIGILL"}
SIGNAL_MEANING = {
    "SIGKILL": "killed from outside: usually the host's OOM killer (check `dmesg`), or a scheduler or launcher",
    "SIGSEGV": "a native crash (C++/CUDA extension, driver): run under faulthandler or gdb for its stack",
    "SIGABRT": "abort() in native code: a C++ exception such as ProcessGroupNCCL's watchdog, or a failed assert",
    "SIGBUS": "a bus error: usually /dev/shm too small for DataLoader workers (raise --shm-size)",
    "SIGTERM": "stopped by the launcher or scheduler, often because another rank failed first",
    "SIGINT": "interrupted (Ctrl-C, or a launcher shutting workers down)",
    "SIGILL": "an illegal instruction: a binary built for another CPU or GPU architecture",
    "SIGFPE": "an arithmetic fault in native code",
}
# torch's DataLoader signal handler, in the worker: 'ERROR: Unexpected segmentation fault encountered in worker.'
_LOADER_SIGNALS = {"bus error": "SIGBUS", "segmentation fault": "SIGSEGV", "floating-point exception": "SIGFPE"}
# Windows has no signals: a crashed process exits with an NTSTATUS, printed signed, unsigned or in hex.
_NTSTATUS = {"C0000005": "SIGSEGV", "C000001D": "SIGILL", "C00000FD": "SIGSEGV", "C0000409": "SIGABRT"}
_NTSTATUS_DECIMAL = {"-1073741819": "C0000005", "3221225477": "C0000005", "-1073741795": "C000001D",
                     "3221225501": "C000001D", "-1073741571": "C00000FD", "3221225725": "C00000FD",
                     "-1073740791": "C0000409", "3221226505": "C0000409"}


@dataclass(frozen=True)
class SignalReading:
    """What one wording of a signal death says; `meaning` None: the signal's usual meaning (SIGNAL_MEANING)."""

    signal: Optional[str]
    pid: Optional[str] = None
    meaning: Optional[str] = None
    local_rank: Optional[int] = None
    rank: Optional[int] = None
    cancelled: bool = False
    worker_kind: Optional[str] = None


SignalDecoder = Callable[["re.Match[str]", str], SignalReading]


@dataclass(frozen=True)
class SignalWording:
    """One way a signal death is printed: who prints it, its pattern (named groups of its own), how to read it, and
    a line as that tool prints it (tests/logs/test_signal_wordings.py reads each back)."""

    wording: str
    pattern: str
    decode: SignalDecoder
    example: str
    signal: Optional[str]  # what `example` decodes to


def _numbered(number: int) -> str:
    return SIGNALS.get(number, f"signal {number}")


def _named(group: str) -> SignalDecoder:
    return lambda m, text: SignalReading(m.group(group), pid=m.group("pid") if "pid" in m.re.groupindex else None)


def _shell_named(m: "re.Match[str]", text: str) -> SignalReading:
    return SignalReading(_SHELL_SIGNALS[m.group("name")], pid=m.group("pid") if "pid" in m.re.groupindex else None)


def _host_oom(m: "re.Match[str]", text: str) -> SignalReading:
    return SignalReading("SIGKILL", pid=m.group("pid"), meaning="the host's OOM killer (host RAM, not GPU memory)")


def _agent_told(signal: str) -> SignalReading:
    return SignalReading(signal, meaning="the torchrun agent itself was told to stop (scheduler, Ctrl-C or a timeout)")


def _agent_exit(m: "re.Match[str]", text: str) -> SignalReading:
    return SignalReading(_numbered(-int(m.group("exitcode"))), pid=m.group("pid"),
                         local_rank=int(m.group("local_rank")))


def _deepspeed_exit(m: "re.Match[str]", text: str) -> SignalReading:
    named = DS_LOCAL_RANK.search(text)
    return SignalReading(_numbered(-int(m.group("code"))), local_rank=int(named.group(1)) if named else None)


def _windows(code: str, shown: str) -> SignalReading:
    signal = _NTSTATUS[code]
    return SignalReading(signal, meaning=f"Windows NTSTATUS {shown}: " + SIGNAL_MEANING.get(signal, ""))


def _loader_killed(m: "re.Match[str]", text: str) -> SignalReading:
    name = m.group("name")
    return SignalReading(_SHELL_SIGNALS[name] if name else None, pid=m.group("pid"), worker_kind="DataLoader worker")


_SHELL_WORDS = "Killed|Segmentation fault|Aborted|Bus error|Illegal instruction|Floating point exception|Terminated"

# In the order they are tried at one position of a line (a regex alternation: the leftmost match wins, and at one
# position the first wording that matches).
SIGNAL_WORDINGS: Tuple[SignalWording, ...] = (
    SignalWording("torchrun's summary", r"[Ss]ignal \d+ \((?P<name>SIG[A-Z]+)\) received by PID (?P<pid>\d+)",
                  _named("name"), "  error_file: <N/A>  Signal 9 (SIGKILL) received by PID 4242", "SIGKILL"),
    SignalWording("torchrun's agent", r"failed \(exitcode: (?P<exitcode>-\d+)\) local_rank: (?P<local_rank>\d+) "
                  r"\(pid: (?P<pid>\d+)\)", _agent_exit,
                  "api.py:869] failed (exitcode: -11) local_rank: 2 (pid: 4244) of binary: /usr/bin/python3",
                  "SIGSEGV"),
    SignalWording("torch 1.9-1.10's agent", r"Child process (?P<pid>\d+) \(local_rank (?P<local_rank>\d+)\) FAILED "
                  r"\(exitcode (?P<exitcode>-\d+)\)", _agent_exit,
                  "ERROR:torch.distributed.elastic.multiprocessing.api:Child process 32378 (local_rank 0) FAILED "
                  "(exitcode -9)", "SIGKILL"),
    SignalWording("torch.multiprocessing and subprocess",
                  r"(?:terminated|died|killed|exited) (?:with|by) (?:signal )?<?(?:Signals\.)?(?P<name>SIG[A-Z]+)",
                  _named("name"), "process 0 terminated with signal SIGSEGV", "SIGSEGV"),
    # PyCharm: 'Process finished with exit code 137 (interrupted by signal 9: SIGKILL)' (full-width in a CJK locale)
    # (gdb's 'Program received signal SIGINT, Interrupt.' is the debugger stopping a live process, not a death)
    SignalWording("PyCharm and others", r"(?:interrupted by|received) signal (?:\d+[:\uff1a] ?)?(?P<name>SIG[A-Z]+)\b"
                  r"(?!, (?:Interrupt|Trace/breakpoint))", _named("name"),
                  "Process ended (interrupted by signal 9: SIGKILL)", "SIGKILL"),
    SignalWording("a shell, PyCharm or docker: 128 + the signal's number",
                  r"(?:finished|exited) with (?:exit )?code (?P<code>13[0-9]|14[0-3])\b",
                  lambda m, text: SignalReading(_numbered(int(m.group("code")) - 128)),
                  "Process finished with exit code 134", "SIGABRT"),
    SignalWording("torchrun's agent told to stop", r"SignalException: Process (?P<pid>\d+) got signal: (?P<num>\d+)",
                  lambda m, text: replace(_agent_told(_numbered(int(m.group("num")))), pid=m.group("pid")),
                  "torch.distributed.elastic.multiprocessing.api.SignalException: Process 8665 got signal: 1",
                  "SIGHUP"),
    SignalWording("torchrun's agent, by name", r"Received (?:Signals\.)?(?P<name>SIG[A-Z]+) death signal",
                  lambda m, text: _agent_told(m.group("name")), "Received Signals.SIGTERM death signal, shutting "
                  "down workers", "SIGTERM"),
    SignalWording("torchrun's agent, by number", r"Received (?P<num>\d+) death signal",
                  lambda m, text: _agent_told(_numbered(int(m.group("num")))),
                  "Received 15 death signal, shutting down workers", "SIGTERM"),
    # (its '[host:pid]' may be gone)
    SignalWording("Open MPI's crash report", r"(?:\] |^\s*)Signal: [A-Za-z -]+ \((?P<num>\d+)\)",
                  lambda m, text: SignalReading(_numbered(int(m.group("num")))),
                  "[node7:12345] Signal: Segmentation fault (11)", "SIGSEGV"),
    SignalWording("Ray's memory monitor", r"killed due to memory pressure",
                  lambda m, text: SignalReading("SIGKILL", meaning="Ray's memory monitor killed it: host RAM ran "
                                                "short (not GPU memory)"),
                  "1 Workers (tasks / actors) killed due to memory pressure (OOM)", "SIGKILL"),
    SignalWording("the kernel's OOM killer", r"Out of memory: ?Killed process (?P<pid>\d+)", _host_oom,
                  "[ 4018.45] Out of memory: Killed process 935 (python) total-vm:113656kB", "SIGKILL"),
    SignalWording("older kernels' OOM killer", r"\bKilled process (?P<pid>\d+) \([^)]*\),? total-vm:", _host_oom,
                  "[ 4018.45] Killed process 935 (python) total-vm:113656kB, anon-rss:9000kB", "SIGKILL"),
    SignalWording("Slurm's cgroup", r"Detected \d+ oom-kill event",
                  lambda m, text: SignalReading("SIGKILL", meaning="the job's cgroup ran out of host memory and its "
                                                "OOM killer killed processes (not GPU memory)"),
                  "slurmstepd: error: Detected 8 oom-kill event(s) in step 59137890.batch cgroup.", "SIGKILL"),
    SignalWording("MosaicML composer's launcher", r"Rank (?P<rank>\d+) crashed with exit code (?P<code>-\d+)",
                  lambda m, text: SignalReading(_numbered(-int(m.group("code"))), rank=int(m.group("rank"))),
                  "ERROR:composer.cli.launcher:Rank 2 crashed with exit code -7.", "SIGBUS"),
    # (older: 'A serious error (Segmentation fault) is detected')
    SignalWording("PaddlePaddle's signal handler", r"FatalError: (?:A serious error \(|`)(?P<name>Segmentation fault"
                  r"|Illegal instruction|Aborted|Bus error|Floating point exception)[`)] is detected", _shell_named,
                  "FatalError: `Segmentation fault` is detected by the operating system.", "SIGSEGV"),
    # (not its pid: the FatalError line, without one, and the shell's report are the same crash)
    SignalWording("PaddlePaddle's SignalInfo", r"\[SignalInfo: \*\*\* (?P<name>SIG[A-Z]+) \(@0x[0-9a-fA-F]+\) "
                  r"received by PID \d+", lambda m, text: SignalReading(m.group("name")),
                  "  [SignalInfo: *** SIGSEGV (@0x0) received by PID 1011 (TID 0x7f) from PID 0 ***]", "SIGSEGV"),
    SignalWording("c10's FatalSignalHandler", r"\bSIG(?P<name>[A-Z]+)\(\d+\), PID: (?P<pid>\d+), Thread \d+:",
                  lambda m, text: SignalReading("SIG" + m.group("name"), pid=m.group("pid")),
                  "SIGABRT(6), PID: 4242, Thread 4243:", "SIGABRT"),
    SignalWording("UCX", r"Caught signal (?P<num>\d+) \(",
                  lambda m, text: SignalReading(_numbered(int(m.group("num")))),
                  "[host:1016852:0:1020747] Caught signal 11 (Segmentation fault: address not mapped)", "SIGSEGV"),
    SignalWording("AddressSanitizer", r"AddressSanitizer: (?P<name>SEGV|BUS|ABRT|FPE|ILL)\b",
                  lambda m, text: SignalReading("SIG" + m.group("name")),
                  "==4242==ERROR: AddressSanitizer: SEGV on unknown address 0x000000000000", "SIGSEGV"),
    SignalWording("absl's failure handler", r"\*\*\* (?P<name>SIG[A-Z]+) received at time=",
                  lambda m, text: SignalReading(m.group("name")),
                  "E0101 10:00:00.000 4242 failure_signal_handler.cc:345] *** SIGSEGV received at time=1701000000 on "
                  "cpu 3 ***", "SIGSEGV"),
    SignalWording("a C++ allocation failure nothing caught",
                  r"terminate called after throwing an instance of '(?P<type>[\w:]*(?:bad_alloc|BadAlloc))'",
                  lambda m, text: SignalReading("SIGABRT", meaning=f"a C++ allocation failed ({m.group('type')}) "
                                                "and nothing caught it: out of memory"),
                  "terminate called after throwing an instance of 'paddle::memory::allocation::BadAlloc'", "SIGABRT"),
    SignalWording("faulthandler's crash", r"Fatal Python error: (?P<name>Segmentation fault|Aborted|Bus error"
                  r"|Floating point exception)", _shell_named, "Fatal Python error: Segmentation fault", "SIGSEGV"),
    # any other fatal error ('none_dealloc: deallocating None', 'PyThreadState_Get: ...') ends in abort()
    SignalWording("Python's other fatal errors", r"Fatal Python error: (?P<what>[A-Za-z_][^:]*?)(?::|\s*$)",
                  lambda m, text: SignalReading("SIGABRT", meaning=f"Python's own fatal error ({m.group('what').strip()}"
                                                "): the interpreter aborted, usually a C/C++ extension's "
                                                "reference-count or thread-state bug"),
                  "Fatal Python error: none_dealloc: deallocating None", "SIGABRT"),
    # (PaddlePaddle: 'DataLoader process (pid 1104) exited is killed by signal: Killed.'; the name may be wrapped
    # onto the next line)
    SignalWording("the DataLoader's watchdog", r"(?:worker|DataLoader process) \(pid (?P<pid>\d+)\) (?:exited )?is "
                  r"killed by signal: ?(?P<name>Bus error|Aborted|Killed|Segmentation fault|Terminated"
                  r"|Floating point exception)?", _loader_killed,
                  "RuntimeError: DataLoader worker (pid 77) is killed by signal: Segmentation fault.", "SIGSEGV"),
    # (PaddlePaddle's loader says 'in DataLoader worker')
    SignalWording("the DataLoader worker's own handler", r"Unexpected (?P<name>(?i:bus error|segmentation fault"
                  r"|floating-point exception)) encountered in (?:DataLoader )?worker",
                  lambda m, text: SignalReading(_LOADER_SIGNALS[m.group("name").lower()],
                                                worker_kind="DataLoader worker"),
                  "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
                  "memory (shm).", "SIGBUS"),
    SignalWording("DeepSpeed's launcher", r"\] exits with return code = (?P<code>-\d+)", _deepspeed_exit,
                  "[launch.py:321:sigkill_handler] ['python', '-u', 'train.py', '--local_rank=1'] exits with return "
                  "code = -9", "SIGKILL"),
    SignalWording("Windows, NTSTATUS in hex", r"exit (?:code|status)[: ]+(?:-?\d+ )?\(?0x(?P<code>C0000005|C000001D"
                  r"|C00000FD|C0000409)\b", lambda m, text: _windows(m.group("code"), "0x" + m.group("code")),
                  "Process finished with exit code -1073741819 (0xC0000005)", "SIGSEGV"),
    SignalWording("Windows, NTSTATUS in decimal", r"exit (?:code|status)[: ]+(?P<code>-1073741819|3221225477"
                  r"|-1073741795|3221225501|-1073741571|3221225725|-1073740791|3221226505)\b",
                  lambda m, text: _windows(_NTSTATUS_DECIMAL[m.group("code")], m.group("code")),
                  "Process finished with exit code 3221226505", "SIGABRT"),
    # (reasons a rule placed before DFD514 names, such as an illegal memory access or the NCCL watchdog, are matched
    # by it first: precedence.py)
    SignalWording("a C++ exception nothing caught: 'terminate called ...' then its what()",
                  r"^\s*what\(\):\s+(?P<what>\S.*)",
                  lambda m, text: SignalReading("SIGABRT", meaning="a C++ exception nothing caught (terminate, then "
                                                f"abort): {m.group('what').strip()[:200]}"),
                  "  what():  basic_string::_M_construct null not valid", "SIGABRT"),
    # at a line's start, or glued to a progress bar the shell's message overwrote ('5.02it/s]Segmentation fault')
    SignalWording("the shell", r"(?:^[\s>*`]*|(?<=it/s\])|(?<=s/it\]))(?:\S+: line \d+: +(?P<pid>\d+) )?"
                  rf"(?P<name>{_SHELL_WORDS}|已杀死|段错误)(?: *\((?:core dumped|核心已转储)\))?[*`]*(?:\s|$)",
                  _shell_named, "run.sh: line 12: 4242 Killed                  python train.py", "SIGKILL"),
    SignalWording("zsh", r"^[\s>*`]*zsh: (?P<name>segmentation fault|bus error|killed|abort"
                  r"|illegal hardware instruction|floating point exception|terminated)\b", _shell_named,
                  "zsh: illegal hardware instruction  python train.py", "SIGILL"),
    SignalWording("the shell, lower case", r"^[\s>*`]*(?P<name>segmentation fault|bus error|illegal instruction) "
                  r"\(core dumped\)", _shell_named, "bus error (core dumped)", "SIGBUS"),
    # ("... and said 'Segmentation fault (core dumped)'")
    SignalWording("the shell's message quoted anywhere in a line", r"(?P<name>Segmentation fault|Aborted|Bus error"
                  r"|Illegal instruction|Floating point exception) \(core dumped\)", _shell_named,
                  "the job printed 'Aborted (core dumped)' and stopped", "SIGABRT"),
    SignalWording("Slurm's memory limit", r"exceeded memory limit \([^)]*\), being killed",
                  lambda m, text: SignalReading("SIGKILL", meaning="Slurm killed the job for exceeding its memory "
                                                "limit (host RAM, not GPU memory)"),
                  "slurmstepd: error: Job 42 exceeded memory limit (9000 > 8000), being killed", "SIGKILL"),
    SignalWording("Slurm's cancellation", r"\*\*\* JOB \d+ ON \S+ CANCELLED AT",
                  lambda m, text: SignalReading("SIGTERM", cancelled=True, meaning="Slurm cancelled the job (time "
                                                "limit, preemption or scancel): read the rest of its line"),
                  "slurmstepd: error: *** JOB 59137890 ON node7 CANCELLED AT 2025-01-01T00:00:00 DUE TO TIME "
                  "LIMIT ***", "SIGTERM"),
    # numbered, as buildbot and others print it: 'process killed by signal 9'
    SignalWording("numbered", r"killed by signal (?P<num>\d+)\b",
                  lambda m, text: SignalReading(SIGNALS.get(int(m.group("num")), f"signal {m.group('num')}")),
                  "program finished: process killed by signal 9", "SIGKILL"),
)
_UNNAMED = re.compile(r"\(\?P<\w+>")
# One alternation of every wording, each wrapped in a group of its own (w0, w1, ...; its inner groups unnamed), so
# the prefilter's line is searched once; the wording that matched then reads its own groups.
SIGNAL_LINE = re.compile("|".join(f"(?P<w{index}>{_UNNAMED.sub('(?:', wording.pattern)})"
                                   for index, wording in enumerate(SIGNAL_WORDINGS)))
_WORDING_PATTERNS = tuple(re.compile(wording.pattern) for wording in SIGNAL_WORDINGS)


def signal_wording(match: "re.Match[str]") -> int:
    """The index in SIGNAL_WORDINGS of the wording a match of the signal rule's pattern is."""
    return int((match.lastgroup or "w")[1:])


def signal_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    index = signal_wording(match)
    own = _WORDING_PATTERNS[index].match(text, match.start())
    assert own is not None  # the same pattern, tried where its alternative matched
    reading = SIGNAL_WORDINGS[index].decode(own, text)
    details: Dict[str, Any] = {"signal": reading.signal, "pid": int(reading.pid) if reading.pid else None,
                               "meaning": reading.meaning if reading.meaning is not None
                               else SIGNAL_MEANING.get(reading.signal or "", "")}
    if reading.local_rank is not None:
        details["local_rank"] = reading.local_rank
    if reading.cancelled:
        details["cancelled"] = True
    if reading.rank is not None:
        details["rank"] = reading.rank
    if reading.worker_kind:
        details["worker_kind"] = reading.worker_kind
    return details
