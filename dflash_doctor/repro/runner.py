"""Parent side of a phase: start the child in its own process group, enforce the timeout, read what it left.

A child that hangs past --timeout has its whole process group killed (inductor's compile workers included);
its faulthandler dump, if any, is classified like the watchdog's stacks. A child that crashed (segfault, abort)
without writing a result is reported as outcome `error` with its exit status and the tail of its log. What a
child left is read through repro/phase_record.py, the module it was written with; a result that module refuses
(another version, a field missing) is reported as a crash that says so.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Protocol, Tuple

from dflash_doctor.findings import Problem
from dflash_doctor.outcomes import ThreadOutcome
from dflash_doctor.repro import phase_record
from dflash_doctor.repro.phase_record import PhaseRecord, PhaseRecordError, ThreadRecord
from dflash_doctor.repro.spec import PhaseSpec
from dflash_doctor.runtime.deadlock import HangDiagnosis
from dflash_doctor.runtime.stacks import ThreadStack

LOG_TAIL_CHARS = 4000


@dataclass
class ChildExit:
    returncode: Optional[int]
    timed_out: bool
    seconds: float


class Child(Protocol):
    """What the harness needs of a started child; ChildProcess is the real one, tests pass small fakes."""

    def poll(self, timeout_s: float) -> Optional[ChildExit]: ...

    def stop(self) -> ChildExit: ...

    def kill(self) -> None: ...


class ChildProcess:
    """A running child; `wait(timeout)` kills its process group when the time is up.

    `result_path`: the child's result file. A phase child writes it atomically as its very last act, so once it
    is there the child has said everything; `poll` then ends it at once instead of waiting for the interpreter's
    shutdown (torch's atexit hooks and inductor's compile-worker pool took 1.7 s to 3.9 s a trial on the 2-core
    CPU box, benchmarks/results/repro_phases.md)."""

    def __init__(self, popen: subprocess.Popen, log_handle, clock: Callable[[], float],
                 result_path: Optional[Path] = None) -> None:
        self._popen = popen
        self._log = log_handle
        self._clock = clock
        self._started = clock()
        self._result_path = result_path

    def poll(self, timeout_s: float) -> Optional[ChildExit]:
        """Non-blocking: how the child ended, or None while it runs; past `timeout_s` it is killed. A child whose
        result is written has ended, whether or not its interpreter has finished shutting down."""
        if self._popen.poll() is None:
            if self._result_path is not None and self._result_path.exists():
                return self.stop()
            if self._clock() - self._started < timeout_s:
                return None
            return self.wait(0.0)
        self.kill()  # the child is gone; its compile workers may not be
        self._log.close()
        return ChildExit(self._popen.returncode, False, self._clock() - self._started)

    def wait(self, timeout_s: float) -> ChildExit:
        remaining = max(0.0, timeout_s - (self._clock() - self._started))
        timed_out = False
        try:
            self._popen.wait(remaining)
        except subprocess.TimeoutExpired:
            timed_out = True
        self.kill()
        self._log.close()
        return ChildExit(self._popen.returncode, timed_out, self._clock() - self._started)

    def stop(self) -> ChildExit:
        """End a child that is not expected to finish on its own (a disturbance held for the workers)."""
        self.kill()
        self._log.close()
        return ChildExit(self._popen.returncode, False, self._clock() - self._started)

    def kill(self) -> None:
        """Kill the whole group (the child and anything it started); reap the child."""
        kill_group(self._popen)


def kill_group(popen: subprocess.Popen, wait_s: float = 10.0) -> None:
    """Kill the process group `popen` leads (it and anything it started) and reap it, forgetting it in the
    registry of children once reaped (its pid may be reused)."""
    from dflash_doctor import children

    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        popen.wait(wait_s)
        children.release(popen.pid)
    except subprocess.TimeoutExpired:
        pass


class ProcessRunner:
    """Starts phase children. Tests may pass another object with the same `start` signature."""

    def __init__(self, python: str = sys.executable, clock: Callable[[], float] = time.perf_counter) -> None:
        self.python = python
        self.clock = clock

    def start(self, spec_path: Path, result_path: Path, env: Dict[str, str], log_path: Path,
              user_code: bool = False) -> ChildProcess:
        """Start a phase child in the phase folder. Only a `--model` child (`user_code`) may import from the
        user's working folder, which is where their model module lives."""
        from dflash_doctor import children

        log = open(log_path, "wb")
        argv = children.python_argv("dflash_doctor.repro.child", str(spec_path), str(result_path),
                                    python=self.python, keep_working_folder=user_code)
        try:
            popen = children.popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=os.getcwd() if user_code else str(spec_path.parent))
        except BaseException:
            log.close()
            raise
        return ChildProcess(popen, log, self.clock, result_path)


def child_env(cache_root: Path, cold_cache: bool, base: Optional[Dict[str, str]] = None,
              compile_threads: Optional[int] = None, user_code: bool = False) -> Dict[str, str]:
    """The child's environment (children.child_env; children.user_env for a --model child, which keeps the
    user's path): for a cold cache the inductor/triton caches under `cache_root` (the child's own folder, or the
    one a run's flag-held trials share), and with trials side by side a share of the cores for inductor's compile
    workers (unless the user set it)."""
    from dflash_doctor.children import child_env as clean_env
    from dflash_doctor.children import user_env

    extra = {}
    source = os.environ if base is None else base
    if compile_threads and "TORCHINDUCTOR_COMPILE_THREADS" not in source:
        extra["TORCHINDUCTOR_COMPILE_THREADS"] = str(compile_threads)
    if cold_cache:  # beside the compile threads' share, not instead of it
        extra.update(TORCHINDUCTOR_CACHE_DIR=str(cache_root / "inductor-cache"),
                     TRITON_CACHE_DIR=str(cache_root / "triton-cache"))
    if user_code and base is None:
        return user_env(extra)
    return clean_env(base, extra)


def write_spec(phase_dir: Path, spec: PhaseSpec) -> Path:
    phase_dir.mkdir(parents=True, exist_ok=True)
    path = phase_dir / "spec.json"
    path.write_text(json.dumps(spec.to_dict()), encoding="utf-8")
    return path


def log_tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-LOG_TAIL_CHARS:].decode("utf-8", "replace")


def read_phase_result(phase_dir: Path, exit: ChildExit, spec: PhaseSpec) -> PhaseRecord:
    """The child's result, or one reconstructed from how it ended (killed on timeout, crashed, or a result this
    version cannot read)."""
    result_path = phase_dir / "result.json"
    if result_path.exists():
        try:
            result = phase_record.read(result_path)
        except (OSError, PhaseRecordError) as exc:
            return _made_up(phase_dir, exit, spec, f"left a result this dflash-doctor cannot read ({exc})")
        if exit.timed_out and result.phase == "disturb":
            result = replace(result, killed_after_s=round(exit.seconds, 3))
        return result
    return _made_up(phase_dir, exit, spec)


def _made_up(phase_dir: Path, exit: ChildExit, spec: PhaseSpec, unreadable: Optional[str] = None) -> PhaseRecord:
    """The record of a child that left none (or none this version reads: `unreadable` says why)."""
    hung = exit.timed_out and unreadable is None
    if hung:
        hang, stacks, problems = _faulthandler_diagnosis(phase_dir, exit.seconds)
        # No dump: the child kept showing progress (its dump is re-armed while it does) until the timeout.
        return PhaseRecord(phase=spec.phase, outcome=ThreadOutcome.HUNG, seconds=round(exit.seconds, 6),
                           threads=tuple(ThreadRecord(name, ThreadOutcome.HUNG, None, 0) for name in spec.thread_names),
                           problems=problems, hang=hang, stacks=stacks, log_tail=log_tail(phase_dir / "log.txt"),
                           timed_out_busy=not stacks)
    reason = unreadable or (f"killed by signal {signal.Signals(-exit.returncode).name}"
                            if exit.returncode and exit.returncode < 0
                            else f"exited with status {exit.returncode} without a result")
    return PhaseRecord(phase=spec.phase, outcome=ThreadOutcome.ERROR, seconds=round(exit.seconds, 6),
                       threads=tuple(ThreadRecord(name, ThreadOutcome.ERROR, f"child process {reason}", 0)
                                     for name in spec.thread_names),
                       log_tail=log_tail(phase_dir / "log.txt"), crash=reason)


def _faulthandler_diagnosis(phase_dir: Path, seconds: float
                            ) -> Tuple[Optional[HangDiagnosis], Tuple[ThreadStack, ...], Tuple[Problem, ...]]:
    """The hang a killed child's faulthandler dump shows, its stacks, and a problem where its threads' names
    could not be read (the stacks are then named by ident)."""
    from dflash_doctor.runtime.deadlock import classify_hang
    from dflash_doctor.runtime.stacks import parse_faulthandler

    dump = phase_dir / "faulthandler.txt"
    text = dump.read_text(encoding="utf-8", errors="replace") if dump.exists() else ""
    names_path = phase_dir / "threads.json"
    names: Dict[int, str] = {}
    problems: List[Problem] = []
    if names_path.exists():
        try:
            names = phase_record.read_thread_names(names_path)
        except (OSError, PhaseRecordError) as exc:
            problems.append(Problem(f"{phase_dir.name} thread names", f"unreadable: {exc}",
                                    "the hang's stacks are named by thread ident"))
    stacks = parse_faulthandler(text, names)
    if not stacks:
        return None, (), tuple(problems)
    return classify_hang(stacks, seconds), tuple(stacks), tuple(problems)
