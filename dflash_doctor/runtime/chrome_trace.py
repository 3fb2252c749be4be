"""Export recorder events as Chrome trace JSON (the "Trace Event Format"; opens in Perfetto and chrome://tracing).

One process row per phase (e.g. single-thread, multi-thread), one track per thread; FX traces, compiles and
steps are begin/end slices, exceptions, recompiles, a stuck flag and a hang are instant markers.
"""
from __future__ import annotations

import json
from typing import Iterable, Mapping, Sequence

from dflash_doctor.outcomes import RecorderEventKind
from dflash_doctor.runtime.recorder import Event

_NAMES = {RecorderEventKind.FX_TRACE: "FX trace", RecorderEventKind.COMPILE: "Dynamo compile",
          RecorderEventKind.STEP: "step"}


def _event_name(event: Event) -> str:
    if event.kind == RecorderEventKind.COMPILE:
        return f"compile ({event.detail.get('trigger', 'dynamo')})"
    if event.kind == RecorderEventKind.EXCEPTION:
        return f"{event.detail.get('type', 'exception')}"
    if event.kind == RecorderEventKind.STEP and event.detail.get("index") is not None:
        return f"step {event.detail['index']}"
    return _NAMES.get(event.kind, event.kind)


def chrome_trace(phases: Sequence[tuple]) -> dict:
    """`phases` is a sequence of (phase name, events); events are Event objects or their dicts."""
    trace_events = []
    for pid, (phase_name, events) in enumerate(phases, start=1):
        trace_events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": phase_name}})
        named = {}
        for raw in events:
            event = raw if isinstance(raw, Event) else Event.from_dict(raw)
            if event.tid not in named:
                named[event.tid] = event.thread
                trace_events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": event.tid,
                                     "args": {"name": event.thread}})
            entry = {"name": _event_name(event), "cat": event.kind, "ph": "i" if event.phase == "I" else event.phase,
                     "ts": round(event.t * 1e6, 3), "pid": pid, "tid": event.tid, "args": _args(event.detail)}
            if entry["ph"] == "i":
                entry["s"] = "t"
            trace_events.append(entry)
    return {"traceEvents": trace_events, "displayTimeUnit": "ms"}


def _args(detail: Mapping) -> dict:
    return {key: value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
            for key, value in detail.items()}


def write_chrome_trace(path, phases: Iterable[tuple]) -> None:
    """Write the trace atomically (dflash_doctor.outputs), so Perfetto never opens half a file."""
    from pathlib import Path

    from dflash_doctor.outputs import write_atomically

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(chrome_trace(list(phases))))
