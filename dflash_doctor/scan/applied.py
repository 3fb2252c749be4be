"""`AppliedFix`: one mitigation a scanned file applies (fixes.py finds them, the engine judges DFD201 under them).

A plain record, apart from fixes.py so that the file context holding a file's fixes need not import the check that
finds them (which imports the context).
"""
from __future__ import annotations

from dataclasses import dataclass

from dflash_doctor.mitigations import REGISTRY

# Fixes a worker thread must enter itself (a thread-local switch): they count only inside what a thread runs.
PER_THREAD = frozenset(m.name for m in REGISTRY if m.in_each_thread is not None)
# Fixes that stop a foreign FX trace's race only when the tracing thread holds them around its trace (global-lock's
# fx_trace_lock): for an FX-trace finding they count only inside what that thread runs.
AROUND_TRACE = frozenset(m.name for m in REGISTRY if getattr(m, "around_foreign_trace", None) is not None)


@dataclass(frozen=True)
class AppliedFix:
    mitigation: str  # the registry name
    path: str
    line: int
    spelled: str  # the marker as found
    enclosing: str = ""  # the function it is applied in ("" at module level): per-thread fixes need a thread's
    # torch's own compile setting assigned (not the tool's runtime API): from torch 2.12 it lives in the assigning
    # thread's context, so it counts only inside what a thread runs (compile_settings.py)
    setting: bool = False
    # the runtime's marker entered as a `with` item: a per-thread form, for the entering thread only (a lock held
    # around a trace is judged as such instead, AROUND_TRACE)
    entered: bool = False

    @property
    def per_thread(self) -> bool:
        return self.mitigation in PER_THREAD or self.setting or (self.entered and not self.around_trace)

    @property
    def around_trace(self) -> bool:
        return self.mitigation in AROUND_TRACE

    def to_dict(self) -> dict:
        return {"mitigation": self.mitigation, "path": self.path, "line": self.line, "marker": self.spelled}
