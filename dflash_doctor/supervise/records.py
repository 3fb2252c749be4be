"""The per-process record: what the agent in one process of a `run` saw, and its one codec.

The agent builds a `ProcessRecord` and writes it with `encode` into the session folder (at a hang, at an FX error,
at a thread's death, at exit); the supervisor reads it back with `decode`, the same module, so a renamed field
fails here and loudly, never as a silent default. `decode` is strict: the version must match, every field must be
there with its type, numbers must be finite and within range; anything else (`"pid": 1e400`, nesting a thousand
deep, half a file) is a `RecordError`, which the supervisor turns into a problem, never an internal error.

`ProcessRecord.from_dict` is the lenient reader of the live rules' example documents (rules/live.py), which carry
only what the rules read; it is never used on what another process wrote.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

from dflash_doctor.findings import Problem
from dflash_doctor.outcomes import BlameKind, FailureKind, HangCycle, RecorderEventKind
from dflash_doctor.runtime.deadlock import HangDiagnosis
from dflash_doctor.runtime.recorder import Event
from dflash_doctor.runtime.lock_sites import LockRef
from dflash_doctor.runtime.stacks import Frame, ThreadStack
from dflash_doctor.wire import check_depth


@dataclass(frozen=True)
class BlameRecord:
    """The FX-tracing RuntimeError in `victim`, and who held the flag at the moment of the raise."""

    victim: str
    holder: Optional[str]
    kind: BlameKind
    error: str
    at_s: float
    holder_stack: Tuple[Frame, ...] = ()  # outermost first, captured in the victim's raise
    trace_start: Tuple[Frame, ...] = ()  # the holder's stack when its trace began (its line that started it)
    victim_stack: Tuple[Frame, ...] = ()  # the victim's stack at the raise

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BlameRecord":
        def frames(key: str) -> Tuple[Frame, ...]:
            return tuple(Frame.from_dict(f) for f in data.get(key) or ())

        return cls(str(data["victim"]), data.get("holder"), BlameKind(data.get("kind", BlameKind.UNKNOWN)),
                   str(data.get("error", "")), float(data.get("at_s", 0.0)), frames("holder_stack"),
                   frames("trace_start"), frames("victim_stack"))


@dataclass(frozen=True)
class DeathRecord:
    """A thread of the user's run whose target raised: caught around the thread's `run`, so a trainer that routes
    threading.excepthook to its logger is seen too. `tracing` names the other threads that were inside an FX trace
    at that moment, with the first one's stack: whose patches a module call went through, for the patcher race."""

    thread: str
    error_type: str
    error: str
    at_s: float
    patcher_race: bool  # the error is one of the FX patcher race's (runtime/fx_patches.PATCHER_ERROR_MARKS)
    raised_at: Tuple[Frame, ...] = ()  # the traceback, outermost first
    tracing: Tuple[str, ...] = ()
    tracing_stack: Tuple[Frame, ...] = ()
    last_tracer: Optional[str] = None  # when none traced at that moment: whose trace ended last, and when
    last_trace_at_s: Optional[float] = None
    replicated_compiled: bool = False  # a DataParallel replica of a torch.compile'd module (thread_roles)

    def to_dict(self) -> dict:
        return {"thread": self.thread, "error_type": self.error_type, "error": self.error, "at_s": self.at_s,
                "patcher_race": self.patcher_race, "raised_at": [f.to_dict() for f in self.raised_at],
                "tracing": list(self.tracing), "tracing_stack": [f.to_dict() for f in self.tracing_stack],
                "last_tracer": self.last_tracer, "last_trace_at_s": self.last_trace_at_s,
                "replicated_compiled": self.replicated_compiled}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DeathRecord":
        return cls(str(data["thread"]), str(data.get("error_type", "")), str(data.get("error", "")),
                   float(data.get("at_s", 0.0)), bool(data.get("patcher_race")),
                   tuple(Frame.from_dict(f) for f in data.get("raised_at") or ()),
                   tuple(str(t) for t in data.get("tracing") or ()),
                   tuple(Frame.from_dict(f) for f in data.get("tracing_stack") or ()),
                   data.get("last_tracer"), None if data.get("last_trace_at_s") is None
                   else float(data["last_trace_at_s"]), data.get("replicated_compiled") is True)


@dataclass(frozen=True)
class HangRecord:
    diagnosis: HangDiagnosis
    stacks: Tuple[ThreadStack, ...]
    detected_at_s: float  # seconds since the process's agent started
    last_clear_sample_at_s: Optional[float]  # the last stack sample that showed no cycle (None: none was taken)
    last_event_at_s: Optional[float] = None  # the last recorder event before the finding (nothing moved since)

    @property
    def latency_s(self) -> Optional[float]:
        """From the last sample without the cycle to the finding: an upper bound on how long the cycle went
        unreported."""
        if self.last_clear_sample_at_s is None:
            return None
        return round(self.detected_at_s - self.last_clear_sample_at_s, 3)

    def to_dict(self) -> dict:
        return {"diagnosis": self.diagnosis.to_dict(), "stacks": [s.to_dict() for s in self.stacks],
                "detected_at_s": self.detected_at_s, "last_clear_sample_at_s": self.last_clear_sample_at_s,
                "last_event_at_s": self.last_event_at_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HangRecord":
        raw = data["diagnosis"]
        diagnosis = HangDiagnosis(FailureKind(raw["kind"]), HangCycle(raw["cycle"]),
                                  tuple(raw.get("chain") or ()), tuple(raw.get("threads") or ()),
                                  float(raw.get("stalled_s") or 0.0),
                                  str(raw.get("hint") or ""), tuple(str(lock) for lock in raw.get("locks") or ()))
        clear, event = data.get("last_clear_sample_at_s"), data.get("last_event_at_s")
        return cls(diagnosis, tuple(ThreadStack.from_dict(s) for s in data.get("stacks") or ()),
                   float(data.get("detected_at_s") or 0.0), None if clear is None else float(clear),
                   None if event is None else float(event))


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    ppid: int
    argv: Tuple[str, ...]
    rank: Optional[int]  # RANK (torchrun), else None
    local_rank: Optional[int]
    torch_version: Optional[str]  # None: the process never imported torch
    fx_flag_thread_local: Optional[bool]  # read from the imported torch (2.14+ keeps the flag per thread)
    fixes: Tuple[str, ...]  # applied by `--fix`
    problems: Tuple[Problem, ...]
    events: Tuple[Event, ...]
    blames: Tuple[BlameRecord, ...]
    hang: Optional[HangRecord]
    deaths: Tuple[DeathRecord, ...]
    ended: Optional[str]  # exit | os._exit | None while it runs (or when it was killed)
    started_at: float  # wall clock (time.time()) of the agent's start: aligns processes in one trace
    fix_facts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # what each --fix set-up reported

    @property
    def label(self) -> str:
        return f"rank {self.rank} (pid {self.pid})" if self.rank is not None else f"pid {self.pid}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProcessRecord":
        def optional_int(key: str) -> Optional[int]:
            value = data.get(key)
            return None if value is None else int(value)

        return cls(
            pid=int(data["pid"]), ppid=int(data.get("ppid") or 0), argv=tuple(data.get("argv") or ()),
            rank=optional_int("rank"), local_rank=optional_int("local_rank"),
            torch_version=data.get("torch_version"), fx_flag_thread_local=data.get("fx_flag_thread_local"),
            fixes=tuple(data.get("fixes") or ()),
            problems=tuple(Problem(p["subject"], p["reason"], p.get("hint", "")) for p in data.get("problems") or ()),
            events=tuple(Event.from_dict(e) for e in data.get("events") or ()),
            blames=tuple(BlameRecord.from_dict(b) for b in data.get("blames") or ()),
            hang=None if not data.get("hang") else HangRecord.from_dict(data["hang"]),
            deaths=tuple(DeathRecord.from_dict(d) for d in data.get("deaths") or ()),
            ended=data.get("ended"), started_at=float(data.get("started_at") or 0.0),
        )


# -- the codec ------------------------------------------------------------------------------------------------
RECORD_VERSION = 1
MAX_DEPTH = 64  # the deepest a genuine record nests is 6 (record > hang > stacks > frame > enclosing_with > pair)
_T = TypeVar("_T")


class RecordError(ValueError):
    """What another process wrote is not a record of this version."""


def _field(data: Mapping[str, Any], key: str) -> Any:
    if not isinstance(data, dict):
        raise RecordError(f"expected an object holding {key!r}, got {type(data).__name__}")
    if key not in data:
        raise RecordError(f"missing field {key!r}")
    return data[key]


def _int(data: Mapping[str, Any], key: str) -> int:
    value = _field(data, key)
    if type(value) is not int or not -2 ** 63 <= value < 2 ** 63:
        raise RecordError(f"{key!r} is not an integer in range: {str(value)[:40]}")
    return value


def _float(data: Mapping[str, Any], key: str) -> float:
    value = _field(data, key)
    if type(value) not in (int, float) or not math.isfinite(value):
        raise RecordError(f"{key!r} is not a finite number: {str(value)[:40]}")
    return float(value)


def _str(data: Mapping[str, Any], key: str) -> str:
    value = _field(data, key)
    if not isinstance(value, str):
        raise RecordError(f"{key!r} is not a string")
    return value


def _bool(data: Mapping[str, Any], key: str) -> bool:
    value = _field(data, key)
    if not isinstance(value, bool):
        raise RecordError(f"{key!r} is not true or false")
    return value


def _optional(data: Mapping[str, Any], key: str, read: Callable[[Mapping[str, Any], str], _T]) -> Optional[_T]:
    return None if _field(data, key) is None else read(data, key)


def _list(data: Mapping[str, Any], key: str) -> List[Any]:
    value = _field(data, key)
    if not isinstance(value, list):
        raise RecordError(f"{key!r} is not a list")
    return value


def _strings(data: Mapping[str, Any], key: str) -> Tuple[str, ...]:
    values = _list(data, key)
    if not all(isinstance(value, str) for value in values):
        raise RecordError(f"{key!r} holds something other than strings")
    return tuple(values)


def _frame(data: Any) -> Frame:
    pairs = []
    for pair in _list(data, "enclosing_with"):
        if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int and isinstance(pair[1], str)):
            raise RecordError("'enclosing_with' holds something other than [line, text] pairs")
        pairs.append((pair[0], pair[1]))
    # the locks by identity (runtime/lock_sites.py): added later, so a record without them reads as no locks
    waits = data.get("waits_for") if isinstance(data, dict) else None
    holds = data.get("holds") if isinstance(data, dict) else None
    return Frame(_str(data, "file"), _int(data, "line"), _str(data, "function"), _str(data, "source"), tuple(pairs),
                 None if waits is None else _lock_ref(waits),
                 tuple(_lock_ref(ref) for ref in _optional_list(holds, "holds")))


def _lock_ref(value: Any) -> LockRef:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(part, str) for part in value)):
        raise RecordError("a lock is not an [identity, expression] pair")
    return LockRef(value[0], value[1])


def _optional_list(value: Any, key: str) -> List[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RecordError(f"{key!r} is not a list")
    return value


def _frames(data: Mapping[str, Any], key: str) -> Tuple[Frame, ...]:
    return tuple(_frame(item) for item in _list(data, key))


def _event(data: Any) -> Event:
    detail = _field(data, "detail")
    if not isinstance(detail, dict):
        raise RecordError("an event's 'detail' is not an object")
    return Event(_float(data, "t"), _str(data, "thread"), _int(data, "tid"),
                 _enum(data, "kind", RecorderEventKind), _str(data, "phase"), detail)


def _enum(data: Mapping[str, Any], key: str, kind: Callable[[str], _T]) -> _T:
    try:
        return kind(_str(data, key))
    except ValueError:
        raise RecordError(f"{key!r} is not one of its vocabulary: {str(data[key])[:40]}") from None


def _blame(data: Any) -> BlameRecord:
    def later(key: str) -> Tuple[Frame, ...]:  # added after the first version: absent reads as none
        return tuple(_frame(item) for item in _optional_list(data.get(key), key))

    return BlameRecord(_str(data, "victim"), _optional(data, "holder", _str), _enum(data, "kind", BlameKind),
                       _str(data, "error"), _float(data, "at_s"), _frames(data, "holder_stack"),
                       later("trace_start"), later("victim_stack"))


def _death(data: Any) -> DeathRecord:
    return DeathRecord(_str(data, "thread"), _str(data, "error_type"), _str(data, "error"), _float(data, "at_s"),
                       _bool(data, "patcher_race"), _frames(data, "raised_at"), _strings(data, "tracing"),
                       _frames(data, "tracing_stack"), _optional(data, "last_tracer", _str),
                       _optional(data, "last_trace_at_s", _float),
                       data.get("replicated_compiled") is True)  # added after the first version: absent is False


def _hang(data: Any) -> HangRecord:
    raw = _field(data, "diagnosis")
    locks = _optional_list(raw.get("locks") if isinstance(raw, dict) else None, "locks")
    if not all(isinstance(lock, str) for lock in locks):
        raise RecordError("'locks' holds something other than strings")
    diagnosis = HangDiagnosis(_enum(raw, "kind", FailureKind), _enum(raw, "cycle", HangCycle),
                              _strings(raw, "chain"), _strings(raw, "threads"), _float(raw, "stalled_s"),
                              _str(raw, "hint"), tuple(locks))
    stacks = tuple(ThreadStack(_str(s, "name"), _int(s, "ident"), _frames(s, "frames"), s.get("locks_read") is True)
                   for s in _list(data, "stacks"))
    return HangRecord(diagnosis, stacks, _float(data, "detected_at_s"),
                      _optional(data, "last_clear_sample_at_s", _float), _optional(data, "last_event_at_s", _float))


def _problem(data: Any) -> Problem:
    return Problem(_str(data, "subject"), _str(data, "reason"), _str(data, "hint"))


def _fix_facts(data: Mapping[str, Any]) -> Dict[str, Mapping[str, Any]]:
    raw = _field(data, "fix_facts")
    if not isinstance(raw, dict) or not all(isinstance(value, dict) for value in raw.values()):
        raise RecordError("'fix_facts' is not an object of objects")
    return dict(raw)


def _record(data: Any) -> ProcessRecord:
    if _field(data, "version") != RECORD_VERSION:
        raise RecordError(f"a record of version {str(data['version'])[:20]}, this reader knows {RECORD_VERSION}")
    return ProcessRecord(
        pid=_int(data, "pid"), ppid=_int(data, "ppid"), argv=_strings(data, "argv"),
        rank=_optional(data, "rank", _int), local_rank=_optional(data, "local_rank", _int),
        torch_version=_optional(data, "torch_version", _str),
        fx_flag_thread_local=_optional(data, "fx_flag_thread_local", _bool), fixes=_strings(data, "fixes"),
        problems=tuple(_problem(p) for p in _list(data, "problems")),
        events=tuple(_event(e) for e in _list(data, "events")),
        blames=tuple(_blame(b) for b in _list(data, "blames")),
        hang=_optional(data, "hang", lambda raw, key: _hang(raw[key])), deaths=tuple(_death(d) for d in _list(data, "deaths")),
        ended=_optional(data, "ended", _str), started_at=_float(data, "started_at"), fix_facts=_fix_facts(data))


def _frame_dict(frame: Frame) -> dict:
    return dict(frame.to_dict())


def _frames_out(frames: Sequence[Frame]) -> List[dict]:
    return [_frame_dict(f) for f in frames]


def to_document(record: ProcessRecord) -> Dict[str, Any]:
    hang = record.hang
    return {
        "version": RECORD_VERSION, "pid": record.pid, "ppid": record.ppid, "argv": list(record.argv),
        "rank": record.rank, "local_rank": record.local_rank, "torch_version": record.torch_version,
        "fx_flag_thread_local": record.fx_flag_thread_local, "fixes": list(record.fixes),
        "fix_facts": {name: dict(facts) for name, facts in record.fix_facts.items()},
        "problems": [p.to_dict() for p in record.problems],
        "events": [e.to_dict() for e in record.events],
        "blames": [{"victim": b.victim, "holder": b.holder, "kind": b.kind.value, "error": b.error, "at_s": b.at_s,
                    "holder_stack": _frames_out(b.holder_stack), "trace_start": _frames_out(b.trace_start),
                    "victim_stack": _frames_out(b.victim_stack)} for b in record.blames],
        "hang": None if hang is None else {
            "diagnosis": dict(hang.diagnosis.to_dict(), kind=hang.diagnosis.kind.value),
            "stacks": [{"name": s.name, "ident": s.ident, "frames": _frames_out(s.frames), "locks_read": s.locks_read}
                       for s in hang.stacks],
            "detected_at_s": hang.detected_at_s, "last_clear_sample_at_s": hang.last_clear_sample_at_s,
            "last_event_at_s": hang.last_event_at_s},
        "deaths": [dict(d.to_dict()) for d in record.deaths],
        "ended": record.ended, "started_at": record.started_at,
    }


def encode(record: ProcessRecord) -> bytes:
    # default=str: an event's detail or a fix's facts may hold a value JSON has no type for (a torch.Size)
    return json.dumps(to_document(record), default=str).encode("utf-8")


def decode(data: bytes) -> ProcessRecord:
    """The record `encode` wrote, or RecordError (see the module docstring)."""
    try:
        document = json.loads(data)
        check_depth(document, MAX_DEPTH, RecordError)
        return _record(document)
    except RecordError:
        raise
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError, UnicodeDecodeError) as exc:
        raise RecordError(f"not a record ({type(exc).__name__}: {str(exc)[:200]})") from None


def has_news(record: ProcessRecord) -> bool:
    """Whether a record holds something the supervisor announces while the command runs (a hang, a death)."""
    return record.hang is not None or bool(record.deaths)
