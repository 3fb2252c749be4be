"""`attach PID`: all-thread dumps of a live process (and its children) with py-spy, a few samples apart.

Each dump is parsed by the same parser `logs` uses for a pasted py-spy dump (logs/stackdump.py), its frames are
given their source lines from this machine's files, and the last sample is classified by the watchdog's rule
(runtime/deadlock.py classify_hang). A cycle counts only if every thread in it stood still across all samples.
The result is the same per-process record `run` writes, so the same rules (DFD902, DFD903) report it.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from dflash_doctor.errors import DoctorError, MissingDependency, UsageError
from dflash_doctor.findings import EXIT_PROBLEMS, Finding, Problem, Report
from dflash_doctor.runtime.deadlock import DYNAMO_CYCLE, LOCK_CYCLE, LOCK_WAIT, classify_hang
from dflash_doctor.runtime.stacks import ThreadStack
from dflash_doctor.supervise.facts import AttachFacts, AttachProcessFacts
from dflash_doctor.supervise.findings import findings_from_records
from dflash_doctor.supervise.records import HangRecord, ProcessRecord

INSTALL_HINT = "pip install py-spy"  # the whole [attach] extra; no index has dflash-doctor to name it by
DUMP_TIMEOUT_S = 60.0
_PROCESS = re.compile(r"^Process (\d+): (.*)$")
_DENIED = re.compile(r"permission denied|operation not permitted|ptrace|EPERM", re.IGNORECASE)
_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)
CYCLES = (DYNAMO_CYCLE, LOCK_CYCLE, LOCK_WAIT)


class PtraceDenied(DoctorError):
    """The kernel or the container does not let this user read another process's memory."""

    exit_code = EXIT_PROBLEMS


@dataclass(frozen=True)
class Dump:
    """One process's threads in one sample."""

    pid: int
    command: str
    stacks: Tuple[ThreadStack, ...]


Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str], timeout: float) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, errors="replace")


def find_py_spy(which: Callable[[str], Optional[str]] = shutil.which) -> str:
    found = which("py-spy")
    if found is None:
        raise MissingDependency(f"attach needs py-spy, which is not installed here; install it with: {INSTALL_HINT}")
    return found


def parse_dump(text: str) -> List[Dump]:
    """py-spy's text dump (one 'Process N: cmdline' block per process with --subprocesses) -> Dumps."""
    from dflash_doctor.logs.stackdump import StackDumpParser

    dumps: List[Dump] = []
    blocks: List[Tuple[int, str, List[str]]] = []
    for line in text.splitlines():
        header = _PROCESS.match(line)
        if header:
            blocks.append((int(header.group(1)), header.group(2), []))
        elif blocks:
            blocks[-1][2].append(line)
    for pid, command, lines in blocks:
        parser: Optional[StackDumpParser] = None
        for number, line in enumerate(lines, start=1):
            if parser is None:
                if not line.startswith("Thread "):
                    continue
                parser = StackDumpParser(number, crash=False)
            if not parser.feed(line):
                break
        stacks = tuple(parser.stacks(read_source=True)) if parser is not None else ()
        dumps.append(Dump(pid, command, stacks))
    return dumps


def _signature(stack: ThreadStack) -> Tuple[Tuple[str, int, str], ...]:
    return tuple((frame.file, frame.line, frame.function) for frame in stack.frames)


def still_threads(samples: Sequence[Dump]) -> List[str]:
    """Threads whose whole stack is the same in every sample of one process."""
    if not samples:
        return []
    first = {stack.name: _signature(stack) for stack in samples[0].stacks}
    for dump in samples[1:]:
        now = {stack.name: _signature(stack) for stack in dump.stacks}
        first = {name: sig for name, sig in first.items() if now.get(name) == sig}
    return sorted(first)


def _torch_version(stacks: Sequence[ThreadStack]) -> Optional[str]:
    """Read from the torch the process runs, found through its frames' files (torch/version.py)."""
    from pathlib import Path

    for stack in stacks:
        for frame in stack.frames:
            marker = frame.file.replace("\\", "/").find("/torch/")
            if marker < 0:
                continue
            try:
                text = (Path(frame.file[:marker]) / "torch" / "version.py").read_text(encoding="utf-8")
            except OSError:
                continue
            match = _VERSION.search(text)
            if match:
                return match.group(1)
    return None


def _process_facts(pid: int):
    """(ppid, argv, rank, local_rank) of a live process, as far as this user may read them."""
    import psutil

    try:
        process = psutil.Process(pid)
        ppid, argv = process.ppid(), tuple(process.cmdline())
    except psutil.Error:
        return 0, (), None, None
    try:
        environ = process.environ()
    except psutil.Error:
        environ = {}

    def number(name: str) -> Optional[int]:
        value = environ.get(name, "")
        return int(value) if value.isdigit() else None

    return ppid, argv, number("RANK"), number("LOCAL_RANK")


def gpus_by_pid(open_nvml: Optional[Callable[[], object]]) -> Tuple[Dict[int, List[int]], Optional[str]]:
    """{pid: [GPU index, ...]} from NVML's compute processes; (empty, why) when NVML cannot be used."""
    from dflash_doctor.gpus.nvml import NvmlUnavailable, PynvmlDevices

    opener = open_nvml or PynvmlDevices.open
    try:
        devices = opener()
    except NvmlUnavailable as exc:
        return {}, str(exc)
    held: Dict[int, List[int]] = {}
    try:
        for index in range(devices.device_count()):  # type: ignore[attr-defined]
            sample = devices.sample(index)  # type: ignore[attr-defined]
            for pid, _ in sample.processes or ():
                held.setdefault(pid, []).append(index)
    except NvmlUnavailable as exc:
        return held, str(exc)
    finally:
        devices.shutdown()  # type: ignore[attr-defined]
    return held, None


# Samples taken past --samples while a cycle in the last sample has not yet been seen twice.
SETTLE_SAMPLES = 3


def _since_cycle(dumps: Sequence[Dump], cycle: Optional[str]) -> List[Dump]:
    """The trailing samples that all show `cycle`: a cycle is judged still only over the samples since it formed
    (threads that moved before it formed do not clear it)."""
    if cycle not in CYCLES:
        return []
    tail: List[Dump] = []
    for dump in reversed(dumps):
        if classify_hang(list(dump.stacks)).cycle != cycle:
            break
        tail.append(dump)
    return tail[::-1]


def _cycle_forming(dumps: Sequence[Dump]) -> bool:
    """The last sample shows a cycle that no earlier sample showed: one more sample tells whether it stands."""
    last = classify_hang(list(dumps[-1].stacks)).cycle
    return last in CYCLES and len(_since_cycle(dumps, last)) < 2


@dataclass(frozen=True)
class AttachSpec:
    pid: int
    subprocesses: bool = False
    samples: int = 2
    interval_s: float = 1.0


def attach(spec: AttachSpec, *, runner: Runner = _run, which=shutil.which, sleep=time.sleep,
           open_nvml: Optional[Callable[[], object]] = None, pid_exists: Optional[Callable[[int], bool]] = None,
           clock: Callable[[], float] = time.perf_counter) -> "Report[AttachFacts]":
    import psutil

    exists = pid_exists or psutil.pid_exists
    if spec.pid <= 0 or not exists(spec.pid):
        raise UsageError(f"no process with pid {spec.pid}")
    py_spy = find_py_spy(which)
    argv = [py_spy, "dump", "--pid", str(spec.pid), "--full-filenames"] + (["--subprocesses"] if spec.subprocesses
                                                                           else [])
    started = clock()
    samples: Dict[int, List[Dump]] = {}
    commands: Dict[int, str] = {}

    def take_sample() -> None:
        try:
            done = runner(argv, DUMP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise DoctorError(f"py-spy dump of pid {spec.pid} took longer than {DUMP_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout or "").strip().splitlines()
            if any(_DENIED.search(line) for line in said):
                raise PtraceDenied(
                    f"py-spy may not read pid {spec.pid} (ptrace not permitted): run attach as the same user "
                    "with ptrace allowed (sysctl kernel.yama.ptrace_scope=0, or as root), and in a container "
                    "start it with --cap-add SYS_PTRACE")
            if not exists(spec.pid):
                raise UsageError(f"pid {spec.pid} ended while attach was reading it")
            raise DoctorError(f"py-spy dump of pid {spec.pid} failed: {said[-1] if said else done.returncode}")
        for dump in parse_dump(done.stdout):
            samples.setdefault(dump.pid, []).append(dump)
            commands[dump.pid] = dump.command

    for index in range(spec.samples):
        if index:
            sleep(spec.interval_s)
        take_sample()
    # A cycle that formed between the last two samples has not been seen standing still yet: a cycle never
    # resolves, so a few more samples settle it (measured on the H200: attach caught the plain loop's cycle
    # forming, and a later attach named it).
    for _ in range(SETTLE_SAMPLES):
        if not any(_cycle_forming(dumps) for dumps in samples.values()):
            break
        sleep(spec.interval_s)
        take_sample()
    elapsed = clock() - started
    gpus, gpu_note = gpus_by_pid(open_nvml)
    return _report(spec, samples, commands, gpus, gpu_note, elapsed)


def _report(spec: AttachSpec, samples: Dict[int, List[Dump]], commands: Dict[int, str],
            gpus: Dict[int, List[int]], gpu_note: Optional[str], elapsed: float) -> "Report[AttachFacts]":
    report: Report[AttachFacts] = Report(command="attach")
    processes: List[AttachProcessFacts] = []
    for pid in sorted(samples):
        dumps = samples[pid]
        last = dumps[-1]
        diagnosis = classify_hang(list(last.stacks))
        since = _since_cycle(dumps, diagnosis.cycle)
        still = still_threads(since if diagnosis.cycle in CYCLES else dumps)
        cycle_still = diagnosis.cycle in CYCLES and len(since) >= 2 and all(t in still for t in diagnosis.threads)
        ppid, argv, rank, local_rank = _process_facts(pid)
        record = ProcessRecord(
            pid=pid, ppid=ppid, argv=argv or (commands.get(pid, ""),), rank=rank, local_rank=local_rank,
            torch_version=_torch_version(last.stacks), fx_flag_thread_local=None, fixes=(), problems=(), events=(),
            blames=(), hang=HangRecord(diagnosis, last.stacks, round(elapsed, 3), None) if cycle_still else None,
            deaths=(),
            ended=None, started_at=0.0)
        for finding in findings_from_records([record]):
            report.findings.append(_with_gpus(finding, gpus.get(pid)))
        processes.append({"pid": pid, "command": commands.get(pid), "rank": rank, "gpus": gpus.get(pid),
                          "threads": [s.name for s in last.stacks], "still": still,
                          "cycle": diagnosis.cycle if diagnosis.cycle in CYCLES else None,
                          "cycle_threads_still": cycle_still, "chain": list(diagnosis.chain),
                          "samples": len(dumps)})
        if diagnosis.cycle in CYCLES and not cycle_still:
            report.problems.append(Problem(f"pid {pid}", f"a {diagnosis.cycle} showed in the last sample but its "
                                                         "threads moved between samples",
                                           "attach again with more --samples to see whether it settles"))
    report.facts = {"pid": spec.pid, "subprocesses": spec.subprocesses, "samples": spec.samples,
                    "interval_s": spec.interval_s, "seconds": round(elapsed, 3), "processes": processes,
                    "gpus": "read" if gpu_note is None else f"unavailable: {gpu_note}"}
    return report


def _with_gpus(finding: Finding, gpus: Optional[List[int]]) -> Finding:
    where = f" It holds GPU {', '.join(map(str, gpus))}." if gpus else ""
    return Finding(finding.code, finding.name, finding.severity, finding.message + where, finding.path,
                   finding.line, finding.column, dict(finding.evidence, gpus=gpus))
