"""LogScanner: one pass over a log producing DFD5xx findings as soon as they are certain.

Large blocks are not read line by line. The prefilter (prefilter.py) finds the lines holding a rule's trigger
word; the scanner parses those, and once one opens something that spans lines (a traceback, torchrun's summary, a
stack dump, a recompile warning) it parses every following line until that is closed. Throughput is sampled: the
last SAMPLE_BYTES of every block are parsed in full, which gives each worker's series a few samples per megabyte;
blocks of up to DENSE_BYTES (small logs, a followed file's new lines) are parsed in full, so small inputs give
exactly what line-by-line parsing gives. When a worker dies, its last progress line before the death is looked
up in the block, so 'last step' is exact even where progress was not sampled.

`feed`/`feed_block` return the findings a line completes (so `--follow` can show them live), `finish` the
Report. State is bounded (blocks.py, worker_progress.py, torchrun.py, stackdump.py) and findings are capped per rule.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Dict, Iterable, List, Optional, Tuple, cast

from dflash_doctor.findings import Finding, Report, Severity
from dflash_doctor.logs.facts import DeathFacts, LogsFacts, RootCauseFacts, ThreadFacts
from dflash_doctor.outcomes import FailureKind
from dflash_doctor.logs import patterns
from dflash_doctor.logs.next_steps import next_steps
from dflash_doctor.logs.blocks import BlockParser, ExceptionBlock, ExceptionRecord
from dflash_doctor.logs.emitted import EmittedFindings
from dflash_doctor.logs.lines import WorkerNames, split_prefix, thread_of, unwrap, without_record_prefix
from dflash_doctor.logs.logged import UNKNOWN_THREAD, bracket_stream, logged_by, ran_in_a_thread
from dflash_doctor.logs.options import LogOptions, compile_thread_pattern
from dflash_doctor.logs.prefilter import Prefilter
from dflash_doctor.logs.death_records import OpenRecord, one_line_death
from dflash_doctor.logs.worker_progress import TOTAL, DropEvent, ProgressTracker
from dflash_doctor.logs.stackdump import GDB_BACKTRACE, StackDumpParser, crash_context
from dflash_doctor.logs.throughput import IT_S, TOK_S, rate, step
from dflash_doctor.logs.torchrun import EXIT_FIELD, RANK_FIELD, Failure, SummaryParser
from dflash_doctor.rules.registry import Rule
from dflash_doctor.rules.logs import (
    ABORT_LINES,
    LOG_DENSE_ATTENTION_FALLBACK,
    LOG_KILLED_BY_SIGNAL,
    LOG_NCCL_WATCHDOG_ABORT,
    LOG_PROCESS_DIED,
    LOG_RECOMPILE_LIMIT,
    LOG_RULES,
    LOG_STACK_DUMP_HANG,
    LOG_THREAD_DIED,
    LOG_THREAD_STALLED,
    LOG_THROUGHPUT_DROP,
    SIGNAL_MEANING,
    UNNAMED,
    LineMemory,
    LogRule,
    RuleLine,
    gpu_in,
    trigger_words,
)

MAIN = UNNAMED  # lines that name no thread
BLOCK_GAP = 200  # lines after which an open block that stopped growing is closed (grep'd or interleaved logs)
RECOMPILE_LOOKAHEAD = 3  # the 'function:' line follows the recompile-limit line
MESSAGE_CHARS = 300
SAMPLE_BYTES = 8 * 1024  # parsed in full at the end of every large block (throughput samples)
DENSE_BYTES = 64 * 1024  # blocks up to this size are parsed in full
LOOKBACK_TRIES = 16  # lines holding a dead worker's name tried when looking back for its last step
MAX_HANDLED = 4096
BARE_MESSAGE_LINES = 3  # lines after a bare exception line that may still be its message
# The line before a traceback that says the program went on: CPython's unraisable hook, retry/recover loggers.
HANDLED = re.compile(r"(?i)\bexception ignored in\b|attempting to recover|\bretrying\b|\bwill retry\b"
                     r"|\brecovering\b|\bignor(?:ed|ing) (?:the |this )?(?:error|exception)")
EXPLAINED_LINES = 30  # a cut traceback starting this close after a fatal line of its worker is that death's
DUMP_GAP_LINES = 12  # a dump going on this close after the last one ended is the same dump, resumed
CRASH_DUMP_LINES = 4  # a faulthandler dump starting this close after 'Fatal Python error' is the crash's
LAUNCHER_WRAP_LINES = 3  # a launcher line wrapped by the terminal goes on within this many lines
DENSE_FRAMES = ("sdpa_dense", "math_attention", "sdpa_dense_backward")  # flex_attention's uncompiled path

FATAL_RULES: Tuple[LogRule, ...] = tuple(entry for entry in LOG_RULES.values() if entry.fatal and entry.pattern)
LINE_RULES: Tuple[LogRule, ...] = tuple(entry for entry in LOG_RULES.values() if entry.pattern is not None)
FATAL_CODES = frozenset(entry.rule.code for entry in FATAL_RULES)
_FAIL_ON_RECOMPILE = "FailOnRecompileLimitHit"
_FLAT_FILES = re.compile(r'File "([^"]+)"')  # frames of a traceback flattened onto one line
_EXPLAINING = frozenset(entry.rule.code for entry in FATAL_RULES if entry.explains_cut_traceback)
# Ray's exception for a dead actor lists what may have killed it ('There are some potential root causes. (1) The
# process is killed by SIGKILL by OOM killer ...'): guesses, not the exception's cause. (Its raylet's own line, 'A
# worker died or was killed ...', still reports the worker's death.)
_SPECULATION = "potential root causes"
PROGRESS_ROWS = patterns.PROGRESS_ROWS.findall
PROGRESS_HINT = patterns.PROGRESS_HINT.search
UNIT_BYTES = patterns.UNIT_BYTES


def _launcher_files(files: Iterable[str]) -> bool:
    """Files of torchrun's / torch.distributed.launch's agent reporting a failed child (not a death itself)."""
    # (not elastic/multiprocessing/errors: its @record wrapper is on the workers' own main functions too)
    return any("distributed/launcher/api.py" in file or "elastic/multiprocessing/api.py" in file
               or "elastic/agent/" in file or file.endswith(("/torchrun", "distributed/run.py"))
               for file in files)


def _trigger_regex() -> "re.Pattern[bytes]":
    words = sorted({w.encode() for w in trigger_words()}, key=len, reverse=True)
    return re.compile(b"|".join(re.escape(w) for w in words))


TRIGGER = _trigger_regex().search


def _may_matter(line: bytes) -> bool:
    """Whether an idle scanner must read a line it reads in full: a rule's word, progress, or a frame (it opens a
    traceback whose header was not pasted; the sampled path of large blocks does not look for those)."""
    return (bool(TRIGGER(line) or PROGRESS_HINT(line)) or b'File "' in line or line.startswith((b"(gdb) ", b"File "))
            or b"\xe2\x9d\xb1" in line)  # (rich's frame pointer)


_PREFILTER = Prefilter(trigger_words())


class LogScanner:
    def __init__(self, path: str, options: LogOptions = LogOptions()) -> None:
        self.path = path
        self.options = options
        self._thread_re = compile_thread_pattern(options.thread_pattern)
        self._default_threads = options.thread_pattern is None
        self._blocks = BlockParser()
        self._summary: Optional[SummaryParser] = None
        self._dump: Optional[StackDumpParser] = None
        self._dump_worker = MAIN
        self._last_dump: Optional[Tuple[str, int, StackDumpParser]] = None  # (worker, end line, dump): last dump
        self.memory = LineMemory()  # what the rules' line hooks keep from line to line
        self._previous: Optional[str] = None
        self._bare: Optional[Tuple[str, int, Optional[Finding]]] = None  # the last bare exception line's death
        self._record: Optional[OpenRecord] = None  # a thread's one-line death whose message may go on
        self._record_owner: Optional[str] = None  # the open record's thread, when the line being read is in it
        self._handled: set = set()  # start lines of tracebacks printed by a program that went on
        self._logged: Dict[int, str] = {}  # start lines of tracebacks a thread caught and logged -> that thread
        self._lineno = 0
        self._launcher_line = 0  # where torchrun's own traceback (cut) started, if it did
        self.progress = ProgressTracker(options.baseline_window, options.sustain, options.drop, options.stall_steps,
                                        unnamed=MAIN)
        self._emitted = EmittedFindings(path, options.max_findings_per_code)
        self._hooked: List[Finding] = []  # what a rule's hook reported for the line being parsed
        self._deaths: Dict[str, DeathFacts] = {}
        self._root_cause: Optional[RootCauseFacts] = None
        self._names = WorkerNames()
        self._where: Optional[Tuple[bytes, int, int]] = None  # (block, offset, line) of the line being parsed
        self.lines = 0
        self.bytes = 0
        self.exceptions = 0
        self.sampled = False  # some progress lines were skipped (large blocks)

    # -- input ---------------------------------------------------------------------------------------------

    def busy(self) -> bool:
        return bool(self._blocks.active or self.memory.held_recompile or self._summary or self._dump
                    or self.memory.held_abort or self._record)

    def feed(self, raw: bytes, lineno: int) -> List[Finding]:
        """One line (without its newline): the findings it completes. Every line is parsed."""
        self.lines = lineno
        self.bytes += len(raw) + 1
        self._where = None
        if not self.busy() and not _may_matter(raw):
            return []
        return self._line(raw, lineno)

    def feed_block(self, block: bytes, lineno: int, end: Optional[int] = None) -> List[Finding]:
        """Whole lines, block[:end] (reader.iter_buffers), the first of them numbered `lineno`: the findings they
        complete. Small blocks are parsed in full; large ones through the prefilter and the progress sample."""
        end = len(block) if end is None else end
        self.bytes += end
        if end <= DENSE_BYTES:
            new, line = self._dense(block, 0, end, lineno)
            self.lines = line - 1
            return new
        self.sampled = True
        window = block.rfind(b"\n", 0, end - SAMPLE_BYTES) + 1
        new, pos, line = self._prefiltered(block, window, lineno)
        if pos < window:
            line += block.count(b"\n", pos, window)
            pos = window
        found, line = self._dense(block, pos, end, line)
        self.lines = line - 1
        return new + found

    def _prefiltered(self, block: bytes, window: int, lineno: int) -> Tuple[List[Finding], int, int]:
        """The lines of block[:window] holding a trigger word, and every line while something spans lines:
        (findings, where it stopped, that line's number)."""
        starts = _PREFILTER.line_starts(block, window)
        new: List[Finding] = []
        pos, line, index = 0, lineno, 0
        while pos < window:
            if self.busy():
                pos, line = self._until_idle(block, pos, window, line, new)
                continue
            while index < len(starts) and starts[index] < pos:
                index += 1
            if index == len(starts) or starts[index] >= window:
                break
            start = starts[index]
            line += block.count(b"\n", pos, start)
            line_end = block.find(b"\n", start)
            self._where = (block, start, line)
            self.lines = line
            new += self._line(bytes(block[start:line_end]), line)
            pos, line = line_end + 1, line + 1
        return new, pos, line

    def _until_idle(self, block: bytes, pos: int, limit: int, line: int, new: List[Finding]) -> Tuple[int, int]:
        while pos < limit and self.busy():
            line_end = block.find(b"\n", pos)
            self._where = (block, pos, line)
            self.lines = line
            new += self._line(bytes(block[pos:line_end]), line)
            pos, line = line_end + 1, line + 1
        return pos, line

    def _dense(self, block: bytes, start: int, end: int, lineno: int) -> Tuple[List[Finding], int]:
        """Every line of block[start:end]: the usual progress lines through one findall, the rest the general
        way when they can matter."""
        new: List[Finding] = []
        region = bytes(block[start:end]) if start or end != len(block) or not isinstance(block, bytes) else block
        decoded = self._names.decoded
        record = self.progress.record
        offset = start
        if self._default_threads:
            rows = PROGRESS_ROWS(region)
        else:
            rows = [(line, b"", b"", b"", b"") for line in region.split(b"\n")[:-1]]
        idle = not self.busy()
        for line, thread, step_text, value, unit in rows:
            if thread and idle:
                name = decoded.get(thread) or self._names.decode(thread)
                drops = record(name, int(step_text), float(value) * UNIT_BYTES[unit], lineno, TOK_S)
                if drops:
                    new += self._drops(drops)
            elif not idle or _may_matter(line):
                self._where = (block, offset, lineno)
                self.lines = lineno
                new += self._line(line, lineno)
                idle = not self.busy()
            offset += len(line) + 1
            lineno += 1
        return new, lineno

    def idle(self) -> List[Finding]:
        """The follower caught up with the writer: emit what is complete now instead of at the next line."""
        new = self._close(self._blocks.flush(ended_only=True))
        return new + self._flush_recompile()

    def restart(self) -> List[Finding]:
        """The followed file started over (rotated or truncated): what was open belongs to the old content."""
        new = self._close(self._blocks.flush()) + self._flush_recompile() + self._flush_abort()
        new += self._end_summary() + self._end_dump()
        return new

    def finish(self) -> Report[LogsFacts]:
        self.restart()
        self._report_held_at_end()
        for drop in self.progress.drops_at_end():
            self._drops([drop])
        self._demote_handled()
        self._merge_fatal_recompile()
        for stall in self.progress.stalls(exclude=self._deaths):
            self._emit(LOG_THREAD_STALLED, (stall.thread,),
                       f"thread {stall.thread} made no step progress after step {stall.last_step} while "
                       f"{stall.peer} advanced {stall.peer_advanced} steps",
                       stall.line, dict(thread=stall.thread, last_step=stall.last_step, peer=stall.peer,
                                        peer_advanced=stall.peer_advanced))
        report: Report[LogsFacts] = Report(command="logs", findings=list(self._emitted.findings))
        report.facts = self.facts()
        # (next_steps reads the threads as plain dicts, which they are)
        report.facts["next_steps"] = next_steps(report.findings, cast(Dict[str, dict], report.facts["threads"]))
        return report

    def _report_held_at_end(self) -> None:
        """Lines held for what should have followed them, which did not come."""
        cut = self.memory.launcher_cut
        if cut is not None:
            entry = LOG_RULES[LOG_PROCESS_DIED.code]
            self._cause(entry, cut.details, cut.worker, cut.lineno, None)
            self._death(cut.worker, LOG_PROCESS_DIED.code, cut.lineno, cut.lineno, cut.details, exception=None,
                        message="", kind="process")
        header = self.memory.pyspy_header
        if header is not None:
            self._emit(LOG_STACK_DUMP_HANG, (header.lineno,), f"{header.worker}: py-spy dump of a stuck process (its "
                       "threads were not pasted)", header.lineno, dict(thread=header.worker, threads=[]))
        if self._launcher_line and not self._deaths:
            # the launcher's traceback, cut, and nothing else says which worker failed: the run still died
            self._emit(LOG_PROCESS_DIED, (MAIN, "launcher"),
                       f"{MAIN}: the launcher (torchrun / torch.distributed.launch) reported a failed worker; the "
                       "worker's own output is not in the log", self._launcher_line,
                       dict(thread=MAIN, launcher=True))

    # -- one line ----------------------------------------------------------------------------------------------

    def _line(self, raw: bytes, lineno: int) -> List[Finding]:
        self._lineno = lineno
        new: List[Finding] = []
        self._record_owner = None
        if self._record is not None:
            if self._record.holds(raw, lineno):
                self._record_owner = self._record.thread
            else:
                self._record = None
        if self._blocks.active and lineno - self._blocks.last_consumed > BLOCK_GAP:
            new += self._close(self._blocks.flush())
        stream, body = split_prefix(unwrap(raw), self._names)
        body = without_record_prefix(body)
        if stream is None and body[:1] == "[":
            stream, body = bracket_stream(body)  # '[gpu1] Traceback ...': the tag is the worker
        if self.memory.held_recompile is not None:
            new += self._recompile_lookahead(body)
        held = self.memory.held_abort
        if held is not None and lineno - held.lineno > ABORT_LINES:
            new += self._flush_abort()
        taken, found = self._spanning(body)
        new += found
        if taken:
            return new
        cut = body.find("Traceback (most", 1)
        if cut > 0 and TRIGGER(body[:cut].encode("utf-8", "replace")):
            # a line whose breaks were lost ('... failed (exitcode: 1) local_rank: 1 ... Traceback (most recent call
            # last): File ...'): what comes before the traceback is read as a line of its own
            new += self._free(body[:cut], stream, lineno)
        closed, consumed = self._blocks.feed(body, lineno, stream)
        new += self._close(closed)
        if self._summary_starts(body, stream, lineno):
            return new
        if consumed:
            self._block_line(body, stream, lineno)
        else:
            new += self._free(body, stream, lineno)
        self._previous = body
        return new

    def _spanning(self, body: str) -> Tuple[bool, List[Finding]]:
        """Feed torchrun's summary or a stack dump being read: (whether it took the line, what ending it found)."""
        new: List[Finding] = []
        if self._summary is not None:
            if self._summary.feed(body):
                return True, self._end_summary() if self._summary.done else []
            new += self._end_summary()
        if self._dump is not None:
            if self._dump.feed(body):
                return True, new + (self._end_dump() if self._dump.done else [])
            new += self._end_dump()
        return False, new

    def _summary_starts(self, body: str, stream: Optional[str], lineno: int) -> bool:
        """Start reading torchrun's summary when this line opens one; True when the line is then done with."""
        if "ChildFailedError" in body or "Root Cause (first observed failure)" in body:
            # torchrun's summary follows (or this is its root-cause section, grep'd): parse it, not the block's
            self._blocks.end_message(stream)
            self._summary = SummaryParser(lineno)
            self._summary.feed(body)
        elif self._summary is None and EXIT_FIELD.match(body):
            self._summary = SummaryParser(lineno)  # a summary pasted from its middle
            previous = self._line_before()
            if previous is not None and RANK_FIELD.match(previous):
                self._summary.feed(previous)
            self._summary.feed(body)
            return True
        return False

    def _block_line(self, body: str, stream: Optional[str], lineno: int) -> None:
        """A line a traceback block took: when it opens one, whose it is and whether the program went on."""
        opened = patterns.THREAD_EXCEPTION.match(body) if body.startswith(patterns.THREAD_HEADER_STARTS) else None
        if opened is not None:
            self._look_back(opened.group("thread"))
        elif patterns.TRACEBACK_START.search(body):
            before = self._line_before()
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
                self._look_back(stream)

    def _free(self, body: str, stream: Optional[str], lineno: int) -> List[Finding]:
        """A line outside any block: progress, or one rule's line."""
        worker = stream or thread_of(body, self._thread_re, self._default_threads)
        if worker == MAIN and self._record_owner is not None:
            worker = self._record_owner  # the message of a thread's one-line death, going on
        new: List[Finding] = []
        found = rate(body)
        steps = step(body)
        if found is not None or steps is not None:
            value, unit = found if found is not None else (None, TOK_S)
            if unit == IT_S and value is not None and self.options.tokens_per_it:
                value, unit = value * self.options.tokens_per_it, TOK_S
            if stream is None and worker != MAIN:
                self._names.tag(worker, f"[{worker}]".encode())
            new = self._drops(self.progress.record(worker, steps, value, lineno, unit))
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

    def _one_line_death(self, death: "re.Match[str]", stream: Optional[str], lineno: int) -> List[Finding]:
        """'Exception in thread NAME: Type: message' that no rule explains: NAME died of it, unless the record's
        next lines name a cause (then that cause supersedes this finding, as for a bare exception line)."""
        worker = stream if stream is not None and stream.startswith("rank") else death.group("thread")
        self._record = OpenRecord(worker, lineno)
        message = (death.group("message") or "").strip()
        said = f": {_first_line(message)}" if message else ""
        new = self._emit(LOG_THREAD_DIED, (worker,), f"thread {worker} died: {death.group('type')}{said}"
                         [:MESSAGE_CHARS], lineno, dict(thread=worker, exception=death.group("type"),
                                                        block_line=lineno, last_step=self._last_step(worker)))
        self._death(worker, LOG_THREAD_DIED.code, lineno, lineno, {}, exception=death.group("type"),
                    message=message, kind="thread")
        self._bare = (worker, lineno, new[0] if new else None)
        return new

    def _rule_line(self, entry: LogRule, line: RuleLine) -> List[Finding]:
        """A line the rule's pattern matched: its hooks first, then its finding (and the death it reports)."""
        if entry.on_match is not None:
            entry.on_match(self, line)
            return self._take_hooked()
        details = entry.details(line.match, line.body)
        worker = self._names.worker_for(line.worker, details, line.stream)
        worker = self._launcher_resumed(worker, line)
        if entry.worker_of is not None:
            worker = entry.worker_of(details) or worker
        if entry.on_line is not None:
            hooked = entry.on_line(self, replace(line, worker=worker), details)
            if hooked is None:
                return self._take_hooked()
            worker = hooked
        body, lineno = line.body, line.lineno
        death = one_line_death(body)
        died = entry.line_is_death or death is not None or patterns.EXCEPTION_LINE.match(body.strip()) is not None
        if death is not None:
            self._record = OpenRecord(worker, lineno)
        if self._bare is not None and entry.fatal and not entry.line_is_death:  # a cause, not another death
            self._supersede_bare(worker, lineno, entry.rule.code)
        new = self._cause(entry, details, worker, lineno, None)
        if details.get("exception"):
            self._bare = (worker, lineno, new[0] if new else None)
        if death is not None:  # a logged excepthook's line: a thread died, of the exception the line names
            self._death(worker, entry.rule.code, lineno, lineno, details, exception=death.group("type"),
                        message=(death.group("message") or "").strip(), kind="thread")
        elif died:
            self._death(worker, entry.rule.code, lineno, lineno, details, exception=_exception_type(body),
                        message=body.strip(), kind=entry.death_kind)
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

    # -- what the rules' hooks use (rules/logs.py RuleScanner) ---------------------------------------------------

    def report(self, rule: Rule, key: tuple, message: str, lineno: int, evidence: Dict[str, Any]) -> None:
        self._hooked += self._emit(rule, key, message, lineno, evidence)

    def is_dead(self, worker: str) -> bool:
        return worker in self._deaths

    def line_before(self) -> Optional[str]:
        """The line just before the one being parsed (read from the block: the scanner may have skipped it)."""
        return self._line_before()

    def start_dump(self, lineno: int, stream: Optional[str], text: str) -> None:
        fatal_line = self.memory.fatal_error_line
        crash = crash_context(self._previous) or (
            fatal_line is not None and lineno - fatal_line <= CRASH_DUMP_LINES)
        self._dump = StackDumpParser(lineno, crash=crash)
        worker = stream or MAIN
        last = self._last_dump
        if last is not None and last[0] == worker and lineno - last[1] <= DUMP_GAP_LINES:
            # the same dump, interrupted by a line it does not know or by the paster's prose between two fences
            self._dump.start_line, self._dump.threads = last[2].start_line, last[2].threads
        self._dump_worker = worker
        self._dump.feed(text)

    def _supersede_bare(self, worker: str, lineno: int, code: str) -> None:
        """'RuntimeError: TensorStorage ...' then 'cuda failed with error 2 out of memory': the exception's message
        went on to the next lines, which name the cause; the bare exception's finding gives way to it."""
        bare_worker, bare_line, finding = self._bare or (None, 0, None)
        self._bare = None
        in_record = self._record_owner == worker and self._record is not None and self._record.line == bare_line
        if bare_worker != worker or not (0 < lineno - bare_line <= BARE_MESSAGE_LINES or in_record):
            return
        if finding is not None:
            self._emitted.withdraw(finding, (worker,))
        death = self._deaths.get(worker)
        if death is None or death["line"] != bare_line:
            return
        if in_record:
            self._deaths[worker]["code"] = code  # the thread died on its record's first line, of this cause
        else:
            del self._deaths[worker]

    def _line_before(self) -> Optional[str]:
        if self._where is None:
            return self._previous
        block, offset, _ = self._where
        if offset == 0:
            return self._previous
        start = block.rfind(b"\n", 0, offset - 1) + 1
        return bytes(block[start:offset - 1]).decode("utf-8", "replace").rstrip("\r")

    # -- classification --------------------------------------------------------------------------------------

    def _drops(self, drops: List[DropEvent]) -> List[Finding]:
        new: List[Finding] = []
        for drop in drops:
            who = "all workers together" if drop.thread == TOTAL else drop.thread
            how = " by the end of the log" if drop.at_end else ""
            new += self._emit(
                LOG_THROUGHPUT_DROP, (drop.thread, drop.unit, drop.from_line),
                f"{who}: throughput fell from {drop.baseline:,.0f} to {drop.level:,.0f} {drop.unit} "
                f"({100 * (1 - drop.level / drop.baseline):.0f} % lower) from line {drop.from_line}{how}",
                drop.from_line, {"thread": drop.thread, "unit": drop.unit, "from": drop.baseline, "to": drop.level,
                                 "from_line": drop.from_line, "sustained_at_line": drop.line, "at_end": drop.at_end})
        return new

    def _close(self, blocks: List[ExceptionBlock]) -> List[Finding]:
        new: List[Finding] = []
        starts = {b.start_line for b in blocks if b.stream is not None}
        for block in blocks:
            self.exceptions += 1
            if block.stream is None and block.thread is None and not block.stack.frames and not block.exceptions \
                    and block.start_line + 1 in starts:
                continue  # a bare 'Traceback' header whose frames came behind a rank's prefix: that rank's block
            new += self._block(block)
        return new

    def _block(self, block: ExceptionBlock) -> List[Finding]:
        """A traceback, closed: the cause its exceptions name, or a death no rule explains."""
        worker = (block.stream or block.thread or MAIN) if block.process else (block.thread or block.stream or MAIN)
        final = block.final
        if block.start_line in self._handled:
            return self._handled_block(block, worker)
        if block.start_line in self._logged:
            return self._logged_block(block, self._logged[block.start_line])
        in_a_thread = block.thread is None and block.stream is None and ran_in_a_thread(
            f.file for f in block.stack.frames)
        if in_a_thread:
            worker = UNKNOWN_THREAD  # a thread's traceback whose header was not pasted: not the main thread
        if final is not None and final.type.endswith("ChildFailedError"):
            return []  # torchrun's own traceback: its summary (torchrun.py) names the rank that failed
        new, worker, cause = self._block_causes(block, worker)
        new += self._dense_frames(block, worker)
        if final is None and block.thread is None and (_launcher_files(f.file for f in block.stack.frames)
                                                       or _launcher_files(_FLAT_FILES.findall(block.lead))):
            self._launcher_line = self._launcher_line or block.start_line
            return new  # torchrun's own traceback: its summary names the rank that failed
        thread_death = (block.thread is not None and not block.process) or in_a_thread
        if cause is None and final is None and self._explained(worker, block.start_line):
            return new  # a traceback cut before its exception, after a line that already said how this worker died
        if cause is None:
            new += self._unexplained_death(block, worker, thread_death)
            cause = (LOG_THREAD_DIED.code if thread_death else LOG_PROCESS_DIED.code, {})
        code, details = cause
        innermost = block.stack.innermost
        self._death(worker, code, final.line if final else block.start_line, block.start_line, details,
                    exception=final.type if final else None, message=final.message if final else "",
                    kind="thread" if thread_death else "process",
                    last_frame=innermost.where() if innermost else None)
        return new

    def _block_causes(self, block: ExceptionBlock, worker: str
                      ) -> Tuple[List[Finding], str, Optional[Tuple[str, Dict[str, Any]]]]:
        """(findings, the worker, the first cause) of what the block's exceptions (or its lead) name."""
        new: List[Finding] = []
        cause: Optional[Tuple[str, Dict[str, Any]]] = None
        messages = [(f"{exc.type}: {exc.message}" if exc.message else exc.type, exc.line) for exc in block.exceptions]
        for text, line in messages or ([(block.lead, block.start_line)] if block.lead else []):
            text = text.split(_SPECULATION, 1)[0]
            for entry in FATAL_RULES:
                match = entry.pattern.search(text) if entry.pattern is not None else None
                if match is None or (entry.explains_block is not None and not entry.explains_block(
                        match, block.thread is not None, tuple(f.function for f in block.stack.frames))):
                    continue
                details = entry.details(match, text)
                worker = self._names.worker_for(worker, details, block.stream)
                worker = (entry.worker_of(details) if entry.worker_of is not None else None) or worker
                new += self._cause(entry, details, worker, line, block)
                cause = cause or (entry.rule.code, details)
                break
        return new, worker, cause

    def _dense_frames(self, block: ExceptionBlock, worker: str) -> List[Finding]:
        dense = [f for f in block.stack.frames if f.function in DENSE_FRAMES]
        if not dense:
            return []
        final = block.final
        return self._emit(LOG_DENSE_ATTENTION_FALLBACK, (),
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
            said = f": {_first_line(final.message)}" if final.message else ""
            message = f"{what} died: {final.type}{said}"[:MESSAGE_CHARS]
        return self._emit(rule, (worker,), message, final.line if final else block.start_line,
                          dict(thread=worker, exception=final.type if final else None,
                               block_line=block.start_line, last_step=self._last_step(worker)))

    def _explained(self, worker: str, line: int) -> bool:
        """Whether a fatal finding for `worker` came shortly before `line` ('THCudaCheck FAIL ... device-side assert
        triggered', then the traceback it raised, cut)."""
        # (not a signal: a process killed by one prints no traceback after it; SIGINT's or SIGTERM's traceback is
        # the process's own record of its end, reported as such)
        if worker in self._deaths:
            return self._deaths[worker]["kind"] != "signal"
        return any(f.evidence.get("thread") == worker and f.line is not None and 0 <= line - f.line <= EXPLAINED_LINES
                   and f.code in _EXPLAINING for f in self._emitted.findings[-8:])

    def _logged_block(self, block: ExceptionBlock, thread: str) -> List[Finding]:
        """A traceback a thread caught and logged (its logger record names it on the line before): an error of
        that thread, not its death; a named cause is reported for it, nothing else."""
        new: List[Finding] = []
        for exc in block.exceptions:
            text = f"{exc.type}: {exc.message}" if exc.message else exc.type
            entry = next((e for e in FATAL_RULES if e.pattern is not None and e.pattern.search(text)), None)
            if entry is None or entry.rule.code == LOG_PROCESS_DIED.code:
                continue
            match = entry.pattern.search(text) if entry.pattern is not None else None
            details = entry.details(match, text) if match is not None else {}
            new += self._emit(entry.rule, (thread, "logged", exc.line),
                              f"{thread}: {entry.message(details)} (caught and logged by {thread}: an error of that "
                              "thread, not its death)"[:MESSAGE_CHARS], exc.line,
                              dict(details, thread=thread, block_line=block.start_line, caught=True,
                                   last_step=self._last_step(thread)))
        return new

    def _handled_block(self, block: ExceptionBlock, worker: str) -> List[Finding]:
        """A traceback the program printed and went on from ('Exception ignored in:', '... attempting to recover'):
        no death; a named cause is still reported, as a warning."""
        new: List[Finding] = []
        for exc in block.exceptions:
            text = f"{exc.type}: {exc.message}" if exc.message else exc.type
            entry = next((e for e in FATAL_RULES if e.pattern is not None and e.pattern.search(text)), None)
            if entry is not None and entry.rule.code != LOG_PROCESS_DIED.code:
                match = entry.pattern.search(text) if entry.pattern is not None else None
                details = entry.details(match, text) if match is not None else {}
                new += self._emit(entry.rule, (worker, "handled", exc.line),
                                  f"{worker}: {entry.message(details)} (handled: the log says it went on)"[:MESSAGE_CHARS],
                                  exc.line, dict(details, thread=worker, block_line=block.start_line, survived=True),
                                  severity=Severity.WARNING)
        return new

    def _cause(self, entry: LogRule, details: Dict[str, Any], worker: str, line: int,
               block: Optional[ExceptionBlock]) -> List[Finding]:
        evidence = dict(details, thread=worker, block_line=block.start_line if block else None,
                        last_step=self._last_step(worker))
        return self._emit(entry.rule, entry.finding_key(worker, details),
                          f"{worker}: {entry.message(details)}"[:MESSAGE_CHARS * 2], line, evidence,
                          severity=entry.severity_of(details))

    def _death(self, worker: str, code: str, line: int, block_line: int, details: Dict[str, Any], *,
               exception: Optional[str], message: str, kind: str, last_frame: Optional[str] = None) -> None:
        if worker in self._deaths or len(self._deaths) >= self.progress.max_threads:
            return
        if line == self.lines:
            self._look_back(worker)
        gpu = details.get("gpu")
        if gpu is None and message:
            gpu = gpu_in(message)
        self._deaths[worker] = {
            "line": line, "block_line": block_line, "exception": exception,
            "message": _first_line(message)[:MESSAGE_CHARS], "code": code, "last_frame": last_frame,
            "last_step": self._last_step(worker), "gpu": gpu, "signal": details.get("signal"), "kind": kind,
            "root_cause": False,
        }

    def _look_back(self, worker: str) -> None:
        """Where progress was sampled, find the worker's last progress line before the line being parsed (its
        traceback's first line, or the line saying it died) in this block."""
        if self._where is None or worker == MAIN:
            return
        tag = self._names.tags.get(worker) or f"[{worker}]".encode("utf-8", "replace")
        block, offset, line = self._where
        state = self.progress.threads.get(worker)
        hit = block.rfind(tag, 0, offset)
        for _ in range(LOOKBACK_TRIES):
            if hit < 0:
                return
            start = block.rfind(b"\n", 0, hit) + 1
            end = block.find(b"\n", hit)
            hit_line = line - block.count(b"\n", start, offset)
            if state is not None and state.last_line >= hit_line:
                return
            text = block[start:end].decode("utf-8", "replace")
            found, steps = rate(text), step(text)
            if found is not None or steps is not None:
                value, unit = found if found is not None else (None, TOK_S)
                self.progress.record(worker, steps, value, hit_line, unit)
                return
            hit = block.rfind(tag, 0, start)

    def _last_step(self, worker: str) -> Optional[int]:
        state = self.progress.threads.get(worker)
        return state.last_step if state else None

    # -- what spans lines --------------------------------------------------------------------------------------

    def _recompile_lookahead(self, body: str) -> List[Finding]:
        held = self.memory.held_recompile
        if held is None:
            return []
        match = re.search(r"function: '(?P<function>[^']+)' \((?P<where>[^)]*)\)", body)
        held.lines_seen += 1
        if match:
            held.function = f"{match.group('function')} ({match.group('where')})"
        elif held.lines_seen < RECOMPILE_LOOKAHEAD:
            return []
        return self._flush_recompile()

    def _flush_recompile(self) -> List[Finding]:
        held, self.memory.held_recompile = self.memory.held_recompile, None
        if held is None:
            return []
        details = {k: held.details[k] for k in ("limit", "limit_value", "fatal", "why")}
        details["function"] = held.function
        entry = LOG_RULES[LOG_RECOMPILE_LIMIT.code]
        return self._emit(LOG_RECOMPILE_LIMIT, (held.function or held.worker,),
                          entry.message(details), held.lineno, dict(details, thread=held.worker))

    def _flush_abort(self) -> List[Finding]:
        """A 'terminate called' line no rank claimed within ABORT_LINES: the process's own abort."""
        held, self.memory.held_abort = self.memory.held_abort, None
        if held is None:
            return []
        entry = LOG_RULES[LOG_NCCL_WATCHDOG_ABORT.code]
        new = self._cause(entry, held.details, MAIN, held.lineno, None)
        self._death(MAIN, entry.rule.code, held.lineno, held.lineno, held.details,
                    exception=None, message=held.body.strip(), kind="process")
        return new

    def _merge_fatal_recompile(self) -> None:
        """With fullgraph=True the limit warning is followed by FailOnRecompileLimitHit: one fatal finding, not a
        warning that says 'runs eagerly' beside it."""
        fatal = [f for f in self._emitted.findings if f.code == LOG_RECOMPILE_LIMIT.code and f.evidence.get("fatal")]
        if not fatal:
            return
        warnings = [f for f in self._emitted.findings
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
        kept = [f for f in self._emitted.findings if f.code != LOG_RECOMPILE_LIMIT.code]
        self._emitted.findings = kept + merged

    def _end_summary(self) -> List[Finding]:
        summary, self._summary = self._summary, None
        if summary is None:
            return []
        root = summary.root or next((f for f in summary.failures if f.rank is not None), None)
        # a root cause cut before its exit code explains nothing: the failures shown in full are reported instead
        root_cut = root is not None and root.exitcode is None and not root.traceback
        new: List[Finding] = []
        if (root is None or root.rank is None) and summary.script:
            # cut before the failure's rank: torchrun still said the script failed
            details = {"script": summary.script}
            new += self._emit(LOG_PROCESS_DIED, (MAIN, "summary"),
                              f"{MAIN}: {summary.script} failed under torchrun (its summary was cut before it named "
                              "the rank and exit code)", summary.start_line, dict(details, thread=MAIN))
            self._death(MAIN, LOG_PROCESS_DIED.code, summary.start_line, summary.start_line, details,
                        exception=None, message=f"{summary.script} FAILED", kind="process")
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
            elif worker not in self._deaths:
                self._death(worker, LOG_KILLED_BY_SIGNAL.code if failure.signal else LOG_PROCESS_DIED.code,
                            summary.start_line, summary.start_line, {"signal": failure.signal},
                            exception=None, message=_failure_words(failure), kind="collateral")
        if root is not None:
            self._root_cause = {**root.to_dict(), "line": summary.start_line}
        return new

    def _root_failure(self, root: Failure, summary: SummaryParser, worker: str, first: bool = True) -> List[Finding]:
        text = root.text()
        others = [f.to_dict() for f in summary.failures if f is not root]
        common = {"root_cause": first, "exitcode": root.exitcode, "host": root.host, "pid": root.pid,
                  "other_failures": others}
        new: List[Finding] = []
        if worker in self._deaths:
            self._deaths[worker]["root_cause"] = first
            return new
        for entry in FATAL_RULES:
            match = entry.pattern.search(text) if entry.pattern is not None else None
            if match is not None:
                details = dict(entry.details(match, text), **common)
                new += self._cause(entry, details, worker, summary.start_line, None)
                self._death(worker, entry.rule.code, summary.start_line, summary.start_line, details,
                            exception=_exception_type(text.splitlines()[-1]) if text else None,
                            message=text.splitlines()[-1] if text else "", kind="process")
                break
        else:
            if root.signal:
                details = dict(common, signal=root.signal, meaning=SIGNAL_MEANING.get(root.signal, ""))
                entry = LOG_RULES[LOG_KILLED_BY_SIGNAL.code]
                new += self._cause(entry, details, worker, summary.start_line, None)
                self._death(worker, LOG_KILLED_BY_SIGNAL.code, summary.start_line, summary.start_line, details,
                            exception=None, message=_failure_words(root), kind="signal")
            else:
                said = "failed first" if first else "failed (torchrun's summary; its root cause is not in the log)"
                new += self._emit(LOG_PROCESS_DIED, (worker,), f"{worker}: {said} ({_failure_words(root)})",
                                  summary.start_line,
                                  dict(common, thread=worker, last_step=self._last_step(worker)))
                self._death(worker, LOG_PROCESS_DIED.code, summary.start_line, summary.start_line, common,
                            exception=None, message=_failure_words(root), kind="process")
        if worker in self._deaths and first:
            self._deaths[worker]["root_cause"] = True
        return new

    def _end_dump(self) -> List[Finding]:
        dump, self._dump = self._dump, None
        if dump is not None and dump.crash:
            self.memory.fatal_error_line = self._lineno  # a crash dump cut by an odd line may go on after it
        if dump is None or dump.crash or not dump.threads:
            return []
        self._last_dump = (self._dump_worker, self._lineno, dump)
        diagnosis = dump.diagnosis()
        threads = dump.summary()
        deadlock = diagnosis.kind == FailureKind.DEADLOCK
        if deadlock:
            message = f"{self._dump_worker}: stack dump shows a deadlock: {diagnosis.summary()}"
        else:
            idle = sum(1 for t in dump.threads if t.status.startswith("idle"))
            where = "; ".join(f"{t['thread']} at {t['at']}" for t in threads[:4] if t["at"])
            message = (f"{self._dump_worker}: stack dump of a stuck process, {len(threads)} thread(s), {idle} idle"
                       + (f": {where}" if where else ""))
        evidence = dict(thread=self._dump_worker, cycle=diagnosis.cycle, chain=list(diagnosis.chain), threads=threads,
                        hint=diagnosis.hint)
        severity = Severity.ERROR if deadlock else None
        found = self._emitted.findings
        earlier = next((i for i, f in enumerate(found) if f.code == LOG_STACK_DUMP_HANG.code
                        and f.line == dump.start_line), None)
        if earlier is not None:  # the rest of a dump already reported: the finding now covers all of it
            found[earlier] = replace(found[earlier], message=message[:MESSAGE_CHARS * 2], evidence=evidence,
                                     severity=severity or LOG_STACK_DUMP_HANG.severity)
            return []
        return self._emit(LOG_STACK_DUMP_HANG, (dump.start_line,), message[:MESSAGE_CHARS * 2], dump.start_line,
                          evidence, severity=severity)

    def _demote_handled(self) -> None:
        """A worker that logs progress after its traceback only logged a handled error: not dead."""
        for worker, death in list(self._deaths.items()):
            if death["kind"] != "process":
                continue
            state = self.progress.threads.get(worker)
            if state is None or state.last_line <= death["line"]:
                continue
            del self._deaths[worker]
            kept = []
            for finding in self._emitted.findings:
                if finding.evidence.get("thread") != worker or finding.line is None or finding.line > state.last_line:
                    kept.append(finding)
                elif finding.code == LOG_PROCESS_DIED.code:
                    continue
                elif finding.code in FATAL_CODES:
                    kept.append(replace(finding, severity=Severity.WARNING,
                                        message=f"{finding.message} (handled: {worker} logged progress after it)",
                                        evidence=dict(finding.evidence, survived=True)))
                else:
                    kept.append(finding)
            self._emitted.findings = kept

    def _emit(self, rule: Rule, key: tuple, message: str, line: int, evidence: Dict[str, Any],
              severity: Optional[Severity] = None) -> List[Finding]:
        return self._emitted.emit(rule, key, message, line, evidence, severity)

    # -- facts -----------------------------------------------------------------------------------------------

    def facts(self) -> LogsFacts:
        threads: Dict[str, ThreadFacts] = {}
        for name, state in self.progress.threads.items():
            threads[name] = {
                "last_step": state.last_step,
                "last_step_line": state.last_step_line,
                "last_tok_s": state.last_rate if state.rate_unit == TOK_S else None,
                "last_rate": state.last_rate,
                "rate_unit": state.rate_unit,
                "progress_lines": state.progress_lines,
                "died": self._deaths.get(name),
            }
        for name, death in self._deaths.items():
            threads.setdefault(name, {"last_step": None, "last_step_line": None, "last_tok_s": None,
                                      "last_rate": None, "rate_unit": None, "progress_lines": 0, "died": death})
        return {
            "path": self.path,
            "lines": self.lines,
            "bytes": self.bytes,
            "exceptions": self.exceptions,
            "threads": dict(sorted(threads.items())),
            "root_cause": self._root_cause,
            "untracked_threads": self.progress.untracked_threads,
            "progress_sampled": self.sampled,
            "repeats": self._emitted.repeats(),
            "suppressed": self._emitted.suppressed,
        }


def _first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def _exception_type(line: str) -> Optional[str]:
    match = patterns.EXCEPTION_LINE.match(line.strip())
    return match.group("type") if match else None


def _failure_words(failure: Failure) -> str:
    if failure.signal:
        return f"killed by {failure.signal}"
    if failure.exitcode is not None:
        return f"exit code {failure.exitcode}"
    return "failed"
