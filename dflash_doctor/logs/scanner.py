"""LogScanner: one pass over a log producing DFD5xx findings as soon as they are certain.

The scanner only wires its parts and routes each line it parses; each part has one job:
- intake.py: which lines of a block are parsed (all of a small block; the prefilter's lines and a progress sample
  of a large one) and the progress lines recorded on the way;
- blocks.py assembles tracebacks line by line, tracebacks.py judges each one closed (a cause, a death, nothing);
- line_rules.py: a line outside any traceback (progress, one rule's line with its hooks, a one-line death);
- torchrun_findings.py and dump_findings.py: torchrun's failure summary and pasted stack dumps, read to their end;
- held_lines.py: the lines rules hold for what should follow them;
- death_ledger.py: who died of what, on which line; scan_context.py: what all of them share.

`feed`/`feed_block` return the findings a line completes (so `--follow` can show them live), `finish` the
Report. State is bounded (blocks.py, worker_progress.py, torchrun.py, stackdump.py) and findings are capped per rule.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple, cast

from dflash_doctor.findings import Finding, Report
from dflash_doctor.logs.blocks import BlockParser
from dflash_doctor.logs.dump_findings import DumpReader
from dflash_doctor.logs.facts import LogsFacts, ThreadFacts
from dflash_doctor.logs.held_lines import HeldLines
from dflash_doctor.logs.intake import TRIGGER, LineIntake
from dflash_doctor.logs.line_rules import RuleLines
from dflash_doctor.logs.lines import split_prefix, unwrap, without_record_prefix
from dflash_doctor.logs.logged import bracket_stream
from dflash_doctor.logs.next_steps import next_steps
from dflash_doctor.logs.options import LogOptions
from dflash_doctor.logs.scan_context import ScanContext, SpanReader
from dflash_doctor.logs.throughput import TOK_S
from dflash_doctor.logs.torchrun_findings import TorchrunSummaryReader
from dflash_doctor.logs.tracebacks import TracebackJudge
from dflash_doctor.rules.logs import LOG_THREAD_STALLED

BLOCK_GAP = 200  # lines after which an open block that stopped growing is closed (grep'd or interleaved logs)


class LogScanner:
    """One log, one pass: the public face of a scan (source.py and the tests use feed, feed_block, idle, restart,
    finish, lines); the parts behind it are built here and see each other only through the ScanContext."""

    def __init__(self, path: str, options: LogOptions = LogOptions()) -> None:
        self.path = path
        self.options = options
        context = ScanContext(path, options)
        self._context = context
        self._blocks = BlockParser()
        self._dumps = DumpReader(context)
        self._rules = RuleLines(context, self._dumps)  # (a bad --thread-pattern is refused here)
        self._summary = TorchrunSummaryReader(context, self._blocks, context.cursor.line_before)
        self._held = HeldLines(context)
        self._tracebacks = TracebackJudge(context, self._blocks)
        # what spans lines, in the order a line is offered to them (a summary's line is not a dump's)
        self._spans: Tuple[SpanReader, ...] = (self._summary, self._dumps)
        self._intake = LineIntake(context, self)

    # -- input ---------------------------------------------------------------------------------------------

    @property
    def lines(self) -> int:
        """The last line fed (source.py numbers the next block from it)."""
        return self._context.cursor.lines

    def feed(self, raw: bytes, lineno: int) -> List[Finding]:
        """One line (without its newline): the findings it completes. Every line is parsed."""
        return self._intake.feed(raw, lineno)

    def feed_block(self, block: bytes, lineno: int, end: Optional[int] = None) -> List[Finding]:
        """Whole lines, block[:end] (reader.iter_buffers), the first of them numbered `lineno`: the findings they
        complete. Small blocks are parsed in full; large ones through the prefilter and the progress sample."""
        return self._intake.feed_block(block, lineno, end)

    def busy(self) -> bool:
        """Something spans lines now: intake must hand over every line until it is closed."""
        return bool(self._blocks.active or self._held.busy() or any(span.is_open() for span in self._spans)
                    or self._context.deaths.record)

    def idle(self) -> List[Finding]:
        """The follower caught up with the writer: emit what is complete now instead of at the next line."""
        new = self._tracebacks.close(self._blocks.flush(ended_only=True))
        return new + self._held.flush_recompile()

    def restart(self) -> List[Finding]:
        """The followed file started over (rotated or truncated): what was open belongs to the old content."""
        new = self._tracebacks.close(self._blocks.flush()) + self._held.flush_recompile() + self._held.flush_abort()
        for span in self._spans:
            new += span.end()
        return new

    def finish(self) -> Report[LogsFacts]:
        context = self._context
        self.restart()
        self._held.report_at_end()
        self._tracebacks.report_at_end()
        for drop in context.progress.drops_at_end():
            context.drops([drop])
        context.deaths.demote_handled()
        self._held.merge_fatal_recompile()
        for stall in context.progress.stalls(exclude=context.deaths.workers()):
            context.emit(LOG_THREAD_STALLED, (stall.thread,),
                         f"thread {stall.thread} made no step progress after step {stall.last_step} while "
                         f"{stall.peer} advanced {stall.peer_advanced} steps",
                         stall.line, dict(thread=stall.thread, last_step=stall.last_step, peer=stall.peer,
                                          peer_advanced=stall.peer_advanced))
        report: Report[LogsFacts] = Report(command="logs", findings=list(context.emitted.findings))
        report.facts = self.facts()
        # (next_steps reads the threads as plain dicts, which they are)
        report.facts["next_steps"] = next_steps(report.findings, cast(Dict[str, dict], report.facts["threads"]))
        return report

    # -- one line ----------------------------------------------------------------------------------------------

    def line(self, raw: bytes, lineno: int) -> List[Finding]:
        """Parse one line (intake.LineParser): take its prefixes off, then hand it to what it belongs to."""
        cursor = self._context.cursor
        cursor.lineno = lineno
        new: List[Finding] = []
        self._context.deaths.enter_line(raw, lineno)
        if self._blocks.active and lineno - self._blocks.last_consumed > BLOCK_GAP:
            new += self._tracebacks.close(self._blocks.flush())
        stream, body = split_prefix(unwrap(raw), self._context.names)
        body = without_record_prefix(body)
        if stream is None and body[:1] == "[":
            stream, body = bracket_stream(body)  # '[gpu1] Traceback ...': the tag is the worker
        new += self._held.before_line(body, lineno)
        taken, found = self._spanning(body)
        new += found
        if taken:
            return new
        cut = body.find("Traceback (most", 1)
        if cut > 0 and TRIGGER(body[:cut].encode("utf-8", "replace")):
            # a line whose breaks were lost ('... failed (exitcode: 1) local_rank: 1 ... Traceback (most recent call
            # last): File ...'): what comes before the traceback is read as a line of its own
            new += self._rules.read(body[:cut], stream, lineno)
        closed, consumed = self._blocks.feed(body, lineno, stream)
        new += self._tracebacks.close(closed)
        if self._summary.starts(body, stream, lineno):
            return new
        if consumed:
            self._tracebacks.opened(body, stream, lineno)
        else:
            new += self._rules.read(body, stream, lineno)
        cursor.previous = body
        return new

    def _spanning(self, body: str) -> Tuple[bool, List[Finding]]:
        """Offer the line to what spans lines: (whether one took it, what the endings it caused found)."""
        new: List[Finding] = []
        for span in self._spans:
            taken, found = span.take(body)
            new += found
            if taken:
                return True, new
        return False, new

    # -- facts -----------------------------------------------------------------------------------------------

    def facts(self) -> LogsFacts:
        context = self._context
        deaths = context.deaths.workers()
        threads: Dict[str, ThreadFacts] = {}
        for name, state in context.progress.threads.items():
            threads[name] = {
                "last_step": state.last_step,
                "last_step_line": state.last_step_line,
                "last_tok_s": state.last_rate if state.rate_unit == TOK_S else None,
                "last_rate": state.last_rate,
                "rate_unit": state.rate_unit,
                "progress_lines": state.progress_lines,
                "died": deaths.get(name),
            }
        for name, death in deaths.items():
            threads.setdefault(name, {"last_step": None, "last_step_line": None, "last_tok_s": None,
                                      "last_rate": None, "rate_unit": None, "progress_lines": 0, "died": death})
        return {
            "path": self.path,
            "lines": context.cursor.lines,
            "bytes": context.cursor.bytes,
            "exceptions": self._tracebacks.exceptions,
            "threads": dict(sorted(threads.items())),
            "root_cause": self._summary.root_cause,
            "untracked_threads": context.progress.untracked_threads,
            "progress_sampled": context.cursor.sampled,
            "repeats": context.emitted.repeats(),
            "suppressed": context.emitted.suppressed,
        }
