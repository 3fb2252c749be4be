"""Start the user's command with the bootstrap in its environment, stay out of its way, collect what it saw.

The command runs in a process group of its own, which takes the terminal's foreground when `run` has it (so
Ctrl-C at the terminal reaches the user's processes directly, as without the tool, and a job that reads the
terminal can). A SIGINT or SIGTERM sent to `run` itself is forwarded to that group. When the command ends,
whatever is left of its group gets SIGTERM, then SIGKILL: no orphan outlives the run. Its exit status is passed
through, a death by signal N as 128 + N, as a shell reports it.

Analysis never prints: a hang noticed while the command runs is handed to `announce` (the command writes it).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Finding, Problem
from dflash_doctor.supervise.facts import RateFacts, RunFacts, TrialFacts
from dflash_doctor.supervise.findings import findings_from_records
from dflash_doctor.supervise.records import ProcessRecord, load_session
from dflash_doctor.supervise.session import RunConfig, child_environment

if TYPE_CHECKING:
    from dflash_doctor.findings import Report
from dflash_doctor.vocabularies import OnHang

POLL_S = 0.25
LEFTOVER_GRACE_S = 3.0
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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


def _kill_group(pgid: int, signum: int) -> bool:
    """Signal the group; False when nobody is left in it."""
    try:
        os.killpg(pgid, signum)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def end_leftovers(pgid: int, grace_s: float = LEFTOVER_GRACE_S, clock=time.monotonic) -> None:
    """SIGTERM to what is left of the command's group, SIGKILL after `grace_s`."""
    if not _kill_group(pgid, signal.SIGTERM):
        return
    deadline = clock() + grace_s
    while clock() < deadline:
        time.sleep(0.05)
        if not _kill_group(pgid, 0):
            return
    _kill_group(pgid, signal.SIGKILL)


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class Supervisor:
    def __init__(self, spec: RunSpec, announce: Callable[[Finding], None],
                 popen=subprocess.Popen, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.announce = announce
        self._popen = popen
        self._clock = clock
        self._seen: Dict[Path, int] = {}  # record file -> the mtime last read (hangs are announced once)

    def run(self) -> List[TrialResult]:
        results = []
        for index in range(self.spec.trials):
            result = self.run_trial(index)
            results.append(result)
            if result.signals_forwarded:  # the user stopped it: no more trials
                break
        return results

    def run_trial(self, index: int) -> TrialResult:
        spec = self.spec
        session = Path(tempfile.mkdtemp(prefix="dflash-doctor-run-"))
        try:
            RunConfig(spec.hang_after_s, spec.cycle_confirm_s, spec.fixes).write(session)
            env = child_environment(session, cache_dir=session / "inductor-cache" if spec.cold_cache else None)
            terminal = _terminal()

            def own_group() -> None:  # in the child, before exec: its own group, in the terminal's foreground
                os.setpgid(0, 0)
                if terminal is not None:
                    _hand_terminal(terminal, os.getpid())

            started = self._clock()
            try:
                proc = self._popen(list(spec.command), env=env, preexec_fn=own_group)
            except FileNotFoundError:
                raise UsageError(f"command not found: {spec.command[0]}") from None
            except PermissionError:
                raise UsageError(f"command not executable: {spec.command[0]}") from None
            if terminal is not None:  # the parent too, as shells do: whichever runs first, the child has it
                _hand_terminal(terminal, proc.pid)
            announced: set = set()
            killed = False
            with _Forwarder(proc.pid) as forwarder:
                try:
                    while True:
                        try:
                            returncode = proc.wait(timeout=POLL_S)
                            break
                        except subprocess.TimeoutExpired:
                            pass
                        if self._announce_hangs(session, announced) and spec.on_hang is OnHang.KILL and not killed:
                            killed = True
                            _kill_group(proc.pid, signal.SIGKILL)
                finally:
                    if terminal is not None:
                        _hand_terminal(terminal, os.getpgrp())
                    end_leftovers(proc.pid)
            seconds = self._clock() - started
            records, problems = load_session(session)
            problems += _bootstrap_problems(session)
            findings = findings_from_records(records)
            kept = str(session) if spec.keep else None
            return TrialResult(index, exit_status(returncode), round(seconds, 3), tuple(records), tuple(findings),
                               tuple(problems), tuple(forwarder.received), killed, kept)
        finally:
            if not spec.keep:
                shutil.rmtree(session, ignore_errors=True)

    def _announce_hangs(self, session: Path, announced: set) -> bool:
        """Hand each newly written hang to `announce`, once; True when any process has a hang. Only records whose
        file changed since the last look are read, and only those holding a hang are parsed."""
        from dflash_doctor.supervise.records import ProcessRecord
        from dflash_doctor.supervise.session import RECORD_PREFIX

        for path in session.glob(f"{RECORD_PREFIX}*.json"):
            try:
                stamp = path.stat().st_mtime_ns
                if self._seen.get(path) == stamp:
                    continue
                self._seen[path] = stamp
                text = path.read_text(encoding="utf-8")
                if '"hang": null' in text:
                    continue
                record = ProcessRecord.from_dict(json.loads(text))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # replaced while being read: the next look reads the new one
            for finding in findings_from_records([record]) if record.hang is not None else ():
                key = _hang_key(finding)
                if key not in announced:
                    announced.add(key)
                    self.announce(finding)
        return bool(announced)


def _hang_key(finding: Finding) -> Tuple[str, object]:
    return finding.code, finding.evidence.get("pid")


def _bootstrap_problems(session: Path) -> List[Problem]:
    path = session / "bootstrap-errors.txt"
    if not path.exists():
        return []
    return [Problem("the bootstrap", line.strip(), "that process ran without the recorder and watchdog")
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]


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
    report.facts = {
        "command": list(spec.command), "fixes": list(spec.fixes), "cache": "cold" if spec.cold_cache else "as-is",
        "on_hang": spec.on_hang.value, "hang_after_s": spec.hang_after_s,
        "trials": [_trial_facts(result) for result in results], "rate": trial_rate(results),
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
