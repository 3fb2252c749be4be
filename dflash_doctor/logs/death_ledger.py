"""The death ledger: which worker died, of what, on which line; one entry per worker, the first death read wins.

Every part of a scan that reads a death (a closed traceback, a rule's fatal line, torchrun's summary, a held abort)
writes it here, and the ledger alone changes an entry afterwards. Two later readings do change one:
- a bare exception line ('RuntimeError: TensorStorage ...') whose message goes on to the next lines, which name
  the cause: the bare line's finding and death give way to that cause (`supersede_bare`);
- a worker that logs progress after its 'death' only logged a handled error: it is struck off and its fatal
  findings become warnings (`demote_handled`, at the end of the log).
It also holds the open one-line record ('... Exception in thread drafter-0: TorchRuntimeError: ...' whose message
goes on over lines naming no thread, death_records.py), because those lines belong to that death's thread.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.logs.cursor import Cursor, look_back
from dflash_doctor.logs.death_records import OpenRecord
from dflash_doctor.logs.emitted import EmittedFindings
from dflash_doctor.logs.facts import DeathFacts
from dflash_doctor.logs.lines import WorkerNames
from dflash_doctor.logs.scan_common import FATAL_CODES, MESSAGE_CHARS, first_line
from dflash_doctor.logs.worker_progress import ProgressTracker
from dflash_doctor.outcomes import WireEnum
from dflash_doctor.rules.logs import LOG_PROCESS_DIED, gpu_in

BARE_MESSAGE_LINES = 3  # lines after a bare exception line that may still be its message


class DeathKind(WireEnum):
    """How a worker ended (the facts' `died.kind`; the same words as before it was an enum)."""

    PROCESS = "process"  # its process ended: a main thread's traceback, a fatal line, the launcher's word
    THREAD = "thread"  # one thread of a process died; the process may have gone on
    SIGNAL = "signal"  # killed by a signal: such a process prints no traceback after the line that says so
    COLLATERAL = "collateral"  # torchrun listed it beside the rank that failed first: taken down with it


@dataclass(frozen=True)
class BareDeath:
    """The last bare exception line's death: its next lines may still name its cause (then the cause replaces it)."""

    worker: str
    line: int
    finding: Optional[Finding]  # its finding, None when the emitter counted it as a repeat or capped it


class DeathLedger:
    def __init__(self, cursor: Cursor, names: WorkerNames, progress: ProgressTracker,
                 emitted: EmittedFindings) -> None:
        self._cursor = cursor
        self._names = names
        self._progress = progress
        self._emitted = emitted
        self._deaths: Dict[str, DeathFacts] = {}
        self.bare: Optional[BareDeath] = None
        self.record: Optional[OpenRecord] = None  # a thread's one-line death whose message may go on
        self.record_owner: Optional[str] = None  # the open record's thread, when the line being read is in it

    def __contains__(self, worker: str) -> bool:
        return worker in self._deaths

    def __len__(self) -> int:
        return len(self._deaths)

    def get(self, worker: str) -> Optional[DeathFacts]:
        return self._deaths.get(worker)

    def workers(self) -> Dict[str, DeathFacts]:
        """The deaths by worker (ProgressTracker.stalls excludes these)."""
        return self._deaths

    def last_step(self, worker: str) -> Optional[int]:
        state = self._progress.threads.get(worker)
        return state.last_step if state else None

    def died(self, worker: str, code: str, line: int, block_line: int, details: Dict[str, Any], *,
             exception: Optional[str], message: str, kind: DeathKind, last_frame: Optional[str] = None) -> None:
        """Write a death unless the worker has one already (the first reading is the death; later ones are its
        echoes) or the ledger is as full as the progress tracker (bounded whatever the log)."""
        if worker in self._deaths or len(self._deaths) >= self._progress.max_threads:
            return
        if line == self._cursor.lines:
            look_back(self._cursor, self._names, self._progress, worker)
        gpu = details.get("gpu")
        if gpu is None and message:
            gpu = gpu_in(message)
        self._deaths[worker] = {
            "line": line, "block_line": block_line, "exception": exception,
            "message": first_line(message)[:MESSAGE_CHARS], "code": code, "last_frame": last_frame,
            "last_step": self.last_step(worker), "gpu": gpu, "signal": details.get("signal"), "kind": kind,
            "root_cause": False,
        }

    def mark_root_cause(self, worker: str, first: bool) -> None:
        death = self._deaths.get(worker)
        if death is not None:
            death["root_cause"] = first

    # -- the open one-line record and the bare exception line ------------------------------------------------

    def enter_line(self, raw: bytes, lineno: int) -> None:
        """Before a line is parsed: whether it goes on with the open record (then it is that thread's)."""
        self.record_owner = None
        if self.record is not None:
            if self.record.holds(raw, lineno):
                self.record_owner = self.record.thread
            else:
                self.record = None

    def open_record(self, worker: str, lineno: int) -> None:
        self.record = OpenRecord(worker, lineno)

    def note_bare(self, worker: str, lineno: int, new: List[Finding]) -> None:
        self.bare = BareDeath(worker, lineno, new[0] if new else None)

    def supersede_bare(self, worker: str, lineno: int, code: str) -> None:
        """'RuntimeError: TensorStorage ...' then 'cuda failed with error 2 out of memory': the exception's message
        went on to the next lines, which name the cause; the bare exception's finding gives way to it."""
        bare = self.bare
        self.bare = None
        bare_worker, bare_line = (bare.worker, bare.line) if bare is not None else (None, 0)
        in_record = self.record_owner == worker and self.record is not None and self.record.line == bare_line
        if bare_worker != worker or not (0 < lineno - bare_line <= BARE_MESSAGE_LINES or in_record):
            return
        if bare is not None and bare.finding is not None:
            self._emitted.withdraw(bare.finding, (worker,))
        death = self._deaths.get(worker)
        if death is None or death["line"] != bare_line:
            return
        if in_record:
            death["code"] = code  # the thread died on its record's first line, of this cause
        else:
            del self._deaths[worker]

    # -- at the end of the log ----------------------------------------------------------------------------------

    def demote_handled(self) -> None:
        """A worker that logs progress after its traceback only logged a handled error: not dead."""
        for worker, death in list(self._deaths.items()):
            if death["kind"] != DeathKind.PROCESS:
                continue
            state = self._progress.threads.get(worker)
            if state is None or state.last_line <= death["line"]:
                continue
            del self._deaths[worker]
            self._emitted.findings = [kept for finding in self._emitted.findings
                                      for kept in _after_survival(finding, worker, state.last_line)]


def _after_survival(finding: Finding, worker: str, progress_line: int) -> List[Finding]:
    """What becomes of a finding once `worker` is known to have logged progress on `progress_line`, after it."""
    if finding.evidence.get("thread") != worker or finding.line is None or finding.line > progress_line:
        return [finding]
    if finding.code == LOG_PROCESS_DIED.code:
        return []
    if finding.code in FATAL_CODES:
        return [replace(finding, severity=Severity.WARNING,
                        message=f"{finding.message} (handled: {worker} logged progress after it)",
                        evidence=dict(finding.evidence, survived=True))]
    return [finding]
