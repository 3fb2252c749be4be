"""Traceback blocks: `Exception in thread NAME:` / `Traceback ...` up to the exception line(s) that end them.

Works on full logs and on grep'd excerpts (the seeds' three lines have no 'Traceback' line). Lines are routed by
stream: each '[rankN]:' prefix (torchrun, torch >= 2.2) has its own parser, so tracebacks of ranks that died
together never mix. Within the unprefixed stream, Python's threading.excepthook writes its header in pieces: two
threads dying at once print 'Exception in thread Exception in thread A:', A's traceback, then 'B:' alone and
B's traceback, or two headers before the first traceback; both are attributed to the right thread. An exception
message that continues on the next lines ('BackendCompilerFailed: ... raised:' then 'OutOfResources: ...') is
kept with its exception until a blank line or the next log record. Frames are kept in a bounded deque.
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Tuple

from dflash_doctor.logs import patterns
from dflash_doctor.logs.frames import Frame, Stack
from dflash_doctor.logs.interleave import has_glue, untangle

MAX_FRAMES = 32
MAX_CHAINED = 4
MAX_CONTINUATION = 20  # message lines kept after an exception line
MAX_STREAMS = 256
MAX_WAITING = 16  # thread headers whose traceback has not started yet


def _flush_left_frame(text: str) -> "Optional[re.Match[str]]":
    """A frame pasted without its indentation, or IPython 8's 'File ~/x.py:113, in f'."""
    if not text.startswith("File "):
        return None
    return patterns.UNINDENTED_FRAME.match(text) or patterns.IPYTHON_FRAME.match(text)


# What a traceback line is, for telling two tracebacks printed at the same time apart: each writer's lines come in
# their grammar's order (a frame after the header or a source line, a source line after a frame, the exception
# after either), so a line goes to a traceback that expects it.
_TRACEBACK, _FRAME, _SOURCE, _EXCEPTION = "traceback", "frame", "source", "exception"
_EXPECTS = {_FRAME: (_TRACEBACK, _SOURCE, _FRAME), _SOURCE: (_FRAME, _SOURCE), _EXCEPTION: (_FRAME, _SOURCE)}
# What a writer certainly prints next: one source line after a frame (Python 3.11 prints one; a caret line is not
# counted), a frame or the exception after a source line. Tried first when several tracebacks could take a line.
_NEXT = {_FRAME: (_TRACEBACK, _SOURCE), _SOURCE: (_FRAME,), _EXCEPTION: (_SOURCE, _FRAME)}


DYNAMO_USER_CODE = "from user code:"


def _caret_line(text: str) -> bool:
    """Python 3.11's '    ~~~^^^' under a source line: decoration, nobody's next line in particular."""
    return "^" in text and not text.strip(" ~^")


def _line_kind(text: str) -> Optional[str]:
    if text.lstrip(" ").startswith("File ") and patterns.FRAME.match(text) or _flush_left_frame(text):
        return _FRAME
    if text.startswith(("    ", "\t")):
        return None if _caret_line(text) else _SOURCE
    if patterns.EXCEPTION_LINE.match(text):
        return _EXCEPTION
    return None


def _frame(match: "re.Match[str]") -> Frame:
    return Frame(match.group("file"), int(match.group("line")), match.group("func") or "?")


def _rich_pointer(text: str) -> bool:
    """rich's '│ ❱ 1024 │' line: a boxed frame's current line."""
    return text.startswith("\u2502") and patterns.RICH_POINTER.match(text) is not None


@dataclass(frozen=True)
class ExceptionRecord:
    type: str
    message: str  # the exception line's message and any continuation lines, joined by newlines
    line: int


@dataclass(frozen=True)
class ExceptionBlock:
    thread: Optional[str]  # from 'Exception in thread NAME:' or 'Process NAME:'; None for a plain traceback
    stream: Optional[str]  # the '[rankN]:' prefix it came with, if any
    start_line: int
    stack: Stack  # the innermost MAX_FRAMES frames
    exceptions: Tuple[ExceptionRecord, ...]  # chained ones first, the one that ended the block last

    process: bool = False  # the header was multiprocessing's 'Process NAME:' (a child process died)
    lead: str = ""  # text before 'Traceback' on its line: a logger's message, which may name the error

    @property
    def final(self) -> Optional[ExceptionRecord]:
        return self.exceptions[-1] if self.exceptions else None


@dataclass
class _Open:
    thread: Optional[str]
    stream: Optional[str]
    start_line: int
    process: bool = False
    frames: Deque[Frame] = field(default_factory=lambda: deque(maxlen=MAX_FRAMES))  # as printed: innermost last
    exceptions: List[ExceptionRecord] = field(default_factory=list)
    started: bool = False  # a Traceback line or a frame came (a header alone has not started)
    ended: bool = False  # an exception line came; a chain marker or a new Traceback may still continue it
    chained: bool = False
    continuation: int = 0  # message lines taken after the exception line; -1 once the message is closed
    announced: Optional[str] = None  # the type an IPython header gives up front, for a paste cut before its end
    lead: str = ""
    last: str = ""  # the kind of the last line it took (_TRACEBACK, _FRAME, _SOURCE, _EXCEPTION)
    taken: int = 0  # lines dispatched to it while printed at the same time as another (_Stream.parallel)
    original: bool = False  # its message holds another thread's traceback ('Original Traceback', DataParallel)

    def close(self) -> ExceptionBlock:
        exceptions = tuple(self.exceptions)
        if not exceptions and self.announced:
            exceptions = (ExceptionRecord(self.announced, "", self.start_line),)
        return ExceptionBlock(self.thread, self.stream, self.start_line, Stack(tuple(self.frames)), exceptions,
                              self.process, self.lead)

    def continue_message(self, text: str) -> None:
        last = self.exceptions[-1]
        if not last.message and text.lstrip().startswith(":"):  # 'NameError' then ': module is ...', cut by carets
            self.exceptions[-1] = ExceptionRecord(last.type, text.lstrip()[1:].strip(), last.line)
            return
        self.exceptions[-1] = ExceptionRecord(last.type, f"{last.message}\n{text.strip()}", last.line)
        self.continuation += 1


class _Stream:
    """One stream's parser: at most one block being written, plus thread headers still waiting for theirs."""

    def __init__(self, stream: Optional[str]) -> None:
        self.stream = stream
        self.open: Optional[_Open] = None
        self.waiting: Deque[_Open] = deque(maxlen=MAX_WAITING)
        # Blocks whose printing another thread's interrupted: they resume after that thread's exception line.
        self.suspended: List[_Open] = []
        # Tracebacks of other threads printed line by line at the same time as `open` (started, not ended): each
        # line goes to the one that expects it (_dispatch).
        self.parallel: List[_Open] = []
        self.late = 0  # headers cut by another thread's writes: their names come later (interleave.py)

    @property
    def active(self) -> bool:
        return (self.open is not None or bool(self.waiting) or bool(self.suspended) or bool(self.parallel)
                or self.late > 0)

    def feed(self, text: str, lineno: int) -> Tuple[List[ExceptionBlock], bool]:
        if not (self.late or has_glue(text)):
            return self._feed_line(text, lineno)
        lines, self.late = untangle(text, self.late)
        closed: List[ExceptionBlock] = []
        consumed = not lines  # (a late name's colon alone)
        for line in lines:
            if (self.suspended or self.parallel) and self._source_cut_from_its_indentation(line):
                line = "    " + line
            found, took = self._feed_line(line, lineno)
            closed += found
            consumed = consumed or took
        return closed, consumed

    @staticmethod
    def _source_cut_from_its_indentation(text: str) -> bool:
        """'self.run()' alone while several tracebacks are being written: a source line whose indentation another
        thread's write took (not a header, a 'Traceback' line, an exception, a chain marker or a frame)."""
        return bool(text) and not text[0].isspace() and not text.startswith(
            ("Exception in thread ", "Traceback (most", "Process ", "During handling", "The above exception",
             "File ", ":")) and patterns.EXCEPTION_LINE.match(text) is None and ":" not in text[-1:]

    def _feed_line(self, text: str, lineno: int) -> Tuple[List[ExceptionBlock], bool]:
        closed: List[ExceptionBlock] = []
        if self._header(text, lineno, closed):
            return closed, True
        if self.parallel:
            self._dispatch(text, closed)
        self._resume_suspended(text, closed)
        if self._traceback_start(text, lineno, closed):
            return closed, True
        block = self.open
        if block is None and (self.suspended or self.parallel) and _line_kind(text) is not None:
            # the open one ended: a traceback another thread's write cut goes on (not a new, headless one)
            self.open = block = self.suspended.pop() if self.suspended else self.parallel.pop(0)
        if block is None:
            return closed, self._headless_frame(text, lineno)
        consumed = self._inside(block, text, lineno, closed)
        if self.open is None and self.parallel:
            self.open = self.parallel.pop(0)
        return closed, consumed

    def _dispatch(self, text: str, closed: List[ExceptionBlock]) -> None:
        """Make `open` the traceback printed at the same time as others that expects this line: of those, the one
        that took fewest lines (the writers take turns), the earliest started at a tie."""
        kind = _line_kind(text)
        if kind is None or self.open is None:
            return
        printing = [self.open] + self.parallel
        expecting = ([b for b in printing if not b.ended and b.last in _NEXT[kind]]
                     or [b for b in printing if not b.ended and b.last in _EXPECTS[kind]])
        if not expecting:
            return
        chosen = min(expecting, key=lambda b: (b.taken, b.start_line))
        chosen.taken += 1
        rest = [b for b in printing if b is not chosen]
        closed += [b.close() for b in rest if b.ended]  # its exception came: a parallel one takes no more lines
        self.parallel = [b for b in rest if not b.ended]
        self.open = chosen

    def _header(self, text: str, lineno: int, closed: List[ExceptionBlock]) -> bool:
        """'Exception in thread NAME:', 'Process NAME:', or a name whose header another thread's cut."""
        header = patterns.THREAD_EXCEPTION.match(text) if text.startswith(patterns.THREAD_HEADER_STARTS) else None
        if header is not None:
            self.late += max(0, header.group("repeat").count("Exception in thread ") - 1)
            self._start(_Open(header.group("thread"), self.stream, lineno), closed)
            return True
        process = patterns.PROCESS_HEADER.match(text) if text.startswith("Process ") else None
        if process is not None:
            self._start(_Open(process.group("name"), self.stream, lineno, process=True), closed)
            return True
        return False

    def _resume_suspended(self, text: str, closed: List[ExceptionBlock]) -> None:
        """A traceback line the open block does not expect next, while tracebacks another thread's cut are
        waiting to go on: the one that expects it goes on (the open one is put aside, or closed once ended)."""
        block = self.open
        if block is None or not self.suspended:
            return
        kind = _line_kind(text)
        if kind is None:
            return
        done = (block.ended and not block.chained) or not block.started
        if not done and block.last in _NEXT[kind]:
            return
        chosen = next((b for b in reversed(self.suspended) if b.last in _NEXT[kind]), None)
        if chosen is None and done and kind != _EXCEPTION:
            chosen = self.suspended[-1]  # (the last one cut: its grammar is unknown after a skipped line)
        if chosen is None:
            return
        self.suspended.remove(chosen)
        if block.ended and not block.chained:
            closed.append(block.close())
        elif not block.started:
            self.waiting.append(block)
        elif len(self.suspended) < MAX_WAITING:
            self.suspended.append(block)
        self.open = chosen

    def _traceback_start(self, text: str, lineno: int, closed: List[ExceptionBlock]) -> bool:
        if text.startswith("Original Traceback") and self.open is not None and self.open.ended:
            # nn.DataParallel's re-raised replica: the replica's traceback is the exception's message, read as such
            self.open.original = True
            self.open.continue_message(text)
            return True
        ipython = patterns.IPYTHON_TRACEBACK.match(text) if "Traceback (most" in text else None
        start = patterns.TRACEBACK_START.search(text) if ipython is None else None
        if ipython is None and start is None:
            return False
        block = self.open
        if block is None or (block.ended and not block.chained):
            if block is not None:
                closed.append(block.close())
            block = self.waiting.popleft() if self.waiting else _Open(None, self.stream, lineno)
            self.open = block
            if start is not None and (start.start() > 0 or start.end() < len(text.rstrip())):
                # vLLM: 'Exception in worker ... while processing method init_device: NCCL error: ...,
                # Traceback (most recent call last):', or a traceback flattened onto its header's line: read
                # when the traceback has no exception line of its own
                block.lead = (text[:start.start()][-500:] + " " + text[start.start():][:4000]).strip()
        elif not block.chained and not block.exceptions and block.started and self.waiting:
            # another thread's traceback starting before this one ended: both are printed at the same time
            self.parallel.append(block)
            block = self.open = self.waiting.popleft()
        else:
            block.ended = False  # the next section of a chained traceback
            block.chained = False
        block.started = True
        block.last = _TRACEBACK
        if ipython is not None:
            block.announced = ipython.group("type")
        return True

    def _headless_frame(self, text: str, lineno: int) -> bool:
        """Frames pasted without their 'Traceback' line (an excerpt from the middle): the traceback still is one."""
        frame = patterns.FRAME.match(text) if text.startswith(" ") else _flush_left_frame(text)
        if frame is None and not _rich_pointer(text):
            return False
        self.open = block = _Open(None, self.stream, lineno, started=True)
        if frame is not None:
            block.frames.append(_frame(frame))
            block.last = _FRAME
        return True

    def _inside(self, block: _Open, text: str, lineno: int, closed: List[ExceptionBlock]) -> bool:
        """A line while `block` is open: a frame, the exception, its message going on, or the block's end."""
        if not text.strip():
            if block.ended:
                block.continuation = -1
            return True
        if patterns.CHAIN.match(text):
            block.chained = True
            return True
        if text[0] in " \t":
            if _caret_line(text):
                return True
            if block.ended and not block.chained:
                if 0 <= block.continuation < MAX_CONTINUATION and not block.original:
                    block.continue_message(text)  # (the frames of a replica's traceback are not its message)
                return True
            frame = patterns.FRAME.match(text)
            if frame:
                block.frames.append(_frame(frame))
                block.started = True
            block.last = _FRAME if frame else _SOURCE
            return True
        if not block.ended and text.startswith("File "):
            frame = _flush_left_frame(text)
            if frame:
                block.frames.append(_frame(frame))
                block.last = _FRAME
                return True
        exc = patterns.EXCEPTION_LINE.match(text)
        if exc and (not block.ended or block.chained):
            if len(block.exceptions) >= MAX_CHAINED:
                block.exceptions.pop(0)
            block.exceptions.append(ExceptionRecord(exc.group("type"), (exc.group("message") or "").strip(),
                                                    lineno))
            block.ended, block.chained, block.started, block.continuation = True, False, True, 0
            block.last = _EXCEPTION
            return True
        if block.ended and 0 <= block.continuation < MAX_CONTINUATION and not patterns.RECORD_START.search(text):
            block.continue_message(text)
            return True
        if block.ended and not block.chained and text.startswith(DYNAMO_USER_CODE):
            # Dynamo appends the user's stack to its errors after a blank line ('from user code:' and indented
            # frames): they belong to this exception, not to a new traceback of a thread that never says why it died
            block.continuation = -1
            return True
        if block.ended:
            closed.append(block.close())
            self.open = None
        # An unrelated line (another thread's output interleaved, or the block's end): not consumed.
        return False

    def _start(self, new: _Open, closed: List[ExceptionBlock]) -> None:
        current = self.open
        if current is not None:
            if current.thread is not None and not current.started:
                self.waiting.append(current)  # its traceback comes after this one's
            elif current.started and not current.ended and len(self.suspended) < MAX_WAITING:
                self.suspended.append(current)  # cut off mid-traceback by this header: it may resume
            else:
                closed.append(current.close())
        self.open = new

    def end_message(self) -> None:
        if self.open is not None:
            self.open.continuation = -1

    def name_open(self, thread: str) -> None:
        if self.open is not None and self.open.thread is None and not self.open.frames:
            self.open.thread = thread

    def flush(self, ended_only: bool = False) -> List[ExceptionBlock]:
        if ended_only:
            if self.open is None or not self.open.ended:
                return []
            block, self.open = self.open.close(), None
            return [block]
        blocks = [b.close() for b in ([self.open] if self.open is not None else []) + self.parallel
                  + self.suspended + list(self.waiting)]
        self.open = None
        self.waiting.clear()
        self.suspended.clear()
        self.parallel.clear()
        self.late = 0
        return blocks


class BlockParser:
    """feed(line, lineno, stream) -> (closed blocks, whether the line was consumed by a block)."""

    def __init__(self) -> None:
        self._streams: Dict[Optional[str], _Stream] = {}
        self.last_consumed = 0  # line number of the last line a block took

    @property
    def active(self) -> bool:
        return any(s.active for s in self._streams.values())

    def feed(self, text: str, lineno: int, stream: Optional[str] = None) -> Tuple[List[ExceptionBlock], bool]:
        parser = self._streams.get(stream)
        if parser is None:
            if not (text.startswith(patterns.THREAD_HEADER_STARTS + ("Process ",)) or "Traceback (most" in text
                    or (text.startswith("  File \"") and patterns.FRAME.match(text))
                    or _flush_left_frame(text) or _rich_pointer(text)):
                return [], False  # the common case, decided without a regex
            if len(self._streams) >= MAX_STREAMS:
                stream = None
                parser = self._streams.get(None)
            if parser is None:
                parser = self._streams[stream] = _Stream(stream)
        closed, consumed = parser.feed(text, lineno)
        if consumed:
            self.last_consumed = lineno
        if not parser.active:
            del self._streams[stream]
        return closed, consumed

    def end_message(self, stream: Optional[str]) -> None:
        """The current block's exception message is complete (a summary or a dump follows, not more message)."""
        parser = self._streams.get(stream)
        if parser is not None:
            parser.end_message()

    def name_open(self, stream: Optional[str], thread: str) -> None:
        """The traceback just opened is this thread's: its header came on the line before without being read
        (a header cut to 'in thread NAME:' holds no trigger word, so the prefilter passes it by)."""
        parser = self._streams.get(stream)
        if parser is not None:
            parser.name_open(thread)

    def flush(self, ended_only: bool = False) -> List[ExceptionBlock]:
        """Close what is open: everything at end of input; with `ended_only` (a follower caught up with the
        writer) only blocks whose exception line has come, since a half-written traceback may still grow."""
        closed: List[ExceptionBlock] = []
        for stream in list(self._streams):
            parser = self._streams[stream]
            closed += parser.flush(ended_only)
            if not parser.active:
                del self._streams[stream]
        return sorted(closed, key=lambda b: b.start_line)
