"""A line outside any traceback: a progress line, one rule's line, or a thread's death logged on one line.

The rules are tried in LOG_RULES order and the first whose trigger word and pattern match takes the line. A rule's
own behaviour runs through its hooks (rules/logs/model.py: `on_match`, `on_line`, `worker_of`, ...), which see this part
as their `RuleScanner`: what it offers them (the line memory, the line before, starting a stack dump, reporting, who
is dead) is all a hook may use, so the scanner never branches on a rule's code.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from dflash_doctor.findings import Finding
from dflash_doctor.logs import patterns
from dflash_doctor.logs.death_ledger import DeathKind
from dflash_doctor.logs.death_records import one_line_death
from dflash_doctor.logs.dump_findings import DumpReader
from dflash_doctor.logs.intake import TRIGGER
from dflash_doctor.logs.lines import thread_of
from dflash_doctor.logs.options import compile_thread_pattern
from dflash_doctor.logs.scan_common import LINE_RULES, MAIN, MESSAGE_CHARS, exception_type, first_line
from dflash_doctor.logs.scan_context import ScanContext
from dflash_doctor.logs.stackdump import GDB_BACKTRACE
from dflash_doctor.logs.throughput import IT_S, TOK_S, rate, step
from dflash_doctor.rules.logs import LOG_THREAD_DIED, LogRule, RuleLine
from dflash_doctor.rules.registry import Rule

LAUNCHER_WRAP_LINES = 3  # a launcher line wrapped by the terminal goes on within this many lines


class RuleLines:
    def __init__(self, context: ScanContext, dumps: DumpReader) -> None:
        self._context = context
        self._dumps = dumps
        self.memory = context.memory  # (RuleScanner) what the rules' hooks keep from line to line
        self._thread_re = compile_thread_pattern(context.options.thread_pattern)
        self._default_threads = context.options.thread_pattern is None
        self._hooked: List[Finding] = []  # what a rule's hook reported for the line being parsed

    # -- what the rules' hooks use (rules/logs/model.py RuleScanner) ---------------------------------------------------

    def report(self, rule: Rule, key: tuple, message: str, lineno: int, evidence: Dict[str, Any]) -> None:
        self._hooked += self._context.emit(rule, key, message, lineno, evidence)

    def is_dead(self, worker: str) -> bool:
        return worker in self._context.deaths

    def line_before(self) -> Optional[str]:
        """The line just before the one being parsed (read from the block: the scanner may have skipped it)."""
        return self._context.cursor.line_before()

    def start_dump(self, lineno: int, stream: Optional[str], text: str) -> None:
        self._dumps.start(lineno, stream, text)

    # -- one line --------------------------------------------------------------------------------------------------

    def read(self, body: str, stream: Optional[str], lineno: int) -> List[Finding]:
        """A line outside any block: progress, or one rule's line."""
        worker = stream or thread_of(body, self._thread_re, self._default_threads)
        if worker == MAIN and self._context.deaths.record_owner is not None:
            worker = self._context.deaths.record_owner  # the message of a thread's one-line death, going on
        new: List[Finding] = []
        found = rate(body)
        steps = step(body)
        if found is not None or steps is not None:
            new = self._progress(found, steps, stream, worker, lineno)
            if not TRIGGER(body.encode("utf-8", "replace")):
                return new
        if body.startswith("(gdb) ") and GDB_BACKTRACE.match(body):
            self.start_dump(lineno, stream, body)  # backtraces taken by hand: the selected thread's frames follow
            return new
        informational = body[:2] in ("I0", "I1", "[I") and patterns.GLOG_INFO.match(body) is not None
        for entry in LINE_RULES:
            if not any(word in body for word in entry.triggers):
                continue
            if informational and entry.records_only:
                continue  # ProcessGroupNCCL's info records (a clean shutdown's 'found async exception ...')
            match = entry.pattern.search(body) if entry.pattern is not None else None
            if match is None:
                continue
            return new + self._rule_line(entry, RuleLine(body, lineno, stream, worker, match))
        death = one_line_death(body)
        if death is not None:
            new += self._one_line_death(death, stream, lineno)
        return new

    def _progress(self, found: Optional[Tuple[float, str]], steps: Optional[int], stream: Optional[str], worker: str,
                  lineno: int) -> List[Finding]:
        value, unit = found if found is not None else (None, TOK_S)
        tokens_per_it = self._context.options.tokens_per_it
        if unit == IT_S and value is not None and tokens_per_it:
            value, unit = value * tokens_per_it, TOK_S
        if stream is None and worker != MAIN:
            self._context.names.tag(worker, f"[{worker}]".encode())
        return self._context.drops(self._context.progress.record(worker, steps, value, lineno, unit))

    def _one_line_death(self, death: "re.Match[str]", stream: Optional[str], lineno: int) -> List[Finding]:
        """'Exception in thread NAME: Type: message' that no rule explains: NAME died of it, unless the record's
        next lines name a cause (then that cause supersedes this finding, as for a bare exception line)."""
        deaths = self._context.deaths
        worker = stream if stream is not None and stream.startswith("rank") else death.group("thread")
        deaths.open_record(worker, lineno)
        message = (death.group("message") or "").strip()
        said = f": {first_line(message)}" if message else ""
        new = self._context.emit(LOG_THREAD_DIED, (worker,), f"thread {worker} died: {death.group('type')}{said}"
                                 [:MESSAGE_CHARS], lineno, dict(thread=worker, exception=death.group("type"),
                                                                block_line=lineno, last_step=deaths.last_step(worker)))
        deaths.died(worker, LOG_THREAD_DIED.code, lineno, lineno, {}, exception=death.group("type"),
                    message=message, kind=DeathKind.THREAD)
        deaths.note_bare(worker, lineno, new)
        return new

    def _rule_line(self, entry: LogRule, line: RuleLine) -> List[Finding]:
        """A line the rule's pattern matched: its hooks first, then its finding (and the death it reports)."""
        if entry.on_match is not None:
            entry.on_match(self, line)
            return self._take_hooked()
        details = entry.details(line.match, line.body)
        worker = self._context.names.worker_for(line.worker, details, line.stream)
        worker = self._launcher_resumed(worker, line)
        if entry.worker_of is not None:
            worker = entry.worker_of(details) or worker
        if entry.on_line is not None:
            hooked = entry.on_line(self, replace(line, worker=worker), details)
            if hooked is None:
                return self._take_hooked()
            worker = hooked
        deaths = self._context.deaths
        body, lineno = line.body, line.lineno
        death = one_line_death(body)
        died = entry.line_is_death or death is not None or patterns.EXCEPTION_LINE.match(body.strip()) is not None
        if death is not None:
            deaths.open_record(worker, lineno)
        if deaths.bare is not None and entry.fatal and not entry.line_is_death:  # a cause, not another death
            deaths.supersede_bare(worker, lineno, entry.rule.code)
        new = self._context.cause(entry, details, worker, lineno)
        if details.get("exception"):
            deaths.note_bare(worker, lineno, new)
        if death is not None:  # a logged excepthook's line: a thread died, of the exception the line names
            deaths.died(worker, entry.rule.code, lineno, lineno, details, exception=death.group("type"),
                        message=(death.group("message") or "").strip(), kind=DeathKind.THREAD)
        elif died:
            deaths.died(worker, entry.rule.code, lineno, lineno, details, exception=exception_type(body),
                        message=body.strip(), kind=DeathKind(entry.death_kind))
        return new

    def _launcher_resumed(self, worker: str, line: RuleLine) -> str:
        """DeepSpeed's launcher line wrapped by the terminal: its return code, on a line of its own, is the cut
        line's worker's."""
        if "exits with return code" not in line.body:
            return worker
        cut, self.memory.launcher_cut = self.memory.launcher_cut, None
        if cut is not None and worker == MAIN and line.lineno - cut.lineno <= LAUNCHER_WRAP_LINES:
            return cut.worker
        return worker

    def _take_hooked(self) -> List[Finding]:
        hooked, self._hooked = self._hooked, []
        return hooked
