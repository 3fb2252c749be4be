"""What a traceback means once blocks.py has assembled it: the cause its exceptions name, or a death no rule
explains, or nothing (torchrun's own traceback, one the program printed and went on from, one a thread caught and
logged).

Whether a traceback ended a worker is decided by the line before it, which is gone by the time the block closes; so
the line opening a traceback is noted here as it is read (`opened`), and the closed block is judged by that note.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.logs import patterns
from dflash_doctor.logs.blocks import BlockParser, ExceptionBlock, ExceptionRecord
from dflash_doctor.logs.cursor import look_back
from dflash_doctor.logs.death_ledger import DeathKind
from dflash_doctor.logs.logged import UNKNOWN_THREAD, logged_by, ran_in_a_thread
from dflash_doctor.logs.scan_common import FATAL_RULES, MAIN, MESSAGE_CHARS, first_line
from dflash_doctor.logs.scan_context import ScanContext
from dflash_doctor.rules.logs import LOG_DENSE_ATTENTION_FALLBACK, LOG_PROCESS_DIED, LOG_THREAD_DIED, LogRule

MAX_HANDLED = 4096  # tracebacks remembered as handled or logged: bounded whatever the log
# The line before a traceback that says the program went on: CPython's unraisable hook, retry/recover loggers.
HANDLED = re.compile(r"(?i)\bexception ignored in\b|attempting to recover|\bretrying\b|\bwill retry\b"
                     r"|\brecovering\b|\bignor(?:ed|ing) (?:the |this )?(?:error|exception)")
EXPLAINED_LINES = 30  # a cut traceback starting this close after a fatal line of its worker is that death's
DENSE_FRAMES = ("sdpa_dense", "math_attention", "sdpa_dense_backward")  # flex_attention's uncompiled path
_FLAT_FILES = re.compile(r'File "([^"]+)"')  # frames of a traceback flattened onto one line
_EXPLAINING = frozenset(entry.rule.code for entry in FATAL_RULES if entry.explains_cut_traceback)
# Ray's exception for a dead actor lists what may have killed it ('There are some potential root causes. (1) The
# process is killed by SIGKILL by OOM killer ...'): guesses, not the exception's cause. (Its raylet's own line, 'A
# worker died or was killed ...', still reports the worker's death.)
_SPECULATION = "potential root causes"


def _launcher_files(files: Iterable[str]) -> bool:
    """Files of torchrun's / torch.distributed.launch's agent reporting a failed child (not a death itself)."""
    # (not elastic/multiprocessing/errors: its @record wrapper is on the workers' own main functions too)
    return any("distributed/launcher/api.py" in file or "elastic/multiprocessing/api.py" in file
               or "elastic/agent/" in file or file.endswith(("/torchrun", "distributed/run.py"))
               for file in files)


def _launchers(block: ExceptionBlock) -> bool:
    """Whether the block's frames (or, flattened onto one line, its lead) are the launcher's own."""
    return _launcher_files(f.file for f in block.stack.frames) or _launcher_files(_FLAT_FILES.findall(block.lead))


def _headless_thread(block: ExceptionBlock) -> bool:
    """A traceback that names no thread or stream, yet whose frames ran in a thread (its header was not pasted)."""
    return block.thread is None and block.stream is None and ran_in_a_thread(f.file for f in block.stack.frames)


@dataclass(frozen=True)
class Cause:
    """The first rule a traceback's exceptions matched: the death's code and what the rule read."""

    code: str
    details: Dict[str, Any] = field(default_factory=dict)


class TracebackJudge:
    def __init__(self, context: ScanContext, blocks: BlockParser) -> None:
        self._context = context
        self._blocks = blocks
        self._handled: Set[int] = set()  # start lines of tracebacks printed by a program that went on
        self._logged: Dict[int, str] = {}  # start lines of tracebacks a thread caught and logged -> that thread
        self._launcher_line = 0  # where torchrun's own traceback (cut) started, if it did
        self.exceptions = 0  # traceback blocks closed

    def opened(self, body: str, stream: Optional[str], lineno: int) -> None:
        """A line a traceback block took: when it opens one, whose it is and whether the program went on."""
        context = self._context
        opened = patterns.THREAD_EXCEPTION.match(body) if body.startswith(patterns.THREAD_HEADER_STARTS) else None
        if opened is not None:
            look_back(context.cursor, context.names, context.progress, opened.group("thread"))
        elif patterns.TRACEBACK_START.search(body):
            before = context.cursor.line_before()
            if before is not None and HANDLED.search(before) and len(self._handled) < MAX_HANDLED:
                self._handled.add(lineno)
            catcher = logged_by(before)
            if catcher is not None and len(self._logged) < MAX_HANDLED:
                self._logged[lineno] = catcher  # 'ERROR ... [drafter-1] step failed' then its traceback
                self._blocks.name_open(stream, catcher)
            header = patterns.THREAD_EXCEPTION.match(before) if before and before.startswith("in thread ") else None
            if header is not None:
                self._blocks.name_open(stream, header.group("thread"))
            if stream is not None:
                look_back(context.cursor, context.names, context.progress, stream)

    def close(self, blocks: List[ExceptionBlock]) -> List[Finding]:
        new: List[Finding] = []
        starts = {b.start_line for b in blocks if b.stream is not None}
        for block in blocks:
            self.exceptions += 1
            if block.stream is None and block.thread is None and not block.stack.frames and not block.exceptions \
                    and block.start_line + 1 in starts:
                continue  # a bare 'Traceback' header whose frames came behind a rank's prefix: that rank's block
            new += self._block(block)
        return new

    def report_at_end(self) -> None:
        if self._launcher_line and not self._context.deaths:
            # the launcher's traceback, cut, and nothing else says which worker failed: the run still died
            self._context.emit(LOG_PROCESS_DIED, (MAIN, "launcher"),
                               f"{MAIN}: the launcher (torchrun / torch.distributed.launch) reported a failed worker; "
                               "the worker's own output is not in the log", self._launcher_line,
                               dict(thread=MAIN, launcher=True))

    def _block(self, block: ExceptionBlock) -> List[Finding]:
        """A traceback, closed: the cause its exceptions name, or a death no rule explains."""
        worker = (block.stream or block.thread or MAIN) if block.process else (block.thread or block.stream or MAIN)
        final = block.final
        if block.start_line in self._handled:
            return self._caught_block(block, worker, handled=True)
        if block.start_line in self._logged:
            return self._caught_block(block, self._logged[block.start_line], handled=False)
        in_a_thread = _headless_thread(block)
        if in_a_thread:
            worker = UNKNOWN_THREAD  # a thread's traceback whose header was not pasted: not the main thread
        if final is not None and final.type.endswith("ChildFailedError"):
            return []  # torchrun's own traceback: its summary (torchrun.py) names the rank that failed
        new, worker, cause = self._block_causes(block, worker)
        new += self._dense_frames(block, worker)
        if final is None and block.thread is None and _launchers(block):
            self._launcher_line = self._launcher_line or block.start_line
            return new  # torchrun's own traceback: its summary names the rank that failed
        thread_death = in_a_thread or (block.thread is not None and not block.process)
        if cause is None and final is None and self._explained(worker, block.start_line):
            return new  # a traceback cut before its exception, after a line that already said how this worker died
        if cause is None:
            new += self._unexplained_death(block, worker, thread_death)
            cause = Cause(LOG_THREAD_DIED.code if thread_death else LOG_PROCESS_DIED.code)
        innermost = block.stack.innermost
        self._context.deaths.died(worker, cause.code, final.line if final else block.start_line, block.start_line,
                                  cause.details, exception=final.type if final else None,
                                  message=final.message if final else "",
                                  kind=DeathKind.THREAD if thread_death else DeathKind.PROCESS,
                                  last_frame=innermost.where() if innermost else None)
        return new

    def _block_causes(self, block: ExceptionBlock, worker: str) -> Tuple[List[Finding], str, Optional[Cause]]:
        """(findings, the worker, the first cause) of what the block's exceptions (or its lead) name."""
        new: List[Finding] = []
        cause: Optional[Cause] = None
        messages = [(f"{exc.type}: {exc.message}" if exc.message else exc.type, exc.line) for exc in block.exceptions]
        for text, line in messages or ([(block.lead, block.start_line)] if block.lead else []):
            text = text.split(_SPECULATION, 1)[0]
            for entry in FATAL_RULES:
                match = entry.pattern.search(text) if entry.pattern is not None else None
                if match is None or (entry.explains_block is not None and not entry.explains_block(
                        match, block.thread is not None, tuple(f.function for f in block.stack.frames))):
                    continue
                details = entry.details(match, text)
                worker = self._context.names.worker_for(worker, details, block.stream)
                worker = (entry.worker_of(details) if entry.worker_of is not None else None) or worker
                new += self._context.cause(entry, details, worker, line, block.start_line)
                cause = cause or Cause(entry.rule.code, details)
                break
        return new, worker, cause

    def _dense_frames(self, block: ExceptionBlock, worker: str) -> List[Finding]:
        dense = [f for f in block.stack.frames if f.function in DENSE_FRAMES]
        if not dense:
            return []
        final = block.final
        return self._context.emit(LOG_DENSE_ATTENTION_FALLBACK, (),
                                  f"{worker}: traceback through {dense[-1].function}, flex_attention's dense path",
                                  final.line if final else block.start_line,
                                  dict(thread=worker, via="traceback", frame=f"{dense[-1].file}:{dense[-1].line}",
                                       block_line=block.start_line))

    def _unexplained_death(self, block: ExceptionBlock, worker: str, thread_death: bool) -> List[Finding]:
        final: Optional[ExceptionRecord] = block.final
        rule = LOG_THREAD_DIED if thread_death else LOG_PROCESS_DIED
        what = f"thread {worker}" if thread_death else (f"{worker} (main thread)" if worker == MAIN else worker)
        if final is None:
            message = f"{what} died; its exception is not in the log"
        else:
            said = f": {first_line(final.message)}" if final.message else ""
            message = f"{what} died: {final.type}{said}"[:MESSAGE_CHARS]
        return self._context.emit(rule, (worker,), message, final.line if final else block.start_line,
                                  dict(thread=worker, exception=final.type if final else None,
                                       block_line=block.start_line, last_step=self._context.deaths.last_step(worker)))

    def _explained(self, worker: str, line: int) -> bool:
        """Whether a fatal finding for `worker` came shortly before `line` ('THCudaCheck FAIL ... device-side assert
        triggered', then the traceback it raised, cut)."""
        # (not a signal: a process killed by one prints no traceback after it; SIGINT's or SIGTERM's traceback is
        # the process's own record of its end, reported as such)
        death = self._context.deaths.get(worker)
        if death is not None:
            return death["kind"] != DeathKind.SIGNAL
        return any(f.evidence.get("thread") == worker and f.line is not None and 0 <= line - f.line <= EXPLAINED_LINES
                   and f.code in _EXPLAINING for f in self._context.emitted.findings[-8:])

    def _caught_block(self, block: ExceptionBlock, worker: str, handled: bool) -> List[Finding]:
        """A traceback the program printed and went on from ('Exception ignored in:', '... attempting to recover';
        `handled`: a named cause is still reported, as a warning), or one a thread caught and logged (its logger
        record names it on the line before: an error of that thread, not its death). No death either way."""
        new: List[Finding] = []
        for exc in block.exceptions:
            text = f"{exc.type}: {exc.message}" if exc.message else exc.type
            entry = next((e for e in FATAL_RULES if e.pattern is not None and e.pattern.search(text)), None)
            if entry is None or entry.rule.code == LOG_PROCESS_DIED.code:
                continue
            match = entry.pattern.search(text) if entry.pattern is not None else None
            details = entry.details(match, text) if match is not None else {}
            new += self._caught_finding(entry, details, block, exc, worker, handled)
        return new

    def _caught_finding(self, entry: LogRule, details: Dict[str, Any], block: ExceptionBlock,
                        exc: ExceptionRecord, worker: str, handled: bool) -> List[Finding]:
        if handled:
            return self._context.emit(
                entry.rule, (worker, "handled", exc.line),
                f"{worker}: {entry.message(details)} (handled: the log says it went on)"[:MESSAGE_CHARS],
                exc.line, dict(details, thread=worker, block_line=block.start_line, survived=True),
                severity=Severity.WARNING)
        return self._context.emit(
            entry.rule, (worker, "logged", exc.line),
            f"{worker}: {entry.message(details)} (caught and logged by {worker}: an error of that thread, not its "
            "death)"[:MESSAGE_CHARS], exc.line,
            dict(details, thread=worker, block_line=block.start_line, caught=True,
                 last_step=self._context.deaths.last_step(worker)))
