"""`dflash-doctor guards`: is compiled code safe to call from several threads, with *this* torch?

Public API:
- `run_guards(probes=True, timeout=30.0, ...) -> Report`: the whole check (layout, state, probes, hazards, fixes).
- `read_layout(torch_root) -> Layout`: the guard layout read from a torch package folder's source (AST only).
- `read_layout_text(bundle) -> Layout`: the same over stand-in sources in one `# ==> PATH <==` bundle.
- `findings_for_example(example_format, text)`: what a DFD6xx rule example yields (the examples' tests).

Nothing here imports torch at import time; the probes run in child processes (probe_host.py). The names above
load on first use, so the rule table can read `guards.advice` without loading the analysis and its runner.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Layout": "dflash_doctor.guards.layout",
    "analyze": "dflash_doctor.guards.layout",
    "read_layout": "dflash_doctor.guards.layout",
    "read_layout_text": "dflash_doctor.guards.layout",
    "findings_for_example": "dflash_doctor.guards.hazards",
    "run_guards": "dflash_doctor.guards.run",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
