"""The flight recorder: per-thread events of FX traces, Dynamo compiles, steps and exceptions, with blame.

Install it in your own trainer (`dflash_doctor.runtime.install()`), wrap each training step in
`recorder.step()`, and when a thread dies with the FX RuntimeError the recorder says which thread held the FX
flag at that moment: a thread inside `Tracer.trace` (a leak) or the thread whose trace exit left the flag stuck.

Hooks (installed once, process-wide; `uninstall()` removes them):
- `torch.fx.Tracer.trace` is wrapped to log enter/exit per thread and spot a stuck flag on exit;
- Dynamo's compile start/end callbacks log compiles (including lazy backward compiles);
- Dynamo's recompilation-reason function is wrapped to log why a frame recompiled (e.g. a device-index guard);
- `threading.excepthook` is chained to log uncaught exceptions with their thread name.
The hooks cost nothing in steady state (no trace, no compile); a step costs two event appends.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import time
from types import FrameType
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple, TypedDict

from dflash_doctor.outcomes import BlameKind, RecorderEventKind
from dflash_doctor.runtime.stacks import Frame, FrameFacts, frames_of, light_frames, with_source_lines
from dflash_doctor.runtime.thread_roles import replica_of, thread_label

FX_ERROR_PREFIX = "Detected that you are using FX to symbolically trace a dynamo-optimized function"


def is_fx_flag_error(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and str(exc).startswith(FX_ERROR_PREFIX)


@dataclass(frozen=True)
class Event:
    """One recorded moment. phase is Chrome-trace style: B begin, E end, I instant."""

    t: float  # seconds since the recorder started
    thread: str
    tid: int
    kind: RecorderEventKind
    phase: str
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"t": self.t, "thread": self.thread, "tid": self.tid, "kind": self.kind, "phase": self.phase,
                "detail": self.detail}

    @classmethod
    def from_dict(cls, data: dict) -> "Event":
        return cls(float(data["t"]), str(data["thread"]), int(data["tid"]),
                   RecorderEventKind(data["kind"]), str(data["phase"]),
                   dict(data.get("detail") or {}))


class BlameFacts(TypedDict):
    """A Blame as the facts JSON writes it (Blame.to_dict): pipeline, repro and run reports carry it."""

    victim: str
    holder: Optional[str]
    at_s: float
    kind: str  # outcomes.BlameKind
    error: str
    holder_stack: List[FrameFacts]
    trace_start: List[FrameFacts]
    victim_stack: List[FrameFacts]


@dataclass(frozen=True)
class Blame:
    victim: str
    holder: Optional[str]
    at_s: float
    kind: BlameKind
    error: str
    # Where the (first) holder was at the moment of the raise, outermost first: read from sys._current_frames()
    # in the victim's thread, so it is the holder's stack while it still held the flag, not after.
    holder_stack: Tuple[Frame, ...] = ()
    # The holder's stack when its FX trace began (taken then, by the holder itself): its own line that started
    # the trace, the line to change. And the victim's stack at the raise, for its own line.
    trace_start: Tuple[Frame, ...] = ()
    victim_stack: Tuple[Frame, ...] = ()

    def to_dict(self) -> BlameFacts:
        return {"victim": self.victim, "holder": self.holder, "at_s": round(self.at_s, 6), "kind": self.kind,
                "error": self.error, "holder_stack": [frame.to_dict() for frame in self.holder_stack],
                "trace_start": [frame.to_dict() for frame in self.trace_start],
                "victim_stack": [frame.to_dict() for frame in self.victim_stack]}


class FlightRecorder:
    """Thread-safe event log. `clock` is injected so tests can drive time."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.started = clock()
        self.events: List[Event] = []
        self.blames: List[Blame] = []
        self.last_progress = self.started  # any event counts as progress (the watchdog reads it)
        self._lock = threading.Lock()
        self._inside: Dict[int, int] = {}  # thread id -> FX trace depth
        self._names: Dict[int, str] = {}
        self._trace_starts: Dict[int, Tuple[Frame, ...]] = {}  # thread id -> its stack when its last trace began
        self.stuck_by: Optional[str] = None  # thread whose trace exit left the global flag True
        # Called with (exception, label) when a replica thread's error is caught and wrapped by parallel_apply:
        # the thread lives on and the caller may catch the re-raise, so nothing else would see it.
        self.caught_in_replica: List[Callable[[BaseException, str], None]] = []

    # -- recording ---------------------------------------------------------------------------------------
    def mark_progress(self) -> None:
        """Progress without an event (e.g. a deliberately slowed trace): keeps the watchdog quiet."""
        self.last_progress = self._clock()

    def now(self) -> float:
        return self._clock() - self.started

    def record(self, kind: RecorderEventKind, phase: str = "I", **detail) -> Event:
        thread = threading.current_thread()
        t = self._clock()
        event = Event(t - self.started, thread.name, thread.ident or 0, kind, phase, detail)
        self.events.append(event)  # list.append is atomic under the GIL
        self.last_progress = t
        return event

    @contextlib.contextmanager
    def step(self, index: Optional[int] = None):
        """Wrap one training step: logs begin/end, and an exception (with blame) if the step raises."""
        self.record(RecorderEventKind.STEP, "B", index=index)
        try:
            yield
        except BaseException as exc:
            self.exception(exc)
            self.record(RecorderEventKind.STEP, "E", index=index, ok=False)
            raise
        self.record(RecorderEventKind.STEP, "E", index=index, ok=True)

    def exception(self, exc: BaseException) -> Optional[Blame]:
        """Log `exc` for the calling thread; for the FX RuntimeError also name the thread that held the flag."""
        blame = self.blame_for(exc) if is_fx_flag_error(exc) else None
        self.record(RecorderEventKind.EXCEPTION, "I", type=type(exc).__name__, message=str(exc)[:500],
                    holder=blame.holder if blame else None)
        if blame is not None:
            with self._lock:
                self.blames.append(blame)
        return blame

    def blame_for(self, exc: BaseException) -> Blame:
        me = threading.get_ident()
        with self._lock:
            holding = sorted((self._names.get(tid, f"thread-{tid}"), tid) for tid, depth in self._inside.items()
                             if depth > 0 and tid != me)
            self_inside = self._inside.get(me, 0) > 0
            stuck_by = self.stuck_by
        victim = thread_label()
        mine = with_source_lines(light_frames(sys._getframe(1)))
        if holding:
            top = sys._current_frames().get(holding[0][1])
            stack = tuple(frames_of(top)) if top is not None else ()
            return Blame(victim, ", ".join(name for name, _ in holding), self.now(), BlameKind.FX_FLAG_LEAK,
                         str(exc), stack, self._start_of(holding[0][1]), mine)
        if stuck_by is not None:
            return Blame(victim, stuck_by, self.now(), BlameKind.STUCK_FLAG, str(exc),
                         trace_start=self.trace_start_of(stuck_by), victim_stack=mine)
        if self_inside:
            return Blame(victim, victim, self.now(), BlameKind.NESTED_TRACE, str(exc),
                         trace_start=self._start_of(me), victim_stack=mine)
        return Blame(victim, None, self.now(), BlameKind.UNKNOWN, str(exc), victim_stack=mine)

    def _start_of(self, ident: int) -> Tuple[Frame, ...]:
        with self._lock:
            return with_source_lines(self._trace_starts.get(ident, ()))

    def trace_start_of(self, name: str) -> Tuple[Frame, ...]:
        """The named thread's stack when its latest FX trace began (kept after the trace ended)."""
        with self._lock:
            ident = next((tid for tid, known in self._names.items() if known == name), None)
        return self._start_of(ident) if ident is not None else ()

    def tracing_now(self) -> List[Tuple[str, Tuple[Frame, ...]]]:
        """The other threads inside an FX trace at this moment, each with its stack: whose patches a module call
        of this thread may have gone through (the FX patcher race), read the moment the caller learns of it."""
        me = threading.get_ident()
        with self._lock:
            holding = sorted((self._names.get(tid, f"thread-{tid}"), tid) for tid, depth in self._inside.items()
                             if depth > 0 and tid != me)
        frames = sys._current_frames()
        return [(name, tuple(frames_of(frames.get(tid)))) for name, tid in holding]

    def last_tracer(self, include_self: bool = False) -> Optional[Tuple[str, float]]:
        """(the other thread whose FX trace ended last, when): who traced just before, when none traces now.
        `include_self`: the caller's own traces count too (an error another thread raised, re-raised here)."""
        me = None if include_self else threading.get_ident()
        for event in reversed(self.events):
            if event.kind == RecorderEventKind.FX_TRACE and event.tid != me:
                return event.thread, event.t
        return None

    def fx_holders(self) -> List[str]:
        with self._lock:
            return sorted(self._names.get(tid, f"thread-{tid}") for tid, depth in self._inside.items() if depth > 0)

    # -- hook callbacks ----------------------------------------------------------------------------------
    def _trace_enter(self, caller: Optional[FrameType] = None) -> None:
        thread = threading.current_thread()
        ident = threading.get_ident()
        # Taken by the tracing thread itself as the trace begins: the stack that started it, not one read later
        # from another thread while this one has moved on.
        start = light_frames(caller) if caller is not None else ()
        with self._lock:
            depth = self._inside.get(ident, 0)
            self._inside[ident] = depth + 1
            self._names[ident] = thread.name
            if depth == 0 and start:
                self._trace_starts[ident] = start
        self.record(RecorderEventKind.FX_TRACE, "B")

    def _trace_exit(self, global_flag: Optional[bool]) -> None:
        thread = threading.current_thread()
        ident = threading.get_ident()
        stuck = False
        with self._lock:
            self._inside[ident] = self._inside.get(ident, 1) - 1
            nobody_inside = not any(depth > 0 for depth in self._inside.values())
            if global_flag and nobody_inside and self.stuck_by is None:
                self.stuck_by = thread.name
                stuck = True
            elif global_flag is False:
                self.stuck_by = None
        self.record(RecorderEventKind.FX_TRACE, "E")
        if stuck:
            self.record(RecorderEventKind.STUCK_FLAG, "I",
                        note="trace exit restored a stale True: the global FX flag is stuck")

    def to_dicts(self) -> List[dict]:
        return [event.to_dict() for event in self.events]


# -- process-wide hooks --------------------------------------------------------------------------------------
_ACTIVE: Optional[FlightRecorder] = None
_UNDO: List[Callable[[], None]] = []
_hook_lock = threading.Lock()


def active_recorder() -> Optional[FlightRecorder]:
    return _ACTIVE


def install(recorder: Optional[FlightRecorder] = None) -> FlightRecorder:
    """Install the recorder's hooks into torch (once per process) and make `recorder` the active one.

    Safe to call before or after `torch.compile`: the hooks sit on torch.fx and Dynamo, not on your wrappers.
    """
    global _ACTIVE
    with _hook_lock:
        _ACTIVE = recorder or FlightRecorder()
        if not _UNDO:
            _install_hooks()
        return _ACTIVE


def uninstall() -> None:
    """Remove every hook and forget the active recorder."""
    global _ACTIVE
    with _hook_lock:
        while _UNDO:
            _UNDO.pop()()
        _ACTIVE = None


def _patch(owner, name: str, replacement) -> None:
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    _UNDO.append(lambda: setattr(owner, name, original))


def _install_hooks() -> None:
    from dflash_doctor.errors import require_torch

    require_torch("the flight recorder")
    import torch.fx._symbolic_trace as symbolic_trace

    original_trace = symbolic_trace.Tracer.trace

    @functools.wraps(original_trace)
    def trace(self, *args, **kwargs):
        recorder = _ACTIVE
        if recorder is None:
            return original_trace(self, *args, **kwargs)
        recorder._trace_enter(sys._getframe(1))
        try:
            return original_trace(self, *args, **kwargs)
        finally:
            recorder._trace_exit(getattr(symbolic_trace, "_is_fx_tracing_flag", None))

    _patch(symbolic_trace.Tracer, "trace", trace)
    _install_dynamo_hooks()

    original_excepthook = threading.excepthook

    def excepthook(args):
        recorder = _ACTIVE
        if recorder is not None and args.exc_value is not None:
            recorder.exception(args.exc_value)
        original_excepthook(args)

    _patch(threading, "excepthook", excepthook)
    _hook_replica_errors()


def _hook_replica_errors() -> None:
    """parallel_apply's `_worker` catches a replica's exception into an ExceptionWrapper(where='in replica I on
    device D'); creating one in a replica thread is that replica's failure, told to the listeners."""
    try:
        import torch._utils as torch_utils
    except ImportError:
        return
    wrapper = getattr(torch_utils, "ExceptionWrapper", None)
    if wrapper is None:
        return
    original_init = wrapper.__init__

    @functools.wraps(original_init)
    def init(self, exc_info=None, where="in background"):
        original_init(self, exc_info, where)
        recorder = _ACTIVE
        if recorder is None or replica_of(threading.current_thread()) is None:
            return
        error = (exc_info or sys.exc_info())[1]
        if error is None:
            return
        label = thread_label(where=str(where))
        recorder.record(RecorderEventKind.REPLICA_ERROR, "I", type=type(error).__name__, message=str(error)[:200],
                        replica=label)
        for listener in list(recorder.caught_in_replica):
            with contextlib.suppress(Exception):  # the tool's trouble never changes the user's error
                listener(error, label)

    _patch(wrapper, "__init__", init)


def _install_dynamo_hooks() -> None:
    """Compile start/end and recompile reasons; skipped quietly on releases without these entry points."""
    try:
        import torch._dynamo.callback as dynamo_callback
        import torch._dynamo.convert_frame as convert_frame
    except ImportError:
        return
    handler = getattr(dynamo_callback, "callback_handler", None)
    if handler is not None and hasattr(handler, "register_start_callback"):
        def on_start(args) -> None:
            if _ACTIVE is not None:
                _ACTIVE.record(RecorderEventKind.COMPILE, "B", trigger=_trigger_name(args),
                               compile_id=_compile_id(args), caller=_user_line(sys._getframe(1)))

        def on_end(args) -> None:
            if _ACTIVE is not None:
                _ACTIVE.record(RecorderEventKind.COMPILE, "E", trigger=_trigger_name(args),
                               compile_id=_compile_id(args))

        handler.register_start_callback(on_start)
        handler.register_end_callback(on_end)
        def remove() -> None:
            handler.remove_start_callback(on_start)
            handler.remove_end_callback(on_end)

        _UNDO.append(remove)

    reasons_fn = getattr(convert_frame, "get_and_maybe_log_recompilation_reasons", None)
    if reasons_fn is not None:
        @functools.wraps(reasons_fn)
        def reasons(*args, **kwargs):
            result = reasons_fn(*args, **kwargs)
            if _ACTIVE is not None:
                _ACTIVE.record(RecorderEventKind.RECOMPILE, "I", reason=(result[0] if result else "unknown")[:300])
            return result

        _patch(convert_frame, "get_and_maybe_log_recompilation_reasons", reasons)

    limit_fn = getattr(convert_frame, "exceeds_recompile_limit", None)
    if limit_fn is not None:  # convert_frame calls it through its module global: wrapping that is enough
        @functools.wraps(limit_fn)
        def exceeds(*args, **kwargs):
            result = limit_fn(*args, **kwargs)
            hit = result[0] if isinstance(result, tuple) else bool(result)
            if hit and _ACTIVE is not None:
                _ACTIVE.record(RecorderEventKind.RECOMPILE_LIMIT, "I",
                               limit=str(result[1] if isinstance(result, tuple) else "")[:80],
                               compile_id=str(args[1] if len(args) > 1 else kwargs.get("compile_id", "")))
            return result

        _patch(convert_frame, "exceeds_recompile_limit", exceeds)


GUARDS_PASSED = "even though they passed"  # Dynamo's words for guards that failed at runtime yet passed on analysis


@dataclass(frozen=True)
class CompileStart:
    """A Dynamo compile as the recorder logged it: which frame (the compile id's first part), by which thread."""

    thread: str
    t: float
    frame: str  # "0" of compile id "0/3": one code object
    attempt: str  # "3": the frame's fourth compile
    caller: Optional[Frame] = None  # the user's line whose call started it


@dataclass(frozen=True)
class RecompileSigns:
    """What the events say of threads racing on one compiled function's first calls (docs/races.md, "Races that
    show as recompiles"): who compiled which frame, recompiles whose guards 'passed', recompile-limit hits."""

    compiles: Tuple[CompileStart, ...]
    guards_passed: Tuple[Tuple[str, str], ...]  # (thread, reason) of "guards failed even though they passed"
    limit_hits: Tuple[Tuple[str, str], ...]  # (thread, compile id)


def recompile_signs(events) -> RecompileSigns:
    """Read the recorder's own compile, recompile and recompile-limit events back (this module writes them)."""
    compiles, passed, hits = [], [], []
    for event in events:
        if event.kind == RecorderEventKind.COMPILE and event.phase == "B":
            frame, _, attempt = str(event.detail.get("compile_id", "")).partition("/")
            caller = event.detail.get("caller")
            at = Frame(str(caller[0]), int(caller[1]), "") if isinstance(caller, list) and len(caller) == 2 else None
            if frame and event.detail.get("trigger", "dynamo") == "dynamo":
                compiles.append(CompileStart(event.thread, event.t, frame.strip("[]"), attempt.strip("[]"), at))
        elif event.kind == RecorderEventKind.RECOMPILE and GUARDS_PASSED in str(event.detail.get("reason", "")):
            passed.append((event.thread, str(event.detail.get("reason", ""))))
        elif event.kind == RecorderEventKind.RECOMPILE_LIMIT:
            hits.append((event.thread, str(event.detail.get("compile_id", ""))))
    return RecompileSigns(tuple(compiles), tuple(passed), tuple(hits))


_TOOL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARY_DIRS: Tuple[str, ...] = ()


def _user_line(frame: Optional[FrameType]) -> Optional[List[object]]:
    """[file, line] of the innermost frame of the user's own code (not the standard library's, torch's, a
    package's or this tool's): the line whose call started a compile."""
    global _LIBRARY_DIRS
    if not _LIBRARY_DIRS:
        import sysconfig

        paths = sysconfig.get_paths()
        _LIBRARY_DIRS = tuple({paths["stdlib"], paths["purelib"], paths["platlib"], _TOOL_DIR})
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<") and not name.startswith(_LIBRARY_DIRS) and os.sep + "torch" + os.sep not in name:
            return [name, frame.f_lineno or 0]
        frame = frame.f_back
    return None


def _compile_id(args) -> str:
    return str(getattr(args, "compile_id", ""))


def _trigger_name(args) -> str:
    trigger = getattr(args, "callback_trigger", None)
    return getattr(trigger, "name", str(trigger)).lower()
