"""Name the cycle behind a hang from all-thread stacks (function and file names only, so synthetic stacks test it).

The known torch.compile cycle (docs/races.md, "The hazards"): thread B holds Dynamo's compile_lock (inside `_compile`) while
AOTAutograd's joint trace calls `torch.autograd.grad`, which waits for the autograd device thread; that thread
runs thread A's backward and waits for compile_lock in the lazy backward compile (`compile_fx_backward`).
Anything else where threads wait on locks is reported as a generic lock cycle, with the locks named when the
source shows them.
"""
from __future__ import annotations

import linecache
import re
from dataclasses import dataclass
from types import FrameType
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, TypedDict

from dflash_doctor.outcomes import FailureKind
from dflash_doctor.runtime.stacks import Frame, ThreadStack

DYNAMO_CYCLE = "compile-lock-autograd"
LOCK_CYCLE = "lock-cycle"
LOCK_WAIT = "lock-wait"
NO_CYCLE = "no-cycle"

_BACKWARD_COMPILERS = ("compile_fx_backward", "bw_compiler")
_ACQUIRE = re.compile(r"([\w.\[\]'\"]+)\.acquire\(")
_WITH_HEADER = re.compile(r"^\s*(?:async\s+)?with\b")


class HangFacts(TypedDict):
    """A HangDiagnosis as the facts JSON writes it (HangDiagnosis.to_dict): pipeline, repro and run reports carry it."""

    kind: str  # outcomes.FailureKind: deadlock | other-error
    cycle: str
    chain: List[str]
    threads: List[str]
    stalled_s: float
    hint: str


@dataclass(frozen=True)
class HangDiagnosis:
    kind: FailureKind  # DEADLOCK, or OTHER_ERROR (no lock cycle in the stacks)
    cycle: str  # compile-lock-autograd | lock-cycle | lock-wait | no-cycle
    chain: Tuple[str, ...]  # the cycle in plain words, one step per entry
    threads: Tuple[str, ...] = ()  # the threads taking part
    stalled_s: float = 0.0
    hint: str = ""

    def summary(self) -> str:
        return "; ".join(self.chain)

    def to_dict(self) -> HangFacts:
        return {"kind": self.kind, "cycle": self.cycle, "chain": list(self.chain), "threads": list(self.threads),
                "stalled_s": round(self.stalled_s, 3), "hint": self.hint}


def _path(frame: Frame) -> str:
    return frame.file.replace("\\", "/")


def _in(frame: Frame, suffix: str, functions: Sequence[str] = ()) -> bool:
    return _path(frame).endswith(suffix) and (not functions or frame.function in functions)


def _dynamo_compiling(stack: ThreadStack) -> Optional[Frame]:
    """The innermost Dynamo compile frame, if the thread is compiling (and so holds compile_lock)."""
    hits = [f for f in stack.frames if _in(f, "_dynamo/convert_frame.py", ("_compile", "compile_inner", "__call__"))]
    return hits[-1] if hits else None


def _waits_on_autograd_engine(stack: ThreadStack, after: Frame) -> bool:
    frames = stack.frames[stack.frames.index(after):]
    return any(_in(f, "torch/autograd/__init__.py", ("grad", "backward")) or
               _in(f, "torch/autograd/graph.py", ("_engine_run_backward",)) for f in frames)


def _waits_for_compile_lock_in_backward(stack: ThreadStack) -> Optional[Frame]:
    """The backward-compiler frame a thread is blocked in, if it is waiting for compile_lock there."""
    inner = stack.innermost
    if inner is None:
        return None
    if inner.function in _BACKWARD_COMPILERS:
        return inner
    if "compile_lock" in inner.source and any(f.function in _BACKWARD_COMPILERS for f in stack.frames):
        return inner
    return None


def _dynamo_cycle(stacks: Sequence[ThreadStack], stalled_s: float) -> Optional[HangDiagnosis]:
    compilers = []
    for stack in stacks:
        frame = _dynamo_compiling(stack)
        if frame is not None and _waits_on_autograd_engine(stack, frame):
            compilers.append(stack)
    waiters = [s for s in stacks if _waits_for_compile_lock_in_backward(s) is not None and s not in compilers]
    if not compilers or not waiters:
        return None
    holder, waiter = compilers[0], waiters[0]
    waiting_in = _waits_for_compile_lock_in_backward(waiter)
    backward_fn = waiting_in.function if waiting_in is not None else "the backward compile"
    chain = (
        f"{holder.name} holds compile_lock (Dynamo compiling a frame) and waits in torch.autograd.grad "
        f"for the autograd engine",
        f"{waiter.name} (the autograd device thread, running another thread's backward) waits for "
        f"compile_lock in {backward_fn} (the lazy backward compile)",
        "cycle: compile_lock -> autograd device thread -> compile_lock",
    )
    return HangDiagnosis(
        FailureKind.DEADLOCK, DYNAMO_CYCLE, chain, (holder.name, waiter.name), stalled_s,
        hint="compile the backward with the forward (enable_non_lazy_backward(), with the thread-local FX shim), "
             "warm up every shape in one thread first, or hold one global lock around each step",
    )


def _lock_wanted(frame: Frame) -> Optional[str]:
    """The lock a frame is blocked acquiring, read from its source line."""
    match = _ACQUIRE.search(frame.source)
    if match:
        return match.group(1)
    if _WITH_HEADER.match(frame.source):
        entering = [expr for line, expr in frame.enclosing_with if line == frame.line]
        return ", ".join(entering) if entering else frame.source
    return None


def _locks_held(stack: ThreadStack) -> List[str]:
    """`with` blocks the thread is inside. Calls (`with torch.no_grad():`, `with recorder.step():`) are context
    managers made on the spot, not locks someone else could be waiting for, so they are left out."""
    held: List[str] = []
    for index, frame in enumerate(stack.frames):
        innermost = index == len(stack.frames) - 1
        held.extend(expr for line, expr in frame.enclosing_with
                    if not (innermost and line == frame.line) and "(" not in expr)
    return held


def _lock_waiters(stacks: Sequence[ThreadStack]) -> Dict[str, Tuple[str, Frame, List[str]]]:
    waiting = {}
    for stack in stacks:
        inner = stack.innermost
        # threading.py's own waits (join, Event.wait, Condition.wait) are the harness waiting, not a lock cycle.
        if inner is None or _path(inner).endswith("/threading.py"):
            continue
        wanted = _lock_wanted(inner)
        if wanted is not None:
            waiting[stack.name] = (wanted, inner, _locks_held(stack))
    return waiting


def _find_cycle(waiting: Dict[str, Tuple[str, Frame, List[str]]]) -> List[str]:
    """Threads forming a wait-for cycle: each wants a lock the next one holds (matched by expression text)."""
    edges = {}
    for name, (wanted, _, _) in waiting.items():
        for other, (_, _, held) in waiting.items():
            if other != name and wanted in held:
                edges[name] = other
                break
    for start in edges:
        path, node = [], start
        while node in edges and node not in path:
            path.append(node)
            node = edges[node]
        if node == start:
            return path
    return []


def may_hold_a_cycle(tops: Iterable[FrameType]) -> bool:
    """A cheap look at live threads (innermost frame objects) before a full capture: could `classify_hang` find
    a cycle in them? Only if some thread is in the lazy backward compile, or blocked entering a `with` / in an
    `.acquire(` outside threading.py (whose waits are queues and joins, not lock cycles). Reads one cached
    source line per thread and walks frame objects; parses nothing, so a watchdog can ask every second."""
    for top in tops:
        filename = top.f_code.co_filename.replace("\\", "/")
        if not filename.endswith("/threading.py"):
            source = linecache.getline(top.f_code.co_filename, top.f_lineno or 0)
            if _ACQUIRE.search(source) or _WITH_HEADER.match(source):
                return True
        frame: Optional[FrameType] = top
        while frame is not None:
            if frame.f_code.co_name in _BACKWARD_COMPILERS:
                return True
            frame = frame.f_back
    return False


def classify_hang(stacks: Sequence[ThreadStack], stalled_s: float = 0.0) -> HangDiagnosis:
    """Classify why no thread made progress for `stalled_s` seconds."""
    dynamo = _dynamo_cycle(stacks, stalled_s)
    if dynamo is not None:
        return dynamo
    waiting = _lock_waiters(stacks)
    cycle = _find_cycle(waiting)
    if cycle:
        chain = tuple(
            f"{name} holds {', '.join(waiting[name][2])} and waits for {waiting[name][0]} at "
            f"{waiting[name][1].where()}" for name in cycle
        ) + (f"lock-order cycle: {_stalled(stalled_s)}",)
        return HangDiagnosis(FailureKind.DEADLOCK, LOCK_CYCLE, chain, tuple(cycle), stalled_s,
                             hint="take the locks in one global order")
    if len(waiting) >= 2:
        chain = tuple(f"{name} waits for {wanted} at {frame.where()}" for name, (wanted, frame, _) in
                      sorted(waiting.items())) + (_stalled(stalled_s),)
        return HangDiagnosis(FailureKind.DEADLOCK, LOCK_WAIT, chain, tuple(sorted(waiting)), stalled_s,
                             hint="threads wait on each other's locks; the holders are not visible in the stacks")
    busy = tuple(f"{s.name} at {s.innermost.where()}" for s in stacks if s.innermost is not None)
    return HangDiagnosis(FailureKind.OTHER_ERROR, NO_CYCLE, (f"{_stalled(stalled_s)} and no lock cycle in the stacks",)
                         + busy, tuple(s.name for s in stacks), stalled_s)


def _stalled(stalled_s: float) -> str:
    # a dump read from a log says nothing of how long the process had been stuck
    return f"no progress for {stalled_s:.1f} s" if stalled_s else "stacks from a dump"
