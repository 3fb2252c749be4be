"""Lines a rule's hook held for what should follow them (rules/logs LineMemory), reported when that came or when
it is no longer due: a recompile-limit warning waits up to RECOMPILE_LOOKAHEAD lines for its 'function:' line; a
'terminate called' line no rank claimed within ABORT_LINES is the process's own abort; DeepSpeed's launcher line cut
before its return code, and py-spy's 'Process N:' with no thread after it, are reported at the end of the log.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import List

from dflash_doctor.findings import Finding
from dflash_doctor.logs.death_ledger import DeathKind
from dflash_doctor.logs.scan_common import MAIN
from dflash_doctor.logs.scan_context import ScanContext
from dflash_doctor.rules.logs import (
    ABORT_LINES,
    LOG_NCCL_WATCHDOG_ABORT,
    LOG_PROCESS_DIED,
    LOG_RECOMPILE_LIMIT,
    LOG_RULES,
    LOG_STACK_DUMP_HANG,
)

RECOMPILE_LOOKAHEAD = 3  # the 'function:' line follows the recompile-limit line
_RECOMPILED_FUNCTION = re.compile(r"function: '(?P<function>[^']+)' \((?P<where>[^)]*)\)")


class HeldLines:
    def __init__(self, context: ScanContext) -> None:
        self._context = context
        self._memory = context.memory

    def busy(self) -> bool:
        return bool(self._memory.held_recompile or self._memory.held_abort)

    def before_line(self, body: str, lineno: int) -> List[Finding]:
        """What a new line completes of the held ones, before the line itself is read."""
        new: List[Finding] = []
        if self._memory.held_recompile is not None:
            new += self._recompile_lookahead(body)
        held = self._memory.held_abort
        if held is not None and lineno - held.lineno > ABORT_LINES:
            new += self.flush_abort()
        return new

    def _recompile_lookahead(self, body: str) -> List[Finding]:
        held = self._memory.held_recompile
        if held is None:
            return []
        match = _RECOMPILED_FUNCTION.search(body)
        held.lines_seen += 1
        if match:
            held.function = f"{match.group('function')} ({match.group('where')})"
        elif held.lines_seen < RECOMPILE_LOOKAHEAD:
            return []
        return self.flush_recompile()

    def flush_recompile(self) -> List[Finding]:
        held, self._memory.held_recompile = self._memory.held_recompile, None
        if held is None:
            return []
        details = {k: held.details[k] for k in ("limit", "limit_value", "fatal", "why")}
        details["function"] = held.function
        entry = LOG_RULES[LOG_RECOMPILE_LIMIT.code]
        return self._context.emit(LOG_RECOMPILE_LIMIT, (held.function or held.worker,),
                                  entry.message(details), held.lineno, dict(details, thread=held.worker))

    def flush_abort(self) -> List[Finding]:
        """A 'terminate called' line no rank claimed within ABORT_LINES: the process's own abort."""
        held, self._memory.held_abort = self._memory.held_abort, None
        if held is None:
            return []
        entry = LOG_RULES[LOG_NCCL_WATCHDOG_ABORT.code]
        new = self._context.cause(entry, held.details, MAIN, held.lineno)
        self._context.deaths.died(MAIN, entry.rule.code, held.lineno, held.lineno, held.details,
                                  exception=None, message=held.body.strip(), kind=DeathKind.PROCESS)
        return new

    def report_at_end(self) -> None:
        """Lines held for what should have followed them, which did not come."""
        cut = self._memory.launcher_cut
        if cut is not None:
            self._context.cause(LOG_RULES[LOG_PROCESS_DIED.code], cut.details, cut.worker, cut.lineno)
            self._context.deaths.died(cut.worker, LOG_PROCESS_DIED.code, cut.lineno, cut.lineno, cut.details,
                                      exception=None, message="", kind=DeathKind.PROCESS)
        header = self._memory.pyspy_header
        if header is not None:
            self._context.emit(LOG_STACK_DUMP_HANG, (header.lineno,), f"{header.worker}: py-spy dump of a stuck "
                               "process (its threads were not pasted)", header.lineno,
                               dict(thread=header.worker, threads=[]))

    def merge_fatal_recompile(self) -> None:
        """With fullgraph=True the limit warning is followed by FailOnRecompileLimitHit: one fatal finding, not a
        warning that says 'runs eagerly' beside it."""
        emitted = self._context.emitted
        fatal = [f for f in emitted.findings if f.code == LOG_RECOMPILE_LIMIT.code and f.evidence.get("fatal")]
        if not fatal:
            return
        warnings = [f for f in emitted.findings
                    if f.code == LOG_RECOMPILE_LIMIT.code and not f.evidence.get("fatal")]
        function = next((w.evidence.get("function") for w in warnings if w.evidence.get("function")), None)
        limit = next((w.evidence for w in warnings if w.evidence.get("limit")), None)
        merged = []
        for finding in fatal:
            details = dict(finding.evidence, function=finding.evidence.get("function") or function)
            if limit is not None and not details.get("limit"):
                details.update(limit=limit["limit"], limit_value=limit["limit_value"])
            message = f"{details['thread']}: {LOG_RULES[LOG_RECOMPILE_LIMIT.code].message(details)}"
            merged.append(replace(finding, message=message, evidence=details))
        kept = [f for f in emitted.findings if f.code != LOG_RECOMPILE_LIMIT.code]
        emitted.findings = kept + merged
