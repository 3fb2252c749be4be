"""All-thread stack snapshots as plain data: from `sys._current_frames()` in-process, or parsed from a
`faulthandler` dump (the fallback when a hung process cannot run Python any more).

Each frame carries its source line and the `with` statements enclosing that line in its function, so the
deadlock classifier can say which lock a thread waits for and which it already holds.
"""
from __future__ import annotations

import ast
import functools
import linecache
import re
import sys
import threading
from types import FrameType
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple, TypedDict, Union

from dflash_doctor.runtime.lock_sites import LockRef


class FrameFacts(TypedDict):
    """A Frame as the facts JSON writes it (Frame.to_dict): pipeline, repro and run reports carry these."""

    file: str
    line: int
    function: str
    source: str
    enclosing_with: List[List[Union[int, str]]]  # [line, context expression] pairs (JSON has no tuples)
    waits_for: Optional[List[str]]  # [identity, expression] of the lock it is blocked acquiring (lock_sites.py)
    holds: List[List[str]]  # [identity, expression] of each lock it holds


class ThreadStackFacts(TypedDict):
    """A ThreadStack as the facts JSON writes it (ThreadStack.to_dict)."""

    name: str
    ident: int
    frames: List[FrameFacts]  # outermost first
    locks_read: bool


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    source: str = ""  # the line being executed, stripped
    # (line, context expression) of each `with` block around that line, outermost first; a block whose header
    # is on `line` itself is the one the thread is entering (e.g. waiting for its lock).
    enclosing_with: Tuple[Tuple[int, str], ...] = ()
    # The locks by identity (lock_sites.py), where whoever read the stack could tell: the one this frame is
    # blocked acquiring (innermost frame only) and the ones it holds.
    waits_for: Optional[LockRef] = None
    holds: Tuple[LockRef, ...] = ()

    def where(self) -> str:
        return f"{self.file}:{self.line}" + (f" in {self.function}" if self.function else "")

    def to_dict(self) -> FrameFacts:
        return {"file": self.file, "line": self.line, "function": self.function, "source": self.source,
                "enclosing_with": [list(pair) for pair in self.enclosing_with],
                "waits_for": self.waits_for.to_list() if self.waits_for is not None else None,
                "holds": [ref.to_list() for ref in self.holds]}

    @classmethod
    def from_dict(cls, data: dict) -> "Frame":
        waits = data.get("waits_for")
        return cls(data["file"], int(data["line"]), data["function"], data.get("source", ""),
                   tuple((int(line), str(expr)) for line, expr in data.get("enclosing_with", ())),
                   LockRef.from_list(waits) if waits else None,
                   tuple(LockRef.from_list(ref) for ref in data.get("holds") or ()))


@dataclass(frozen=True)
class ThreadStack:
    name: str
    ident: int
    frames: Tuple[Frame, ...]  # outermost first, innermost last
    # Whether the frames' waits_for / holds were filled in by a reader that could see the objects (the live
    # process, py-spy's locals): otherwise the deadlock rule reads them from the source, globals only.
    locks_read: bool = False

    @property
    def innermost(self) -> Optional[Frame]:
        return self.frames[-1] if self.frames else None

    def to_dict(self) -> ThreadStackFacts:
        return {"name": self.name, "ident": self.ident, "frames": [f.to_dict() for f in self.frames],
                "locks_read": self.locks_read}

    @classmethod
    def from_dict(cls, data: dict) -> "ThreadStack":
        return cls(data["name"], int(data["ident"]), tuple(Frame.from_dict(f) for f in data["frames"]),
                   bool(data.get("locks_read", False)))


def thread_names() -> Dict[int, str]:
    return {thread.ident: thread.name for thread in threading.enumerate() if thread.ident is not None}


def capture_stacks(names: Optional[Dict[int, str]] = None, skip_current: bool = True,
                   read_locks: bool = True) -> List[ThreadStack]:
    """Snapshot every thread's Python stack. Threads torch started in C++ (the autograd device threads) show up
    too while they run Python code; they are named `thread-<ident>`. `read_locks`: name each lock a frame waits
    for or holds by the object it is (the watchdog's deadlock rule)."""
    names = {**thread_names(), **(names or {})}
    current = threading.get_ident()
    stacks: List[ThreadStack] = []
    for ident, top in sys._current_frames().items():
        if skip_current and ident == current:
            continue
        # Only a thread blocked acquiring a lock has its frames' locals read: it cannot change them meanwhile, and
        # a running thread's frame is never made to snapshot its locals (which a trace function there, coverage or
        # a debugger, would write back later). A thread that waits for no lock is in no wait-for cycle.
        blocked = read_locks and _blocked_on_lock(top)
        frames = frames_of(top, ident if blocked else None)
        stacks.append(ThreadStack(names.get(ident, f"thread-{ident}"), ident, tuple(frames), read_locks))
    return sorted(stacks, key=lambda s: s.name)


def frames_of(top: Optional[FrameType], locks_of: Optional[int] = None) -> List[Frame]:
    """One thread's Python frames from its innermost frame object, outermost first, with source and `with`s;
    with `locks_of` (that thread's ident) also the locks each frame waits for and holds, by object.

    The chain is walked first, reading only attributes (no file I/O, no parsing, nothing that lets another thread
    run), so the stack is one moment of that thread; source lines are filled in afterwards."""
    chain: List[Tuple[FrameType, int]] = []
    frame = top
    while frame is not None:
        chain.append((frame, frame.f_lineno or 0))
        frame = frame.f_back
    frames: List[Frame] = []
    for frame, line in reversed(chain):
        code = frame.f_code
        plain = Frame(code.co_filename, line, code.co_name, linecache.getline(code.co_filename, line).strip(),
                      enclosing_with_statements(code.co_filename, line))
        frames.append(_live_locks(plain, frame, locks_of, frame is top) if locks_of is not None else plain)
    return frames


def light_frames(top: Optional[FrameType]) -> Tuple[Frame, ...]:
    """File, line and function of each frame, outermost first, with nothing read from disk: cheap enough to take
    at every FX trace's start (recorder.py), when that thread's stack is exactly the one that started it."""
    chain = []
    frame = top
    while frame is not None:
        chain.append(Frame(frame.f_code.co_filename, frame.f_lineno or 0, frame.f_code.co_name))
        frame = frame.f_back
    return tuple(reversed(chain))


def with_source_lines(frames: Tuple[Frame, ...]) -> Tuple[Frame, ...]:
    """`light_frames` with each frame's source line (no `with` analysis): for reports."""
    return tuple(replace(f, source=linecache.getline(f.file, f.line).strip()) if not f.source else f
                 for f in frames)


def _live_locks(plain: Frame, frame: FrameType, ident: int, innermost: bool) -> Frame:
    """The frame with the lock objects its lock expressions name in the live process (lock_sites.py)."""
    from dflash_doctor.runtime.lock_sites import held_by, live_identity, lock_sites

    if not plain.enclosing_with and ".acquire(" not in plain.source and not _has_acquire(plain.file):
        return plain
    sites = lock_sites(plain.file, plain.line)
    waits = None
    if innermost:
        for expression in sites.acquiring + sites.entering:
            found = live_identity(expression, frame)
            if found is not None:
                waits = LockRef(found[0], expression)
                break
    holds = []
    for expression in sites.inside + sites.acquired + (() if innermost else sites.entering):
        found = live_identity(expression, frame)
        if found is not None and held_by(found[1], ident) is not False:
            holds.append(LockRef(found[0], expression))
    return replace(plain, waits_for=waits, holds=tuple(holds))


def _blocked_on_lock(top: Optional[FrameType]) -> bool:
    from dflash_doctor.runtime.lock_sites import lock_sites

    if top is None or top.f_code.co_filename.replace("\\", "/").endswith("/threading.py"):
        return False
    sites = lock_sites(top.f_code.co_filename, top.f_lineno or 0)
    return bool(sites.acquiring or sites.entering)


@functools.lru_cache(maxsize=1024)
def _has_acquire(filename: str) -> bool:
    """Whether a file calls `.acquire(` at all: most frames (torch's) can then skip the AST walk."""
    return any(".acquire(" in line for line in linecache.getlines(filename))


def with_source(frame: Frame) -> Frame:
    """`frame` with its source line and enclosing `with`s read from its file, for frames parsed from a dump
    (py-spy, faulthandler) that name only file, line and function. Unreadable files leave it as it was."""
    if frame.source or not frame.file or frame.line <= 0:
        return frame
    source = linecache.getline(frame.file, frame.line).strip()
    if not source:
        return frame
    return Frame(frame.file, frame.line, frame.function, source, enclosing_with_statements(frame.file, frame.line))


@functools.lru_cache(maxsize=4096)
def enclosing_with_statements(filename: str, line: int) -> Tuple[Tuple[int, str], ...]:
    """(line, context expression) of the `with` statements whose header or body contains `line`, outermost
    first."""
    tree = _parse(filename)
    if tree is None:
        return ()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)) and node.lineno <= line <= (node.end_lineno or node.lineno):
            for item in node.items:
                try:
                    found.append((node.lineno, ast.unparse(item.context_expr)))
                except RecursionError:
                    continue
    return tuple(sorted(found))


@functools.lru_cache(maxsize=256)
def _parse(filename: str) -> Optional[ast.AST]:
    source = "".join(linecache.getlines(filename))
    if not source:
        return None
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # a 100,000-deep expression is no crash
        return None


_THREAD_HEADER = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME_LINE = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


def parse_faulthandler(text: str, names: Optional[Dict[int, str]] = None) -> List[ThreadStack]:
    """Turn `faulthandler.dump_traceback(all_threads=True)` output into stacks (innermost last)."""
    names = names or {}
    stacks: List[ThreadStack] = []
    ident: Optional[int] = None
    frames: List[Frame] = []

    def close() -> None:
        if ident is not None:
            frames.reverse()
            stacks.append(ThreadStack(names.get(ident, f"thread-{ident}"), ident, tuple(frames)))

    for raw in text.splitlines():
        header = _THREAD_HEADER.match(raw)
        if header:
            close()
            ident, frames = int(header.group(1), 16), []
            continue
        match = _FRAME_LINE.match(raw)
        if match and ident is not None:
            file, line = match.group(1), int(match.group(2))
            frames.append(Frame(file, line, match.group(3), linecache.getline(file, line).strip(),
                                enclosing_with_statements(file, line)))
    close()
    return sorted(stacks, key=lambda s: s.name)
