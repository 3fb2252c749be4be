"""torchrun's failure summary, read to its end: who died, which rank failed first, and of what.

torchrun.py parses the summary's fields; this part starts it (on 'ChildFailedError', its root-cause header, or an
exitcode field pasted alone), and at its end turns it into findings and deaths. The rank that failed first is the
root cause; the others it lists were taken down with it (collateral), unless the summary was cut before saying
which came first, when every listed rank is reported.
"""
from __future__ import annotations

from typing import Callable, List, Optional

from dflash_doctor.findings import Finding
from dflash_doctor.logs.blocks import BlockParser
from dflash_doctor.logs.death_ledger import DeathKind
from dflash_doctor.logs.facts import RootCauseFacts
from dflash_doctor.logs.scan_common import FATAL_RULES, MAIN, exception_type
from dflash_doctor.logs.scan_context import OpenSpan, ScanContext
from dflash_doctor.logs.torchrun import EXIT_FIELD, RANK_FIELD, Failure, SummaryParser
from dflash_doctor.rules.logs import LOG_KILLED_BY_SIGNAL, LOG_PROCESS_DIED, LOG_RULES, SIGNAL_MEANING


class TorchrunSummaryReader(OpenSpan[SummaryParser]):
    def __init__(self, context: ScanContext, blocks: BlockParser, line_before: Callable[[], Optional[str]]) -> None:
        self._context = context
        self._blocks = blocks
        self._line_before = line_before
        self.open: Optional[SummaryParser] = None
        self.root_cause: Optional[RootCauseFacts] = None

    def starts(self, body: str, stream: Optional[str], lineno: int) -> bool:
        """Start reading torchrun's summary when this line opens one; True when the line is then done with."""
        if "ChildFailedError" in body or "Root Cause (first observed failure)" in body:
            # torchrun's summary follows (or this is its root-cause section, grep'd): parse it, not the block's
            self._blocks.end_message(stream)
            self.open = SummaryParser(lineno)
            self.open.feed(body)
        elif self.open is None and EXIT_FIELD.match(body):
            self.open = SummaryParser(lineno)  # a summary pasted from its middle
            previous = self._line_before()
            if previous is not None and RANK_FIELD.match(previous):
                self.open.feed(previous)
            self.open.feed(body)
            return True
        return False

    def end(self) -> List[Finding]:
        summary, self.open = self.open, None
        if summary is None:
            return []
        root = summary.root or next((f for f in summary.failures if f.rank is not None), None)
        # a root cause cut before its exit code explains nothing: the failures shown in full are reported instead
        root_cut = root is not None and root.exitcode is None and not root.traceback
        new: List[Finding] = []
        if (root is None or root.rank is None) and summary.script:
            new += self._script_failed(summary)
        if not any(f.rank is not None for f in summary.failures) and not summary.script:
            # one field pasted alone ('exitcode  : -11 (pid: 5277) (SIGSEGV)'): a death, of a worker not named
            for failure in summary.failures[:1]:
                if failure.exitcode is not None and failure.exitcode != 0:
                    new += self._root_failure(failure, summary, MAIN, first=False)
        # no root-cause section, or one cut before its exit code: which rank failed first is unknown, and every rank
        # listed is reported
        unranked = (summary.root is None and len(summary.failures) > 1) or root_cut
        for failure in summary.failures:
            if failure.rank is None:
                continue
            worker = f"rank{failure.rank}"
            if failure is root or (root_cut and failure.signal) or unranked:
                new += self._root_failure(failure, summary, worker, first=not unranked)
            elif worker not in self._context.deaths:
                self._context.deaths.died(
                    worker, LOG_KILLED_BY_SIGNAL.code if failure.signal else LOG_PROCESS_DIED.code,
                    summary.start_line, summary.start_line, {"signal": failure.signal}, exception=None,
                    message=_failure_words(failure), kind=DeathKind.COLLATERAL)
        if root is not None:
            self.root_cause = {**root.to_dict(), "line": summary.start_line}
        return new

    def _script_failed(self, summary: SummaryParser) -> List[Finding]:
        """Cut before the failure's rank: torchrun still said the script failed."""
        details = {"script": summary.script}
        new = self._context.emit(LOG_PROCESS_DIED, (MAIN, "summary"),
                                 f"{MAIN}: {summary.script} failed under torchrun (its summary was cut before it "
                                 "named the rank and exit code)", summary.start_line, dict(details, thread=MAIN))
        self._context.deaths.died(MAIN, LOG_PROCESS_DIED.code, summary.start_line, summary.start_line, details,
                                  exception=None, message=f"{summary.script} FAILED", kind=DeathKind.PROCESS)
        return new

    def _root_failure(self, root: Failure, summary: SummaryParser, worker: str, first: bool = True) -> List[Finding]:
        deaths = self._context.deaths
        if worker in deaths:
            deaths.mark_root_cause(worker, first)
            return []
        text = root.text()
        others = [f.to_dict() for f in summary.failures if f is not root]
        common = {"root_cause": first, "exitcode": root.exitcode, "host": root.host, "pid": root.pid,
                  "other_failures": others}
        line = summary.start_line
        new: List[Finding] = []
        for entry in FATAL_RULES:
            match = entry.pattern.search(text) if entry.pattern is not None else None
            if match is not None:
                details = dict(entry.details(match, text), **common)
                new += self._context.cause(entry, details, worker, line)
                deaths.died(worker, entry.rule.code, line, line, details,
                            exception=exception_type(text.splitlines()[-1]) if text else None,
                            message=text.splitlines()[-1] if text else "", kind=DeathKind.PROCESS)
                break
        else:
            if root.signal:
                details = dict(common, signal=root.signal, meaning=SIGNAL_MEANING.get(root.signal, ""))
                new += self._context.cause(LOG_RULES[LOG_KILLED_BY_SIGNAL.code], details, worker, line)
                deaths.died(worker, LOG_KILLED_BY_SIGNAL.code, line, line, details, exception=None,
                            message=_failure_words(root), kind=DeathKind.SIGNAL)
            else:
                said = "failed first" if first else "failed (torchrun's summary; its root cause is not in the log)"
                new += self._context.emit(LOG_PROCESS_DIED, (worker,), f"{worker}: {said} ({_failure_words(root)})",
                                          line, dict(common, thread=worker, last_step=deaths.last_step(worker)))
                deaths.died(worker, LOG_PROCESS_DIED.code, line, line, common, exception=None,
                            message=_failure_words(root), kind=DeathKind.PROCESS)
        if worker in deaths and first:
            deaths.mark_root_cause(worker, True)
        return new


def _failure_words(failure: Failure) -> str:
    if failure.signal:
        return f"killed by {failure.signal}"
    if failure.exitcode is not None:
        return f"exit code {failure.exitcode}"
    return "failed"
