"""All-thread stack dumps pasted into a log: `py-spy dump` and Python's faulthandler.

py-spy prints 'Thread 0x7F31C36BF740 (idle): "drafter-0"' then one '    function (file:line)' per frame, innermost
first (with --locals, indented 'Arguments:'/'Locals:' blocks; with --native, '    0x7f.. (libc.so.6)' frames).
faulthandler prints 'Thread 0x00007f... (most recent call first):' (or 'Current thread ...') then
'  File "x.py", line 12 in function', innermost first, preceded by 'Timeout (0:10:00)!' when
dump_traceback_later fired (a hang) or by 'Fatal Python error: ...' when it is a crash's stack.
gdb prints 'Thread 7 (Thread 0x7f.. (LWP 2791195) "name"):' before each thread's '#0  0x.. in read () from
libc.so.6' frames, or, for backtraces taken by hand, '(gdb) bt' then the frames of the current thread and
'[Switching to thread 2 (Thread 0x7f.. (LWP 51477))]' when another is selected.
The threads are handed to dflash_doctor.runtime.deadlock, which names the compile-lock / autograd cycle.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional

from dflash_doctor.logs.frames import Frame, Stack

MAX_THREADS = 128
MAX_FRAMES = 64
MAX_LINES = 4000

# A pasted py-spy dump may have its thread ids edited out ('Thread (idle): "MainThread"'): the name then stays.
_THREAD = re.compile(r"^\s*(?:Current thread|Thread) (?:(?P<ident>0x[0-9a-fA-F]+|\d+) )?\((?P<status>most recent "
                     r"call first|(?:idle|active)(?:\+gil)?)\)(?::? ?\"(?P<name>[^\"]*)\")?:?\s*$")
_PYSPY_FRAME = re.compile(r"^ {4}(?P<func>\S.*?) \((?P<file>[^()]+?):(?P<line>\d+)\)\s*$")
# Any other line indented like a frame: --native frames ('    0x7f.. (libc.so.6)'), frames elided by hand ('    ...').
_NATIVE_FRAME = re.compile(r"^ {4}\S")
# faulthandler's frame ('line 12 in f', no comma); some pastes strip its indentation.
_FAULT_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>.+?)\s*$')
_LOCALS = re.compile(r"^ {8,}\S|^\s*<no Python frame>\s*$")  # also faulthandler's frameless thread
# gdb's 'thread apply all bt': 'Thread 7 (Thread 0x7f64ab6dc000 (LWP 2791195) "executor_server"):' then
# '#0  0x00007f6b84ad7ab4 in read () from /lib/libpthread.so.0' (native frames only: no Python file to blame).
_GDB_THREAD = re.compile(r"^(?:Thread (?P<num>\d+)|\[Switching to thread (?P<num2>\d+)) \(Thread (?P<ident>0x[0-9a-fA-F]+) "
                         r"\(LWP \d+\)(?: \"(?P<name>[^\"]*)\")?\)?")  # (the closing bracket may be cut)
# A C++ function's parameter list is glued to its name ('wrap_ibv_get_async_event(ibv_context*, ...) () from ...').
_GDB_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-fA-F]+ in )?(?P<func>[^\s(]+)(?:.* (?:at|from) (?P<file>[^\s:]+)"
                        r"(?::(?P<line>\d+))?\s*$)?")
# gdb wraps a long frame's ' at file:line' or ' from lib.so' onto the next line; its prompt lines stay in the dump.
_GDB_CONTINUED = re.compile(r"^\s+(?:at|from) \S|^\(gdb\)")
GDB_BACKTRACE = re.compile(r"^\(gdb\) (?:bt|backtrace|where|thread apply all (?:bt|backtrace))\b")
# pystack: 'Traceback for thread 4242 (python3.12) [] (most recent call last):' then '    (Python) File "x.py", line 3,
# in f' (or '(C) File ...' for native frames)
_PYSTACK_THREAD = re.compile(r"^Traceback for thread (?P<ident>\d+) \((?P<name>[^)]*)\)")
_PYSTACK_FRAME = re.compile(r'^\s+\((?:Python|C)\) File "(?P<file>.+)", line (?P<line>\d+), in (?P<func>\S+)')
_HEADER = re.compile(r"^(?:Process \d+: |Python v\d|Timeout \(\d+:\d\d:\d\d\)!)")


@dataclass
class DumpedThread:
    name: str
    ident: int
    status: str  # idle / active / active+gil / 'most recent call first' (faulthandler: unknown)
    printed: List[Frame] = field(default_factory=list)  # as the dump prints them: innermost first

    @property
    def stack(self) -> Stack:
        return Stack(tuple(reversed(self.printed)))


class StackDumpParser:
    """Fed lines from the first thread header on; `done` when a line is neither a thread nor a frame."""

    def __init__(self, lineno: int, crash: bool) -> None:
        self.start_line = lineno
        self.crash = crash  # faulthandler's dump of a crash (after 'Fatal Python error'), not of a hang
        self.threads: List[DumpedThread] = []
        self.done = False
        self._lines = 0

    def feed(self, text: str) -> bool:
        self._lines += 1
        if self._lines > MAX_LINES:
            self.done = True
            return False
        if self._thread_header(text) or self._frame(text):
            return True
        current = self.threads[-1] if self.threads else None
        if current is not None and (_NATIVE_FRAME.match(text) or _LOCALS.match(text) or not text.strip()
                                    or _HEADER.match(text)) or _GDB_CONTINUED.match(text):
            return True
        self.done = True
        return False

    def _thread_header(self, text: str) -> bool:
        other = _GDB_THREAD.match(text) or _PYSTACK_THREAD.match(text)
        if other is not None:
            self._add_thread(other.group("name"), other.group("ident"), "unknown")
            return True
        header = _THREAD.match(text)
        if header is not None and (header.group("ident") or header.group("name") is not None):
            self._add_thread(header.group("name"), header.group("ident") or str(len(self.threads)),
                             header.group("status"))
            return True
        return False

    def _add_thread(self, name: Optional[str], ident: str, status: str) -> None:
        if len(self.threads) < MAX_THREADS:
            self.threads.append(DumpedThread(name or f"thread-{ident}",
                                             int(ident, 16) if ident.startswith("0x") else int(ident), status))

    def _frame(self, text: str) -> bool:
        frame = _PYSPY_FRAME.match(text) or _FAULT_FRAME.match(text) or _PYSTACK_FRAME.match(text) \
            or _GDB_FRAME.match(text)
        if frame is None:
            return False
        if not self.threads and text.startswith("#"):
            self.threads.append(DumpedThread("gdb-thread", 0, "unknown"))  # '(gdb) bt' of the selected thread
        if not self.threads:
            return False
        current = self.threads[-1]
        if len(current.printed) < MAX_FRAMES:
            current.printed.append(Frame(frame.group("file") or "?", int(frame.group("line") or 0),
                                         frame.group("func")))
        return True

    def stacks(self, read_source: bool = False):
        """The dumped threads as ThreadStacks (outermost first). `read_source`: fill in each frame's source line
        and enclosing `with`s from its file, which a dump of a live process on this machine can (attach), so the
        lock-cycle rule can see which lock a frame waits for; a pasted log's files are usually not here."""
        from dflash_doctor.runtime.stacks import Frame as RuntimeFrame, ThreadStack, with_source

        def runtime_frame(frame: Frame) -> RuntimeFrame:
            plain = RuntimeFrame(frame.file, frame.line, frame.function)
            return with_source(plain) if read_source else plain

        return [ThreadStack(t.name, t.ident, tuple(runtime_frame(frame) for frame in t.stack.frames))
                for t in self.threads]

    def diagnosis(self):
        """classify_hang's verdict on the dumped threads (imported here: only logs holding a dump pay for it)."""
        from dflash_doctor.runtime.deadlock import classify_hang

        return classify_hang(self.stacks())

    def summary(self) -> List[dict]:
        return [{"thread": t.name, "status": t.status, "at": _at(t.stack.innermost)} for t in self.threads]


def _at(frame: Optional[Frame]) -> Optional[str]:
    return f"{frame.function} ({frame.file}:{frame.line})" if frame is not None else None


def crash_context(recent: Optional[str]) -> bool:
    """Whether the line before a faulthandler dump says it is a crash's stack."""
    return recent is not None and "Fatal Python error" in recent
