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
from dflash_doctor.runtime.deadlock import HangDiagnosis, classify_hang
from dflash_doctor.runtime.stacks import ThreadStack
from dflash_doctor.supervise.facts import AttachFacts, AttachProcessFacts
from dflash_doctor.supervise.findings import findings_from_records
from dflash_doctor.supervise.records import HangRecord, ProcessRecord
from dflash_doctor.supervise.target_files import Reader, load_into_linecache, read_source

INSTALL_HINT = "pip install py-spy"  # the whole [attach] extra; no index has dflash-doctor to name it by
DUMP_TIMEOUT_S = 60.0
_PROCESS = re.compile(r"^Process (\d+): (.*)$", re.MULTILINE)
_DENIED = re.compile(r"permission denied|operation not permitted|ptrace|EPERM", re.IGNORECASE)
_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)


class PySpyFailed(DoctorError):
    """py-spy could not dump the process (not a Python process, a version it does not know, a timeout)."""

    exit_code = EXIT_PROBLEMS


class TargetStopped(DoctorError):
    """The process is stopped (SIGSTOP, Ctrl-Z): py-spy cannot read a stopped process, and it is no ptrace matter."""

    exit_code = EXIT_PROBLEMS


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
    import os

    # A Rust backtrace would bury py-spy's one error line under "10: main" frames.
    env = {key: value for key, value in os.environ.items() if key not in ("RUST_BACKTRACE", "RUST_LIB_BACKTRACE")}
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, errors="replace", env=env)


def _beside_interpreter() -> List[str]:
    """Where an install next to this tool puts py-spy when that folder is not on PATH: the interpreter's own bin
    folder (a venv not activated), the user scheme's (pip --user), pipx's."""
    import os
    import sys
    import sysconfig

    places = [os.path.dirname(sys.executable), sysconfig.get_path("scripts")]
    for scheme in ("posix_user", "nt_user"):
        try:
            places.append(sysconfig.get_path("scripts", scheme))
        except KeyError:
            continue
    places.append(os.path.join(os.environ.get("PIPX_BIN_DIR") or os.path.expanduser("~/.local/bin")))
    return [os.path.join(place, "py-spy") for place in places if place]


def find_py_spy(which: Callable[[str], Optional[str]] = shutil.which,
                beside: Callable[[], List[str]] = _beside_interpreter) -> str:
    import os

    found = which("py-spy")
    if found is not None:
        return found
    for candidate in beside():
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise MissingDependency(f"attach needs py-spy, which is not installed here; install it with: {INSTALL_HINT}")


_BACKTRACE_LINE = re.compile(r"^\s*(?:\d+:|at |stack backtrace:|note: )")


def error_line(said: Sequence[str]) -> Optional[str]:
    """py-spy's own error line: 'Error: ...' if there is one, else the last line that is not a Rust backtrace's."""
    lines = [line.strip() for line in said if line.strip()]
    for line in lines:
        if line.lower().startswith("error"):
            return line
    plain = [line for line in lines if not _BACKTRACE_LINE.match(line)]
    return plain[-1] if plain else (lines[0] if lines else None)


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, Ctrl-Z: state T) or stopped by a tracer (state t)."""
    import psutil

    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def python_children(pid: int) -> List[int]:
    """The Python processes below `pid` (a launcher's workers, `run`'s command), for the --subprocesses hint."""
    import psutil

    found = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            names = [child.name()] + child.cmdline()[:1]
        except psutil.Error:
            continue
        if any("python" in name.rsplit("/", 1)[-1].lower() for name in names):
            found.append(child.pid)
    return sorted(found)


_FRAME_FILE = re.compile(r"^ {4}\S.*? \((?P<file>[^()]+?):\d+\)\s*$", re.MULTILINE)


def files_named(text: str) -> List[str]:
    return sorted({match.group("file") for match in _FRAME_FILE.finditer(text)})


def _process_pids(text: str) -> List[int]:
    return [int(match.group(1)) for match in _PROCESS.finditer(text)]


def _files_by_process(text: str) -> Dict[str, List[int]]:
    """file -> the pids whose frames name it (a dump's 'Process N:' blocks)."""
    named: Dict[str, List[int]] = {}
    pid = None
    for line in text.splitlines():
        header = _PROCESS.match(line)
        if header is not None:
            pid = int(header.group(1))
            continue
        frame = _FRAME_FILE.match(line)
        if frame is not None and pid is not None:
            named.setdefault(frame.group("file"), []).append(pid)
    return named


_LOCAL = re.compile(r"^ {12}(\w+): (.*)$")
_FRAME_LINE = re.compile(r"^ {4}\S")


def _frame_locals(lines: Sequence[str]) -> List[List[Dict[str, str]]]:
    """Per thread (in dump order), per frame as printed (innermost first): py-spy --locals' 'name: value' lines."""
    threads: List[List[Dict[str, str]]] = []
    for line in lines:
        if line.startswith("Thread "):
            threads.append([])
        elif threads and _FRAME_LINE.match(line):
            threads[-1].append({})
        elif threads and threads[-1]:
            local = _LOCAL.match(line)
            if local is not None and len(threads[-1][-1]) < 256:
                threads[-1][-1][local.group(1)] = local.group(2)[:200]
    return threads


def _with_locks(stack: ThreadStack, printed_locals: List[Dict[str, str]]) -> ThreadStack:
    """The stack's frames with the locks they wait for and hold, by the address of the local each lock
    expression starts from (lock_sites.dump_identity)."""
    from dataclasses import replace

    from dflash_doctor.runtime.lock_sites import LockRef, dump_identity, lock_sites

    frames = []
    last = len(stack.frames) - 1
    for index, frame in enumerate(stack.frames):
        printed = last - index
        values = printed_locals[printed] if printed < len(printed_locals) else {}
        sites = lock_sites(frame.file, frame.line)

        def ref(expression: str) -> Optional[LockRef]:
            identity = dump_identity(frame.file, expression, sites, values)
            return LockRef(identity, expression) if identity is not None else None

        waits = next((r for r in map(ref, sites.acquiring + sites.entering) if r is not None), None) \
            if index == last else None
        held = sites.inside + sites.acquired + (sites.entering if index != last else ())
        frames.append(replace(frame, waits_for=waits, holds=tuple(r for r in map(ref, held) if r is not None)))
    return replace(stack, frames=tuple(frames), locks_read=True)


def _with_source_read_safely(stacks: Sequence[ThreadStack]) -> List[ThreadStack]:
    """Source lines only from what load_into_linecache put there: a frame file it was not given (a line the frame
    pattern missed) goes into linecache as empty first, so linecache never opens a frame file itself."""
    import linecache
    from dataclasses import replace

    from dflash_doctor.runtime.stacks import with_source

    for stack in stacks:
        for frame in stack.frames:
            if frame.file not in linecache.cache:
                linecache.cache[frame.file] = (0, None, [], frame.file)
    return [replace(stack, frames=tuple(with_source(frame) for frame in stack.frames)) for stack in stacks]


def parse_dump(text: str) -> List[Dump]:
    """py-spy's text dump (one 'Process N: cmdline' block per process with --subprocesses) -> Dumps. Source lines
    come from linecache (load_into_linecache fills it with what the target may read)."""
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
        stacks = tuple(_with_source_read_safely(parser.stacks())) if parser is not None else ()
        printed = _frame_locals(lines)
        stacks = tuple(_with_locks(stack, printed[i] if i < len(printed) else []) for i, stack in enumerate(stacks))
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


def _torch_version(stacks: Sequence[ThreadStack], reader: Optional[Reader]) -> Optional[str]:
    """Read from the torch the process runs, found through its frames' files (torch/version.py), as the target
    may read it."""
    for stack in stacks:
        for frame in stack.frames:
            marker = frame.file.replace("\\", "/").find("/torch/")
            if marker < 0 or reader is None:
                continue
            text = "".join(read_source(frame.file[:marker] + "/torch/version.py", reader))
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


def _since_cycle(dumps: Sequence[Dump], diagnosis: HangDiagnosis) -> List[Dump]:
    """The trailing samples that all show the same cycle as `diagnosis` (the same kind, threads and lock objects):
    a cycle is judged only over the samples since it formed, and it must be the same answer in each. Only true
    wait-for cycles: threads queued behind a holder that waits for none of their locks (a lock wait) are a slow
    holder, which every sample of a busy program may show, not a deadlock."""
    if not diagnosis.cycle.is_wait_for_cycle:
        return []
    tail: List[Dump] = []
    for dump in reversed(dumps):
        if classify_hang(list(dump.stacks)).signature != diagnosis.signature:
            break
        tail.append(dump)
    return tail[::-1]


def _cycle_forming(dumps: Sequence[Dump]) -> bool:
    """The last sample shows a cycle that no earlier sample showed: one more sample tells whether it stands."""
    last = classify_hang(list(dumps[-1].stacks))
    return last.cycle.is_wait_for_cycle and len(_since_cycle(dumps, last)) < 2


@dataclass(frozen=True)
class AttachSpec:
    pid: int
    subprocesses: bool = False
    samples: int = 2
    interval_s: float = 1.0


def attach(spec: AttachSpec, *, runner: Runner = _run, which=shutil.which, sleep=time.sleep,
           open_nvml: Optional[Callable[[], object]] = None, pid_exists: Optional[Callable[[int], bool]] = None,
           clock: Callable[[], float] = time.perf_counter, is_stopped: Callable[[int], bool] = stopped,
           children_of: Callable[[int], List[int]] = python_children,
           make_reader: Callable[[int], Reader] = Reader.of_process,
           beside: Callable[[], List[str]] = _beside_interpreter) -> "Report[AttachFacts]":
    import psutil

    exists = pid_exists or psutil.pid_exists
    if spec.pid <= 0 or not exists(spec.pid):
        raise UsageError(f"no process with pid {spec.pid}")
    py_spy = find_py_spy(which, beside)
    if is_stopped(spec.pid):
        raise TargetStopped(f"pid {spec.pid} is stopped (state T: SIGSTOP or Ctrl-Z), so its threads cannot be "
                            f"read; continue it with `kill -CONT {spec.pid}` (or `fg` in its shell) and attach again")
    # --locals: each frame's locals with their addresses, so a lock is known by its object (lock_sites.py)
    argv = [py_spy, "dump", "--pid", str(spec.pid), "--full-filenames", "--locals"] + (
        ["--subprocesses"] if spec.subprocesses else [])
    started = clock()
    samples: Dict[int, List[Dump]] = {}
    commands: Dict[int, str] = {}
    unreadable: List[str] = []
    readers: Dict[int, Optional[Reader]] = {}

    def reader_of(pid: int) -> Optional[Reader]:
        if pid not in readers:
            try:
                readers[pid] = make_reader(pid)
            except Exception:  # noqa: BLE001 - a process gone or unreadable: its files are not read
                readers[pid] = None
        return readers[pid]

    def take_sample() -> None:
        try:
            done = runner(argv, DUMP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PySpyFailed(f"py-spy dump of pid {spec.pid} took longer than {DUMP_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout or "").strip().splitlines()
            if is_stopped(spec.pid):
                raise TargetStopped(f"pid {spec.pid} is stopped (state T: SIGSTOP or Ctrl-Z), so its threads cannot "
                                    f"be read; continue it with `kill -CONT {spec.pid}` and attach again")
            if any(_DENIED.search(line) for line in said):
                raise PtraceDenied(
                    f"py-spy may not read pid {spec.pid} (ptrace not permitted): run attach as the same user "
                    "with ptrace allowed (sysctl kernel.yama.ptrace_scope=0, or as root), and in a container "
                    "start it with --cap-add SYS_PTRACE")
            if not exists(spec.pid):
                raise UsageError(f"pid {spec.pid} ended while attach was reading it")
            raise PySpyFailed(f"py-spy dump of pid {spec.pid} failed: {error_line(said) or done.returncode}")
        # The target's own uid decides which frame files are read (target_files.py), never attach's (root); with
        # --subprocesses each process's own, and a file two processes name is read only if both may.
        readers = {pid: reader_of(pid) for pid in _process_pids(done.stdout) or [spec.pid]}
        load_into_linecache(files_named(done.stdout), [r for r in readers.values() if r is not None],
                            _files_by_process(done.stdout))
        dumps = parse_dump(done.stdout)
        if not any(dump.stacks for dump in dumps):
            first = next((line.strip() for line in done.stdout.splitlines() if line.strip()), "(nothing)")
            unreadable.append(first[:200])
        for dump in dumps:
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
    report = _report(spec, samples, commands, gpus, gpu_note, elapsed, reader_of(spec.pid))
    if unreadable:
        report.problems.append(Problem(
            f"pid {spec.pid}", f"{len(unreadable)} of py-spy's dumps had no thread this tool could read (it "
                               f"began: {unreadable[0]!r})",
            "check `py-spy dump --pid PID` by hand; a py-spy release whose output changed is not understood"))
    if not spec.subprocesses:
        report.facts["python_children"] = children_of(spec.pid)
    return report


def _report(spec: AttachSpec, samples: Dict[int, List[Dump]], commands: Dict[int, str],
            gpus: Dict[int, List[int]], gpu_note: Optional[str], elapsed: float,
            reader: Optional[Reader]) -> "Report[AttachFacts]":
    report: Report[AttachFacts] = Report(command="attach")
    processes: List[AttachProcessFacts] = []
    for pid in sorted(samples):
        dumps = samples[pid]
        last = dumps[-1]
        diagnosis = classify_hang(list(last.stacks))
        since = _since_cycle(dumps, diagnosis)
        cycle = diagnosis.cycle if diagnosis.cycle.is_wait_for_cycle else None
        still = still_threads(since if cycle is not None else dumps)
        cycle_still = cycle is not None and len(since) >= 2 and all(t in still for t in diagnosis.threads)
        ppid, argv, rank, local_rank = _process_facts(pid)
        record = ProcessRecord(
            pid=pid, ppid=ppid, argv=argv or (commands.get(pid, ""),), rank=rank, local_rank=local_rank,
            torch_version=_torch_version(last.stacks, reader), fx_flag_thread_local=None, fixes=(), problems=(), events=(),
            blames=(), hang=HangRecord(diagnosis, last.stacks, round(elapsed, 3), None) if cycle_still else None,
            deaths=(),
            ended=None, started_at=0.0)
        for finding in findings_from_records([record]):
            report.findings.append(_with_gpus(finding, gpus.get(pid)))
        processes.append({"pid": pid, "command": commands.get(pid), "rank": rank, "gpus": gpus.get(pid),
                          "threads": [s.name for s in last.stacks], "still": still,
                          "cycle": cycle,
                          "cycle_threads_still": cycle_still, "chain": list(diagnosis.chain),
                          "samples": len(dumps)})
        if cycle is not None and not cycle_still:
            report.problems.append(Problem(f"pid {pid}", f"a {cycle} showed in the last sample but its "
                                                         "threads moved between samples",
                                           "attach again with more --samples to see whether it settles"))
    report.facts = {"pid": spec.pid, "subprocesses": spec.subprocesses, "samples": spec.samples,
                    "interval_s": spec.interval_s, "seconds": round(elapsed, 3), "processes": processes,
                    "gpus": "read" if gpu_note is None else f"unavailable: {gpu_note}", "python_children": []}
    return report


def _with_gpus(finding: Finding, gpus: Optional[List[int]]) -> Finding:
    where = f" It holds GPU {', '.join(map(str, gpus))}." if gpus else ""
    return Finding(finding.code, finding.name, finding.severity, finding.message + where, finding.path,
                   finding.line, finding.column, dict(finding.evidence, gpus=gpus))
