"""A stack dump pasted into the log (py-spy, faulthandler, gdb), read to its end and reported once: a deadlock when
its threads show the compile-lock / autograd cycle, else a stuck process with where its threads were.

stackdump.py parses the dump's lines; this part decides when one starts and ends, joins a dump interrupted by a
line it does not know to its first part, and leaves a crash's dump (after 'Fatal Python error') to the crash.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.logs.scan_common import MAIN, MESSAGE_CHARS
from dflash_doctor.logs.scan_context import OpenSpan, ScanContext
from dflash_doctor.logs.stackdump import StackDumpParser, crash_context
from dflash_doctor.outcomes import FailureKind
from dflash_doctor.rules.logs import LOG_STACK_DUMP_HANG

DUMP_GAP_LINES = 12  # a dump going on this close after the last one ended is the same dump, resumed
CRASH_DUMP_LINES = 4  # a faulthandler dump starting this close after 'Fatal Python error' is the crash's


@dataclass(frozen=True)
class EndedDump:
    """The last dump reported: a dump of the same worker starting soon after it is its continuation."""

    worker: str
    end_line: int
    dump: StackDumpParser


class DumpReader(OpenSpan[StackDumpParser]):
    def __init__(self, context: ScanContext) -> None:
        self._context = context
        self.open: Optional[StackDumpParser] = None
        self._worker = MAIN
        self._last: Optional[EndedDump] = None

    def start(self, lineno: int, stream: Optional[str], text: str) -> None:
        """A dump's first line (a rule's hook or a '(gdb) bt' line saw it): read every line until it ends."""
        fatal_line = self._context.memory.fatal_error_line
        crash = crash_context(self._context.cursor.previous) or (
            fatal_line is not None and lineno - fatal_line <= CRASH_DUMP_LINES)
        self.open = StackDumpParser(lineno, crash=crash)
        worker = stream or MAIN
        last = self._last
        if last is not None and last.worker == worker and lineno - last.end_line <= DUMP_GAP_LINES:
            # the same dump, interrupted by a line it does not know or by the paster's prose between two fences
            self.open.start_line, self.open.threads = last.dump.start_line, last.dump.threads
        self._worker = worker
        self.open.feed(text)

    def end(self) -> List[Finding]:
        dump, self.open = self.open, None
        lineno = self._context.cursor.lineno
        if dump is not None and dump.crash:
            self._context.memory.fatal_error_line = lineno  # a crash dump cut by an odd line may go on after it
        if dump is None or dump.crash or not dump.threads:
            return []
        self._last = EndedDump(self._worker, lineno, dump)
        diagnosis = dump.diagnosis()
        threads = dump.summary()
        deadlock = diagnosis.kind == FailureKind.DEADLOCK
        if deadlock:
            message = f"{self._worker}: stack dump shows a deadlock: {diagnosis.summary()}"
        else:
            idle = sum(1 for t in dump.threads if t.status.startswith("idle"))
            where = "; ".join(f"{t['thread']} at {t['at']}" for t in threads[:4] if t["at"])
            message = (f"{self._worker}: stack dump of a stuck process, {len(threads)} thread(s), {idle} idle"
                       + (f": {where}" if where else ""))
        evidence = dict(thread=self._worker, cycle=diagnosis.cycle, chain=list(diagnosis.chain), threads=threads,
                        hint=diagnosis.hint)
        severity = Severity.ERROR if deadlock else None
        found = self._context.emitted.findings
        earlier = next((i for i, f in enumerate(found) if f.code == LOG_STACK_DUMP_HANG.code
                        and f.line == dump.start_line), None)
        if earlier is not None:  # the rest of a dump already reported: the finding now covers all of it
            found[earlier] = replace(found[earlier], message=message[:MESSAGE_CHARS * 2], evidence=evidence,
                                     severity=severity or LOG_STACK_DUMP_HANG.severity)
            return []
        return self._context.emit(LOG_STACK_DUMP_HANG, (dump.start_line,), message[:MESSAGE_CHARS * 2],
                                  dump.start_line, evidence, severity=severity)
