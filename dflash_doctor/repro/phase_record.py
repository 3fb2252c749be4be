"""What one repro phase child saw (`PhaseRecord`), and its one codec: the child writes it, the parent reads it.

repro/child.py builds a `PhaseRecord` and writes it with `write` as its last act (RESULT.json, atomically), and its
workers' names with `write_thread_names` (threads.json, for a faulthandler dump the parent may have to read after
killing it). The parent (runner.py, sharing.py) reads both back with `read` and `read_thread_names`, the same
module, and from there on works with the typed record (classify.py, harness.py): nothing parses the text itself.

Reading is strict: the version must match, every field must be there with its type, numbers finite, every word one
of its vocabulary. Anything else (a renamed field, a missing one, half a file) is a `PhaseRecordError` naming the
field, never a silent default; the parent turns it into a trial without a verdict and a problem that says so.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from dflash_doctor.findings import Problem
from dflash_doctor.outcomes import BlameKind, FailureKind, HangCycle, RecorderEventKind, ThreadOutcome
from dflash_doctor.runtime.deadlock import HangDiagnosis
from dflash_doctor.runtime.fx_flag import ShimStatus
from dflash_doctor.runtime.fx_patches import PatchIsolation
from dflash_doctor.runtime.lock_sites import LockRef
from dflash_doctor.runtime.recorder import Blame, Event
from dflash_doctor.runtime.stacks import Frame, ThreadStack
from dflash_doctor.wire import Fields, WireError, load_json

PHASE_RECORD_VERSION = 1
THREAD_NAMES_VERSION = 1
PHASES = ("single", "multi", "disturb")  # PhaseSpec.phase: the control, a trial, a `processes` disturbance alone
MAX_DEPTH = 64  # the deepest a genuine record nests is 7 (record > blame > frames > frame > holds > ref > part)


class PhaseRecordError(WireError):
    """What a phase child left is not a record of this version."""


@dataclass(frozen=True)
class ThreadRecord:
    """One worker thread of a phase."""

    name: str
    outcome: ThreadOutcome
    error: Optional[str]
    steps: int
    seconds: float = 0.0  # from its start barrier to its end (0.0: it never ended, or the parent made it up)
    traceback: Optional[str] = None  # where it raised
    # Read inside the worker, where the switches live (thread-local); None where it never ran that far.
    autograd_multithreading: Optional[bool] = None
    switches: Optional[Mapping[str, str]] = None  # every switch the applied mitigations declare, as repr()
    lazy_backward_compiles: Optional[int] = None  # None: the phase hung before they were counted


@dataclass(frozen=True)
class TracingThreadRecord:
    """The foreign-trace stress's looping symbolic_trace thread (it stands for the user's profiler)."""

    name: str
    outcome: ThreadOutcome
    error: Optional[str]
    traces: int


@dataclass(frozen=True)
class SelfCheck:
    """A mitigation's own check, run in the child right after it was installed."""

    ok: bool
    detail: str


@dataclass(frozen=True)
class SetupReport:
    """What the mitigations' set-ups reported (mitigations.py `setup` hooks), one field per key a hook returns."""

    shim: Optional[ShimStatus] = None
    shim_check: Optional[SelfCheck] = None
    fx_patches: Optional[PatchIsolation] = None
    fx_patches_check: Optional[SelfCheck] = None
    non_lazy_backward_was: Optional[bool] = None

    @classmethod
    def from_setups(cls, reported: Mapping[str, Any]) -> "SetupReport":
        """The set-up hooks' dicts merged, read as strictly as the wire: a hook that reports a key this record has
        no field for fails here, in the child, rather than vanish on its way to the parent."""
        return _setup_report(dict(reported))


@dataclass(frozen=True)
class ProcessPart:
    """One worker process of a `processes` trial, merged into its phase by the parent (classify.py)."""

    threads: Tuple[str, ...]
    events: Tuple[Event, ...]


@dataclass(frozen=True)
class PhaseRecord:
    phase: str  # PHASES
    outcome: ThreadOutcome  # the whole phase's
    seconds: float  # the child's own time, from its set-up to its result
    threads: Tuple[ThreadRecord, ...] = ()
    events: Tuple[Event, ...] = ()
    blame: Tuple[Blame, ...] = ()
    problems: Tuple[Problem, ...] = ()
    hang: Optional[HangDiagnosis] = None
    stacks: Tuple[ThreadStack, ...] = ()  # every thread at the hang
    setup: SetupReport = field(default_factory=SetupReport)
    warmup_s: Tuple[float, ...] = ()  # per step, where a mitigation warms up before the workers start
    setup_s: Optional[float] = None  # building the steps (and any warm-up)
    run_s: Optional[float] = None  # the workers' own time
    disturbance: Optional[str] = None  # what the stress did beside the workers, in words
    tracing_thread: Optional[TracingThreadRecord] = None
    torch_version: Optional[str] = None  # None: the child never got as far as importing torch
    python: Optional[str] = None
    pid: Optional[int] = None
    gc_frozen: Optional[int] = None  # objects kept out of the child's collections (a warm-start fork keeps some)
    cpu_s: Optional[float] = None  # CPU seconds of the child and its compile workers; None: not readable
    usage_error: Optional[str] = None  # a --model that cannot be imported or built
    # Filled only by the parent, for a child that left no record (runner.read_phase_result):
    crash: Optional[str] = None  # how it ended
    log_tail: Optional[str] = None
    timed_out_busy: bool = False  # killed at --timeout while still making progress: no verdict
    killed_after_s: Optional[float] = None  # a disturbance child the parent ended at its timeout
    processes: Tuple[ProcessPart, ...] = ()  # a `processes` trial: one child per worker, merged


# -- writing --------------------------------------------------------------------------------------------------
def _blame_out(blame: Blame) -> Dict[str, Any]:
    return dict(blame.to_dict(), kind=blame.kind.value)


def _hang_out(hang: HangDiagnosis) -> Dict[str, Any]:
    return dict(hang.to_dict(), kind=hang.kind.value)


def _thread_out(thread: ThreadRecord) -> Dict[str, Any]:
    return {"name": thread.name, "outcome": thread.outcome.value, "error": thread.error, "steps": thread.steps,
            "seconds": thread.seconds, "traceback": thread.traceback,
            "autograd_multithreading": thread.autograd_multithreading,
            "switches": None if thread.switches is None else dict(thread.switches),
            "lazy_backward_compiles": thread.lazy_backward_compiles}


def _setup_out(setup: SetupReport) -> Dict[str, Any]:
    def check(value: Optional[SelfCheck]) -> Optional[Dict[str, Any]]:
        return None if value is None else {"ok": value.ok, "detail": value.detail}

    return {"shim": None if setup.shim is None else setup.shim.to_dict(), "shim_check": check(setup.shim_check),
            "fx_patches": None if setup.fx_patches is None else setup.fx_patches.to_dict(),
            "fx_patches_check": check(setup.fx_patches_check), "non_lazy_backward_was": setup.non_lazy_backward_was}


def to_document(record: PhaseRecord) -> Dict[str, Any]:
    tracer = record.tracing_thread
    return {
        "version": PHASE_RECORD_VERSION, "phase": record.phase, "outcome": record.outcome.value,
        "seconds": record.seconds, "threads": [_thread_out(t) for t in record.threads],
        "events": [e.to_dict() for e in record.events], "blame": [_blame_out(b) for b in record.blame],
        "problems": [p.to_dict() for p in record.problems],
        "hang": None if record.hang is None else _hang_out(record.hang),
        "stacks": [dict(s.to_dict()) for s in record.stacks],
        "setup": _setup_out(record.setup), "warmup_s": list(record.warmup_s), "setup_s": record.setup_s,
        "run_s": record.run_s, "disturbance": record.disturbance,
        "tracing_thread": None if tracer is None else {"name": tracer.name, "outcome": tracer.outcome.value,
                                                       "error": tracer.error, "traces": tracer.traces},
        "torch_version": record.torch_version, "python": record.python, "pid": record.pid,
        "gc_frozen": record.gc_frozen, "cpu_s": record.cpu_s, "usage_error": record.usage_error,
        "crash": record.crash, "log_tail": record.log_tail, "timed_out_busy": record.timed_out_busy,
        "killed_after_s": record.killed_after_s,
        "processes": [{"threads": list(p.threads), "events": [e.to_dict() for e in p.events]}
                      for p in record.processes],
    }


def encode(record: PhaseRecord) -> bytes:
    # default=str: an event's detail may hold a value JSON has no type for (a torch.Size)
    return json.dumps(to_document(record), default=str).encode("utf-8")


def write(path: Path, record: PhaseRecord) -> None:
    """Atomically: a parent that sees the file sees all of it (runner.ChildProcess.poll ends the child then)."""
    from dflash_doctor.outputs import write_atomically

    write_atomically(path, encode(record))


# -- reading --------------------------------------------------------------------------------------------------
def _fields(data: Any, what: str) -> Fields:
    """One JSON object of the record, read strictly (dflash_doctor/wire.py); what it cannot read is a PhaseRecordError."""
    return Fields(data, what, PhaseRecordError)


def _lock_ref(value: Any) -> LockRef:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(part, str) for part in value)):
        raise PhaseRecordError("a lock is not an [identity, expression] pair")
    return LockRef(value[0], value[1])


def _frame(data: Any) -> Frame:
    f = _fields(data, "a frame")
    pairs = []
    for pair in f.items("enclosing_with"):
        if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int and isinstance(pair[1], str)):
            raise PhaseRecordError("a frame's 'enclosing_with' holds something other than [line, text] pairs")
        pairs.append((pair[0], pair[1]))
    waits = f.raw("waits_for")
    return Frame(f.text("file"), f.integer("line"), f.text("function"), f.text("source"), tuple(pairs),
                 None if waits is None else _lock_ref(waits), tuple(_lock_ref(ref) for ref in f.items("holds")))


def _frames(f: Fields, key: str) -> Tuple[Frame, ...]:
    return tuple(_frame(item) for item in f.items(key))


def _event(data: Any) -> Event:
    f = _fields(data, "an event")
    return Event(f.number("t"), f.text("thread"), f.integer("tid"), f.word("kind", RecorderEventKind), f.text("phase"),
                 f.mapping("detail"))


def _blame(data: Any) -> Blame:
    f = _fields(data, "a blame")
    return Blame(f.text("victim"), f.optional("holder", f.text), f.number("at_s"), f.word("kind", BlameKind),
                 f.text("error"), _frames(f, "holder_stack"), _frames(f, "trace_start"), _frames(f, "victim_stack"))


def _problem(data: Any) -> Problem:
    f = _fields(data, "a problem")
    return Problem(f.text("subject"), f.text("reason"), f.text("hint"))


def _hang(data: Any) -> HangDiagnosis:
    f = _fields(data, "the hang")
    return HangDiagnosis(f.word("kind", FailureKind), f.word("cycle", HangCycle), f.texts("chain"), f.texts("threads"),
                         f.number("stalled_s"), f.text("hint"), f.texts("locks"))


def _stack(data: Any) -> ThreadStack:
    f = _fields(data, "a stack")
    return ThreadStack(f.text("name"), f.integer("ident"), _frames(f, "frames"), f.flag("locks_read"))


def _switches(f: Fields) -> Optional[Mapping[str, str]]:
    value = f.raw("switches")
    if value is not None and not (isinstance(value, dict) and all(isinstance(v, str) for v in value.values())):
        raise PhaseRecordError(f"{f.what}'s 'switches' is not an object of strings")
    return value


def _thread(data: Any) -> ThreadRecord:
    f = _fields(data, "a thread")
    return ThreadRecord(f.text("name"), f.word("outcome", ThreadOutcome), f.optional("error", f.text), f.integer("steps"),
                        f.number("seconds"), f.optional("traceback", f.text),
                        f.optional("autograd_multithreading", f.flag), _switches(f),
                        f.optional("lazy_backward_compiles", f.integer))


def _tracing_thread(data: Any) -> TracingThreadRecord:
    f = _fields(data, "the tracing thread")
    return TracingThreadRecord(f.text("name"), f.word("outcome", ThreadOutcome), f.optional("error", f.text),
                               f.integer("traces"))


def _self_check(data: Any) -> SelfCheck:
    f = _fields(data, "a self-check")
    return SelfCheck(f.flag("ok"), f.text("detail"))


def _setup_report(data: Any) -> SetupReport:
    f = _fields(data, "the set-up report")
    known = {item.name for item in fields(SetupReport)}
    unknown = sorted(set(f.data) - known)
    if unknown:  # a set-up hook (mitigations.py) reports what this record has no field for
        raise PhaseRecordError(f"the set-up report has fields this record does not know: {', '.join(unknown)}")
    read = {key: f.data.get(key) for key in known}  # the child merges only the hooks that ran: absent is None

    def shim(value: Any) -> ShimStatus:
        g = _fields(value, "the shim")
        return ShimStatus(g.text("state"), g.text("detail"), g.texts("patched"), g.integer("stale_wrappers"))

    def patches(value: Any) -> PatchIsolation:
        g = _fields(value, "the patch isolation")
        return PatchIsolation(g.text("state"), g.text("detail"), g.texts("replaced"))

    was = read["non_lazy_backward_was"]
    if was is not None and not isinstance(was, bool):
        raise PhaseRecordError("the set-up report's 'non_lazy_backward_was' is not true or false")
    return SetupReport(
        shim=None if read["shim"] is None else shim(read["shim"]),
        shim_check=None if read["shim_check"] is None else _self_check(read["shim_check"]),
        fx_patches=None if read["fx_patches"] is None else patches(read["fx_patches"]),
        fx_patches_check=None if read["fx_patches_check"] is None else _self_check(read["fx_patches_check"]),
        non_lazy_backward_was=was)


def _strict_setup(data: Any) -> SetupReport:
    """On the wire every field is written (None where no hook reported it): a missing one is refused."""
    f = _fields(data, "the set-up report")
    for item in fields(SetupReport):
        f.raw(item.name)
    return _setup_report(data)


def _process(data: Any) -> ProcessPart:
    f = _fields(data, "a process")
    return ProcessPart(f.texts("threads"), tuple(_event(e) for e in f.items("events")))


def _record(data: Any) -> PhaseRecord:
    f = _fields(data, "the phase record")
    f.version(PHASE_RECORD_VERSION)
    phase = f.text("phase")
    if phase not in PHASES:
        raise PhaseRecordError(f"the phase record's 'phase' is not one of {', '.join(PHASES)}: {phase[:40]}")
    return PhaseRecord(
        phase=phase, outcome=f.word("outcome", ThreadOutcome), seconds=f.number("seconds"),
        threads=tuple(_thread(t) for t in f.items("threads")), events=tuple(_event(e) for e in f.items("events")),
        blame=tuple(_blame(b) for b in f.items("blame")), problems=tuple(_problem(p) for p in f.items("problems")),
        hang=f.optional("hang", lambda key: _hang(f.data[key])), stacks=tuple(_stack(s) for s in f.items("stacks")),
        setup=_strict_setup(f.raw("setup")), warmup_s=tuple(_number(w, "warmup_s") for w in f.items("warmup_s")),
        setup_s=f.optional("setup_s", f.number), run_s=f.optional("run_s", f.number),
        disturbance=f.optional("disturbance", f.text),
        tracing_thread=f.optional("tracing_thread", lambda key: _tracing_thread(f.data[key])),
        torch_version=f.optional("torch_version", f.text), python=f.optional("python", f.text),
        pid=f.optional("pid", f.integer), gc_frozen=f.optional("gc_frozen", f.integer), cpu_s=f.optional("cpu_s", f.number),
        usage_error=f.optional("usage_error", f.text), crash=f.optional("crash", f.text),
        log_tail=f.optional("log_tail", f.text), timed_out_busy=f.flag("timed_out_busy"),
        killed_after_s=f.optional("killed_after_s", f.number),
        processes=tuple(_process(p) for p in f.items("processes")))


def _number(value: Any, key: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise PhaseRecordError(f"{key!r} holds something other than finite numbers")
    return float(value)


def _loads(data: bytes) -> Any:
    return load_json(data, MAX_DEPTH, PhaseRecordError)


def decode(data: bytes) -> PhaseRecord:
    """The record `encode` wrote, or PhaseRecordError (see the module docstring)."""
    return _record(_loads(data))


def read(path: Path) -> PhaseRecord:
    """The record a child wrote at `path`; OSError when there is none, PhaseRecordError when it is not one."""
    return decode(path.read_bytes())


# -- the workers' names (threads.json) -------------------------------------------------------------------------
def write_thread_names(path: Path, names: Mapping[int, str]) -> None:
    """The worker threads' idents and names, written once they started: a faulthandler dump names threads only
    by ident, and the parent reads it after the child was killed, when no record came."""
    from dflash_doctor.outputs import write_atomically

    document = {"version": THREAD_NAMES_VERSION, "threads": {str(ident): name for ident, name in names.items()}}
    write_atomically(path, json.dumps(document).encode("utf-8"))


def read_thread_names(path: Path) -> Dict[int, str]:
    """What `write_thread_names` wrote; OSError when there is none, PhaseRecordError when it is not that."""
    f = _fields(_loads(path.read_bytes()), "the thread names")
    f.version(THREAD_NAMES_VERSION)
    names = f.mapping("threads")
    if not all(ident.isdigit() and isinstance(name, str) for ident, name in names.items()):
        raise PhaseRecordError("the thread names are not an object of idents to names")
    return {int(ident): name for ident, name in names.items()}
