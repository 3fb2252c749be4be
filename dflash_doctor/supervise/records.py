"""The per-process record: what the agent in one process of a `run` saw, as the supervisor reads it back.

The agent writes it as JSON into the session folder (at a hang, at an FX error, at exit); `load` turns it back
into these frozen types, so the findings and the report never read a dict by string key.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional, Tuple

from dflash_doctor.findings import Problem
from dflash_doctor.outcomes import BlameKind, FailureKind
from dflash_doctor.runtime.deadlock import HangDiagnosis
from dflash_doctor.runtime.recorder import Event
from dflash_doctor.runtime.stacks import Frame, ThreadStack


@dataclass(frozen=True)
class BlameRecord:
    """The FX-tracing RuntimeError in `victim`, and who held the flag at the moment of the raise."""

    victim: str
    holder: Optional[str]
    kind: BlameKind
    error: str
    at_s: float
    holder_stack: Tuple[Frame, ...] = ()  # outermost first, captured in the victim's raise

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BlameRecord":
        return cls(str(data["victim"]), data.get("holder"), BlameKind(data.get("kind", BlameKind.UNKNOWN)),
                   str(data.get("error", "")), float(data.get("at_s", 0.0)),
                   tuple(Frame.from_dict(f) for f in data.get("holder_stack") or ()))


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

    def to_dict(self) -> dict:
        return {"thread": self.thread, "error_type": self.error_type, "error": self.error, "at_s": self.at_s,
                "patcher_race": self.patcher_race, "raised_at": [f.to_dict() for f in self.raised_at],
                "tracing": list(self.tracing), "tracing_stack": [f.to_dict() for f in self.tracing_stack],
                "last_tracer": self.last_tracer, "last_trace_at_s": self.last_trace_at_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DeathRecord":
        return cls(str(data["thread"]), str(data.get("error_type", "")), str(data.get("error", "")),
                   float(data.get("at_s", 0.0)), bool(data.get("patcher_race")),
                   tuple(Frame.from_dict(f) for f in data.get("raised_at") or ()),
                   tuple(str(t) for t in data.get("tracing") or ()),
                   tuple(Frame.from_dict(f) for f in data.get("tracing_stack") or ()),
                   data.get("last_tracer"), None if data.get("last_trace_at_s") is None
                   else float(data["last_trace_at_s"]))


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
        diagnosis = HangDiagnosis(FailureKind(raw["kind"]), str(raw["cycle"]), tuple(raw.get("chain") or ()),
                                  tuple(raw.get("threads") or ()), float(raw.get("stalled_s") or 0.0),
                                  str(raw.get("hint") or ""))
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


def load(path: Path) -> ProcessRecord:
    return ProcessRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))


def load_session(session: Path) -> Tuple[List[ProcessRecord], List[Problem]]:
    """Every record in a session folder, by rank then pid; a file that cannot be read is a problem."""
    from dflash_doctor.supervise.session import RECORD_PREFIX

    records, problems = [], []
    for path in sorted(session.glob(f"{RECORD_PREFIX}*.json")):
        try:
            records.append(load(path))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(Problem(path.name, f"the process record could not be read ({exc})",
                                    "the process may have been killed while writing it"))
    records.sort(key=lambda r: (r.rank is None, r.rank or 0, r.pid))
    return records, problems
