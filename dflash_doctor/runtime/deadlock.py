"""Name the cycle behind a hang from all-thread stacks (function and file names only, so synthetic stacks test it).

The known torch.compile cycle (docs/races.md, "The hazards"): thread B holds Dynamo's compile_lock (inside `_compile`) while
AOTAutograd's joint trace calls `torch.autograd.grad`, which waits for the autograd device thread; that thread
runs thread A's backward and waits for compile_lock in the lazy backward compile (`compile_fx_backward`).
Anything else where threads wait on locks is a lock cycle only when the wait-for graph closes by lock identity
(runtime/lock_sites.py: the object, not the text; rings of any length, `with` and `.acquire()` alike); threads
queued behind a holder that waits for none of their locks are a lock wait, not a cycle.
"""
from __future__ import annotations

import linecache
import re
from dataclasses import dataclass, replace
from types import FrameType
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypedDict

from dflash_doctor.outcomes import FailureKind, HangCycle
from dflash_doctor.runtime.lock_sites import (TORCH_COMPILE_LOCK, LockRef, LockSites, cell_identity, global_identity,
                                              lock_sites)
from dflash_doctor.runtime.stacks import Frame, ThreadStack

_BACKWARD_COMPILERS = ("compile_fx_backward", "bw_compiler")
_ACQUIRE = re.compile(r"([\w.\[\]'\"]+)\.acquire\(")
_WITH_HEADER = re.compile(r"^\s*(?:async\s+)?with\b")


class HangFacts(TypedDict):
    """A HangDiagnosis as the facts JSON writes it (HangDiagnosis.to_dict): pipeline, repro and run reports carry it."""

    kind: str  # outcomes.FailureKind: deadlock | other-error
    cycle: str  # outcomes.HangCycle
    chain: List[str]
    threads: List[str]
    stalled_s: float
    hint: str
    locks: List[str]  # identities of the cycle's lock objects (lock_sites.py)


@dataclass(frozen=True)
class HangDiagnosis:
    kind: FailureKind  # DEADLOCK, or OTHER_ERROR (no lock cycle in the stacks)
    cycle: HangCycle
    chain: Tuple[str, ...]  # the cycle in plain words, one step per entry
    threads: Tuple[str, ...] = ()  # the threads taking part
    stalled_s: float = 0.0
    hint: str = ""
    locks: Tuple[str, ...] = ()  # the identities of the locks in the cycle: the same cycle has the same ones

    @property
    def signature(self) -> Tuple[HangCycle, Tuple[str, ...], Tuple[str, ...]]:
        """What must be equal in two samples for them to show the same cycle (kind, threads, lock objects)."""
        return self.cycle, tuple(sorted(self.threads)), tuple(sorted(self.locks))

    def summary(self) -> str:
        return "; ".join(self.chain)

    def to_dict(self) -> HangFacts:
        return {"kind": self.kind, "cycle": self.cycle, "chain": list(self.chain), "threads": list(self.threads),
                "stalled_s": round(self.stalled_s, 3), "hint": self.hint, "locks": list(self.locks)}


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
    return _dynamo_diagnosis(holder, waiter, waiting_in.function if waiting_in is not None else "", stalled_s)


def _dynamo_diagnosis(holder: ThreadStack, waiter: ThreadStack, waiting_in: str, stalled_s: float) -> HangDiagnosis:
    chain = (
        f"{holder.name} holds compile_lock (Dynamo compiling a frame) and waits in torch.autograd.grad "
        f"for the autograd engine",
        f"{waiter.name} (the autograd device thread, running another thread's backward) waits for "
        f"compile_lock in {waiting_in or 'the backward compile'} (the lazy backward compile)",
        "cycle: compile_lock -> autograd device thread -> compile_lock",
    )
    return HangDiagnosis(
        FailureKind.DEADLOCK, HangCycle.COMPILE_LOCK_AUTOGRAD, chain, (holder.name, waiter.name), stalled_s,
        hint="compile the backward with the forward (enable_non_lazy_backward(), with the thread-local FX shim), "
             "warm up every shape in one thread first, or hold one global lock around each step",
        locks=(TORCH_COMPILE_LOCK,),
    )


def _source_refs(stack: ThreadStack, runs: Callable[[str, str], int]) -> ThreadStack:
    """A stack read without its objects (a faulthandler or pasted dump): the locks its frames name, with an
    identity only for module globals (lock_sites.global_identity) and for a closure's cell when one thread alone
    runs the function owning it (`runs(file, function)`: how many threads have a frame there), so the cell is
    that call's. `self.lock` in two frames may be two locks: no identity."""
    if stack.locks_read:
        return stack
    frames = []
    last = len(stack.frames) - 1
    for index, frame in enumerate(stack.frames):
        sites = lock_sites(frame.file, frame.line)
        known = bool(sites.entering or sites.inside or sites.acquiring or sites.acquired or sites.local_names
                     or sites.module_level)
        if not known:  # the file is not here: what the frame carries (its source line, its `with`s) is all
            sites = LockSites(
                entering=tuple(expr for line, expr in frame.enclosing_with if line == frame.line and "(" not in expr),
                acquiring=tuple(match.group(1) for match in [_ACQUIRE.search(frame.source)] if match),
                inside=tuple(expr for line, expr in frame.enclosing_with if line != frame.line and "(" not in expr),
                local_names=frozenset(("self", "cls")))

        def ref(expression: str) -> Optional[LockRef]:
            identity = global_identity(frame.file, expression, sites)
            if identity is None:
                cell = cell_identity(frame.file, expression, sites)
                identity = cell[0] if cell is not None and runs(frame.file, cell[1]) == 1 else None
            return LockRef(identity, expression) if identity is not None else None

        waits = None
        if index == last:
            waits = next((r for r in map(ref, sites.acquiring + sites.entering) if r is not None), None)
        held = sites.inside + sites.acquired + (sites.entering if index != last else ())
        frames.append(replace(frame, waits_for=waits, holds=tuple(r for r in map(ref, held) if r is not None)))
    return replace(stack, frames=tuple(frames), locks_read=True)


@dataclass(frozen=True)
class _Wait:
    thread: str
    wants: LockRef
    frame: Frame
    holds: Tuple[LockRef, ...]


def _lock_waits(stacks: Sequence[ThreadStack]) -> Dict[str, _Wait]:
    waiting = {}
    for stack in stacks:
        inner = stack.innermost
        # threading.py's own waits (join, Event.wait, Condition.wait) are the harness waiting, not a lock cycle.
        if inner is None or _path(inner).endswith("/threading.py") or inner.waits_for is None:
            continue
        held = tuple(ref for frame in stack.frames for ref in frame.holds)
        waiting[stack.name] = _Wait(stack.name, inner.waits_for, inner, held)
    return waiting


def _holders(stacks: Sequence[ThreadStack]) -> Dict[str, str]:
    """lock identity -> the one thread holding it. An identity two threads claim is dropped: one of the claims is
    wrong, and a wrong wait-for edge is worse than a missing one."""
    claims: Dict[str, set] = {}
    for stack in stacks:
        for frame in stack.frames:
            for ref in frame.holds:
                claims.setdefault(ref.identity, set()).add(stack.name)
    return {identity: next(iter(names)) for identity, names in claims.items() if len(names) == 1}


def _find_cycle(waiting: Dict[str, _Wait], holders: Dict[str, str]) -> List[str]:
    """Threads forming a wait-for cycle of any length: each wants the lock object the next one holds."""
    edges = {name: holders[wait.wants.identity] for name, wait in waiting.items()
             if holders.get(wait.wants.identity, name) != name}
    for start in sorted(edges):
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
    """Classify why no thread made progress for `stalled_s` seconds. Locks are compared by identity (the
    stacks' waits_for / holds when their reader saw the objects, module globals otherwise)."""
    dynamo = _dynamo_cycle(stacks, stalled_s)
    if dynamo is not None:
        return dynamo
    running: Dict[Tuple[str, str], set] = {}
    for stack in stacks:
        for frame in stack.frames:
            running.setdefault((frame.file, frame.function), set()).add(stack.name)

    def runs(file: str, function: str) -> int:
        return len(running.get((file, function), ()))

    stacks = [_source_refs(stack, runs) for stack in stacks]
    waiting = _lock_waits(stacks)
    cycle = _find_cycle(waiting, _holders(stacks))
    if cycle:
        locks = tuple(waiting[name].wants for name in cycle)
        preferred = _dynamo_behind(stacks, locks, stalled_s)
        if preferred is not None:
            return preferred
        chain = tuple(
            f"{name} holds {', '.join(sorted({r.expression for r in waiting[name].holds}))} and waits for "
            f"{waiting[name].wants.expression} at {waiting[name].frame.where()}" for name in cycle
        ) + (f"lock-order cycle: {_stalled(stalled_s)}",)
        return HangDiagnosis(FailureKind.DEADLOCK, HangCycle.LOCK_CYCLE, chain, tuple(cycle), stalled_s,
                             hint="take the locks in one global order", locks=tuple(r.identity for r in locks))
    if len(waiting) >= 2:
        chain = tuple(f"{name} waits for {wait.wants.expression} at {wait.frame.where()}" for name, wait in
                      sorted(waiting.items())) + (_stalled(stalled_s),)
        return HangDiagnosis(FailureKind.DEADLOCK, HangCycle.LOCK_WAIT, chain, tuple(sorted(waiting)), stalled_s,
                             hint="threads wait for locks whose holders wait for none of theirs: a slow holder, "
                                  "or one the stacks do not show")
    busy = tuple(f"{s.name} at {s.innermost.where()}" for s in stacks if s.innermost is not None)
    return HangDiagnosis(FailureKind.OTHER_ERROR, HangCycle.NO_CYCLE,
                         (f"{_stalled(stalled_s)} and no lock cycle in the stacks",) + busy,
                         tuple(s.name for s in stacks), stalled_s)


def _dynamo_behind(stacks: Sequence[ThreadStack], locks: Sequence[LockRef], stalled_s: float) -> Optional[HangDiagnosis]:
    """A lock cycle through compile_lock while a thread compiles inside torch.autograd.grad is the compile_lock /
    autograd cycle seen from another side (a sample where the device thread's frame was not the backward
    compiler yet): named as such, so every sample gives the same answer."""
    if not any(ref.identity == TORCH_COMPILE_LOCK for ref in locks):
        return None
    for stack in stacks:
        frame = _dynamo_compiling(stack)
        if frame is not None and _waits_on_autograd_engine(stack, frame):
            waiter = next((s for s in stacks if s is not stack and s.innermost is not None
                           and s.innermost.waits_for is not None
                           and s.innermost.waits_for.identity == TORCH_COMPILE_LOCK), None)
            if waiter is not None and waiter.innermost is not None:
                return _dynamo_diagnosis(stack, waiter, waiter.innermost.function, stalled_s)
    return None


def _stalled(stalled_s: float) -> str:
    # a dump read from a log says nothing of how long the process had been stuck
    return f"no progress for {stalled_s:.1f} s" if stalled_s else "stacks from a dump"
