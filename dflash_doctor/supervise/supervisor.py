"""Start the user's command with the bootstrap in its environment, stay out of its way, collect what it saw.

The command runs in a process group of its own, which takes the terminal's foreground when `run` has it (so
Ctrl-C at the terminal reaches the user's processes directly, as without the tool, and a job that reads the
terminal can). When the command stops (Ctrl-Z), `run` takes the terminal back and stops itself, so the shell sees
the job stopped; `fg` continues both. A signal that would end `run` (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
SIGUSR2, SIGALRM) is forwarded to the command's group. When the command ends, every process it started that is
still running is ended (tree.py finds them in other sessions too, and after a SIGKILL to `run` itself), and
named. Its exit status is passed through, a death by signal N as 128 + N, as a shell reports it; whatever
happens to the tool's own reporting (a broken stderr, a record it cannot read) never changes it.

Analysis never prints: what is noticed while the command runs is handed to `announce` (the command writes it).
"""
from __future__ import annotations

import dataclasses
import errno
import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Set, Tuple

from dflash_doctor.errors import DoctorError
from dflash_doctor.findings import Finding, Problem
from dflash_doctor.supervise import tree
from dflash_doctor.supervise.facts import CrashFacts, RateFacts, RunFacts, TrialFacts
from dflash_doctor.supervise.findings import findings_from_records
from dflash_doctor.supervise.records import ProcessRecord, RecordError, decode, has_news
from dflash_doctor.supervise.session import (
    BOOTSTRAP_ERROR_PREFIX, FAULT_PREFIX, RECORD_PREFIX, RunConfig, Session, child_environment,
)

if TYPE_CHECKING:
    from dflash_doctor.findings import Report
from dflash_doctor.vocabularies import OnHang

POLL_S = 0.25
REAP_EVERY_S = 2.0
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGALRM)
EXIT_CANNOT_EXECUTE = 126  # what a shell exits with when it found the command but could not run it
EXIT_NOT_FOUND = 127


class CommandNotRun(DoctorError):
    """The command could not be started at all; its exit code is the shell's for the same failure."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class RunSpec:
    command: Tuple[str, ...]
    hang_after_s: float = 120.0
    cycle_confirm_s: float = 1.5
    on_hang: OnHang = OnHang.REPORT
    fixes: Tuple[str, ...] = ()
    cold_cache: bool = False
    trials: int = 1
    keep: bool = False
    leave_running: bool = False  # --leave-running: what the command left running is named, not ended
    amplifiers: Tuple[str, ...] = ()  # vocabularies.Amplifier values, applied in every process (amplifiers.py)


@dataclass(frozen=True)
class Crash:
    """faulthandler's trace of a process of the command that died of a fatal signal (SIGSEGV, SIGABRT, ...)."""

    pid: int
    trace: str


@dataclass(frozen=True)
class TrialResult:
    index: int
    exit_code: int  # the command's own status; 128 + N for a death by signal N
    seconds: float
    records: Tuple[ProcessRecord, ...]
    findings: Tuple[Finding, ...]
    problems: Tuple[Problem, ...]
    signals_forwarded: Tuple[str, ...]  # signals run received and passed on to the command's group
    killed_on_hang: bool
    session: Optional[str]  # kept with --keep
    ended: Tuple[str, ...] = ()  # "pid (name)" of each process the command left running, ended by run
    crashes: Tuple[Crash, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.findings


@dataclass
class _Forwarder:
    """Signal handlers for the duration of one trial: pass the signal to the command's group, note it."""

    pgid: int
    received: List[str] = field(default_factory=list)
    previous: Dict[int, object] = field(default_factory=dict)

    def __enter__(self) -> "_Forwarder":
        for signum in FORWARDED:
            self.previous[signum] = signal.signal(signum, self._forward)
        return self

    def _forward(self, signum, frame) -> None:
        self.received.append(signal.Signals(signum).name)
        try:
            os.killpg(self.pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]


def _terminal() -> Optional[int]:
    """stdin's terminal, when this process is in its foreground (else the command is not given it)."""
    try:
        fd = sys.stdin.fileno()
        if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
            return fd
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _hand_terminal(fd: int, pgid: int) -> None:
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may not set it otherwise
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, previous)


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def not_run(command: str, exc: OSError) -> CommandNotRun:
    """One line and the shell's exit code for a command that could not be executed."""
    if exc.errno == errno.ENOENT:
        if os.sep in command and os.path.lexists(command):  # the file is there: its #! interpreter is not
            return CommandNotRun(f"cannot run {command}: its #! interpreter was not found ({_first_line(command)})",
                                 EXIT_NOT_FOUND)
        return CommandNotRun(f"command not found: {command}", EXIT_NOT_FOUND)
    reason = {errno.ENOEXEC: "not a program this machine can run (no #! line, or not an executable for this "
                             "machine)", errno.EACCES: "permission denied (not executable, or a folder)"}.get(
        exc.errno or 0, exc.strerror or type(exc).__name__)
    return CommandNotRun(f"cannot run {command}: {reason}", EXIT_CANNOT_EXECUTE)


def _first_line(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.readline(200).decode("utf-8", "replace").strip() or "an empty first line"
    except OSError as exc:
        return exc.strerror or "unreadable"


class Supervisor:
    def __init__(self, spec: RunSpec, announce: Callable[[Finding, bool], None],
                 popen=subprocess.Popen, clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] = lambda line: None,
                 progress: Callable[[TrialResult, int], None] = lambda result, total: None) -> None:
        self.spec = spec
        self.announce = announce  # (finding, is_hang) as soon as a record shows it
        self.say = say  # one line of the tool's own on stderr (what was ended)
        self.progress = progress  # after each trial when there are several
        self._popen = popen
        self._clock = clock
        self._seen: Dict[str, int] = {}  # record file -> the mtime last read
        self._told: Set[Tuple[str, int, str]] = set()  # findings already announced
        self._quiet: Optional[str] = None  # why announcing stopped (stderr broke)
        tree.become_subreaper()

    def run(self) -> List[TrialResult]:
        results = []
        for index in range(self.spec.trials):
            result = self.run_trial(index)
            results.append(result)
            if self.spec.trials > 1:
                self._tell(lambda: self.progress(result, self.spec.trials))
            if result.signals_forwarded:  # the user stopped it: no more trials
                break
        return results

    def _tell(self, act: Callable[[], None]) -> None:
        """Say something on stderr; a failure (a reader that went away) silences the tool, never the command."""
        if self._quiet is not None:
            return
        try:
            act()
        except (OSError, ValueError) as exc:
            self._quiet = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__

    def run_trial(self, index: int) -> TrialResult:
        spec = self.spec
        self._seen, self._told = {}, set()
        session = Session.create(RunConfig(spec.hang_after_s, spec.cycle_confirm_s, spec.fixes, spec.amplifiers))
        watcher = tree.Watcher(str(session.path), session.token)
        try:
            env = child_environment(session.path, token=session.token,
                                    cache_dir=session.path / "inductor-cache" if spec.cold_cache else None)
            started = self._clock()
            terminal = _terminal()
            proc = self._start(env, terminal)
            with _Forwarder(proc.pid) as forwarder:
                try:
                    returncode, killed = self._wait(proc, session, terminal)
                finally:
                    if terminal is not None:
                        _hand_terminal(terminal, os.getpgrp())
                    ended = self._leftovers(proc.pid, session.token, watcher.pid)
            if ended:
                verb = "left running (--leave-running)" if spec.leave_running else "ended"
                self._tell(lambda: self.say(f"{verb} {len(ended)} process(es) the command left running: "
                                            + ", ".join(map(str, ended))))
            seconds = self._clock() - started
            records, problems = load_session(session)
            crashes = _crashes(session)
            if self._quiet is not None:
                problems.append(Problem("stderr", f"could not be written ({self._quiet})",
                                        "announcements were dropped; the command ran on"))
            findings = findings_from_records(records)
            kept = str(session.path) if spec.keep else None
            return TrialResult(index, exit_status(returncode), round(seconds, 3), tuple(records), tuple(findings),
                               tuple(problems), tuple(forwarder.received), killed, kept,
                               tuple(map(str, ended)), tuple(crashes))
        finally:
            session.close(remove=not spec.keep)
            watcher.goodbye()

    def _leftovers(self, pid: int, token: str, watcher: int) -> List[tree.EndedProcess]:
        """What the command left running: ended (SIGTERM, then SIGKILL), or with --leave-running only named, and
        once `run` removed the session folder they find nothing to write to."""
        found = tree.command_processes(pid, token, {watcher})
        if self.spec.leave_running:
            table = tree.process_names()
            return [tree.EndedProcess(p, table.get(p, "?")) for p in found if p != pid]
        return tree.end_processes(found, keep=[pid])

    def _start(self, env: Dict[str, str], terminal: Optional[int]) -> subprocess.Popen:
        from dflash_doctor import inputs

        stdin_closed = inputs.STDIN_CLOSED  # the CLI put /dev/null there for itself; the command gets it closed

        def own_group() -> None:  # in the child, before exec: its own group, in the terminal's foreground
            os.setpgid(0, 0)
            if stdin_closed:
                os.close(0)
            if terminal is not None:
                _hand_terminal(terminal, os.getpid())

        command = list(self.spec.command)
        try:
            proc = self._popen(command, env=env, preexec_fn=own_group)
        except OSError as exc:
            raise not_run(command[0], exc) from None
        if terminal is not None:  # the parent too, as shells do: whichever runs first, the child has it
            _hand_terminal(terminal, proc.pid)
        return proc

    def _wait(self, proc: subprocess.Popen, session: Session, terminal: Optional[int]) -> Tuple[int, bool]:
        """Wait for the command, reading the records as they change; (its return code, killed on a hang)."""
        killed = False
        reaped_at = self._clock()
        while True:
            try:
                pid, status = os.waitpid(proc.pid, os.WNOHANG | os.WUNTRACED)
            except ChildProcessError:  # reaped elsewhere: nothing more to learn
                return proc.returncode if proc.returncode is not None else 0, killed
            if pid == proc.pid and os.WIFSTOPPED(status):
                _follow_stop(terminal, proc.pid)
                continue
            if pid == proc.pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                return proc.returncode, killed
            time.sleep(POLL_S)
            if self._announce_news(session) and self.spec.on_hang is OnHang.KILL and not killed:
                killed = True
                doomed = tree.end_processes([proc.pid] + tree.command_processes(proc.pid, session.token, set()),
                                            at_once=True, keep=[proc.pid])
                self._tell(lambda: self.say(f"killed {len(doomed)} process(es) of the command (--on-hang kill): "
                                            + ", ".join(map(str, doomed))))
            if self._clock() - reaped_at >= REAP_EVERY_S:  # orphans re-parented to us: no zombies left behind
                reaped_at = self._clock()
                tree.reap_children(keep=[proc.pid])

    def _announce_news(self, session: Session) -> bool:
        """Hand each new hang, death or FX error of a record that changed to `announce`, once; True when any
        process has a hang. A record that cannot be read now is read again at the end (a problem then)."""
        hung = False
        for name in session.names(RECORD_PREFIX):
            stamp = session.stamp(name)
            if stamp is None or self._seen.get(name) == stamp:
                continue
            self._seen[name] = stamp
            try:
                record = decode(session.read(name))
            except (OSError, RecordError):
                continue
            if not has_news(record) and not record.blames:
                continue
            hangs = {f.code for f in findings_from_records([dataclasses.replace(record, deaths=(), blames=())])}
            for finding in findings_from_records([record]):
                key = (finding.code, record.pid, finding.message)
                if key not in self._told:
                    self._told.add(key)
                    self._tell(functools.partial(self.announce, finding, finding.code in hangs))
            hung = hung or record.hang is not None
        return hung


def _follow_stop(terminal: Optional[int], pgid: int) -> None:
    """The command stopped (Ctrl-Z): give the terminal back to the shell and stop too, as the job it sees; when
    continued (fg), give the command the terminal again and continue it. Without a terminal there is no job
    control to follow: `run` waits, as a shell script would."""
    if terminal is None:
        return
    _hand_terminal(terminal, os.getpgrp())
    os.kill(os.getpid(), signal.SIGSTOP)
    try:
        foreground = os.tcgetpgrp(terminal) == os.getpgrp()
    except OSError:
        foreground = False
    if foreground:  # fg, not bg: a background job must not take the terminal from the shell
        _hand_terminal(terminal, pgid)
    try:
        os.killpg(pgid, signal.SIGCONT)
    except OSError:
        pass


def load_session(session: Session) -> Tuple[List[ProcessRecord], List[Problem]]:
    """Every record in the session folder, by rank then pid; one that cannot be read is a problem; each
    bootstrap failure is one too."""
    records: List[ProcessRecord] = []
    problems: List[Problem] = []
    for name in session.names(RECORD_PREFIX):
        try:
            records.append(decode(session.read(name)))
        except (OSError, RecordError) as exc:
            problems.append(Problem(name, f"the process record could not be read ({exc})",
                                    "the process may have been killed while writing it"))
    records.sort(key=lambda r: (r.rank is None, r.rank or 0, r.pid))
    for name in session.names(BOOTSTRAP_ERROR_PREFIX):
        try:
            line = session.read(name, 4096).decode("utf-8", "replace").strip()
        except OSError:
            continue
        problems.append(Problem("the bootstrap", line, "that process ran without the recorder and watchdog"))
    return records, problems


def _crashes(session: Session) -> List[Crash]:
    crashes = []
    for name in session.names(FAULT_PREFIX):
        try:
            trace = session.read(name, 1 << 16).decode("utf-8", "replace").strip()
        except OSError:
            continue
        if trace:
            crashes.append(Crash(int(name[len(FAULT_PREFIX):].split(".")[0]), trace))
    return crashes


def trial_rate(results: Sequence[TrialResult]) -> RateFacts:
    return {"trials": len(results), "with_findings": sum(not r.clean for r in results),
            "exit_nonzero": sum(r.exit_code != 0 for r in results)}


def report_for(spec: RunSpec, results: Sequence[TrialResult], expect_clean: bool = False) -> "Report[RunFacts]":
    """One report for the whole run: every trial's findings (each naming its trial, process and rank), the
    processes seen, the rate over trials, and the exit code (the command's own; see `exit_code_for`)."""
    from dflash_doctor.findings import Report

    report: Report[RunFacts] = Report(command="run")
    for result in results:
        for finding in result.findings:
            evidence = dict(finding.evidence, trial=result.index + 1) if len(results) > 1 else finding.evidence
            report.findings.append(Finding(finding.code, finding.name, finding.severity, finding.message,
                                           finding.path, finding.line, finding.column, evidence))
        report.problems.extend(result.problems)
        for record in result.records:
            report.problems.extend(record.problems)
        for crash in result.crashes:
            report.problems.append(Problem(f"pid {crash.pid}", "the interpreter crashed: "
                                           + crash.trace.splitlines()[0], "its threads' stacks at the crash are "
                                           "in facts.trials[].crashes"))
    report.facts = {
        "command": list(spec.command), "fixes": list(spec.fixes), "cache": "cold" if spec.cold_cache else "as-is",
        "on_hang": spec.on_hang.value, "hang_after_s": spec.hang_after_s,
        "trials": [_trial_facts(result) for result in results], "rate": trial_rate(results),
        "amplifiers": list(spec.amplifiers), "proof": None, "advice": [],
    }
    report.exit_code_override = exit_code_for(results, expect_clean)
    return report


def exit_code_for(results: Sequence[TrialResult], expect_clean: bool) -> int:
    """The command's own exit code (the first trial that failed, else 0); with --expect clean a finding turns
    a 0 into 1."""
    code = next((r.exit_code for r in results if r.exit_code != 0), 0)
    if code == 0 and expect_clean and any(not r.clean for r in results):
        return 1
    return code


def _trial_facts(result: TrialResult) -> TrialFacts:
    return {
        "trial": result.index + 1, "exit_code": result.exit_code, "seconds": result.seconds,
        "findings": len(result.findings), "killed_on_hang": result.killed_on_hang,
        "signals_forwarded": list(result.signals_forwarded), "session": result.session,
        "ended": list(result.ended), "crashes": [CrashFacts(pid=c.pid, trace=c.trace) for c in result.crashes],
        "processes": [{"pid": r.pid, "rank": r.rank, "argv": list(r.argv), "torch": r.torch_version,
                       "ended": r.ended, "events": len(r.events), "fx_errors": len(r.blames),
                       "hang": None if r.hang is None else r.hang.diagnosis.cycle,
                       "hang_latency_s": None if r.hang is None else r.hang.latency_s}
                      for r in result.records],
    }


def trace_phases(results: Sequence[TrialResult], rank: Optional[int] = None) -> List[tuple]:
    """(row name, events) per process for runtime/chrome_trace.py, on one clock: each process's events are
    shifted by when its agent started. `rank` keeps only that rank's processes (the per-rank traces)."""
    from dflash_doctor.runtime.recorder import Event

    phases: List[tuple] = []
    for result in results:
        records = [r for r in result.records if rank is None or r.rank == rank]
        if not records:
            continue
        origin = min(r.started_at for r in result.records)
        for record in records:
            shift = record.started_at - origin
            name = " ".join(record.argv[:2]) or "python"
            trial = f"trial {result.index + 1} " if len(results) > 1 else ""
            phases.append((f"{trial}{record.label} {name}",
                           [Event(e.t + shift, e.thread, e.tid, e.kind, e.phase, e.detail) for e in record.events]))
    return phases


def ranks_of(results: Sequence[TrialResult]) -> List[int]:
    return sorted({r.rank for result in results for r in result.records if r.rank is not None})
