"""`dflash-doctor guards`: is compiled code safe to call from several threads, with *this* torch?

Public API:
- `run_guards(probes=True, timeout=30.0, ...) -> Report`: the whole check (layout, state, probes, hazards, fixes).
- `read_layout(torch_root) -> Layout`: the guard layout read from a torch package folder's source (AST only).
- `read_layout_text(bundle) -> Layout`: the same over stand-in sources in one `# ==> PATH <==` bundle.
- `findings_for_example(example_format, text)`: what a DFD6xx rule example yields (the examples' tests).

Nothing here imports torch at import time; the probes run in child processes (probe_host.py). The names above
load on first use (each imported inside `__getattr__`), so a module that needs one part of guards, such as
repro's capabilities reading `guards.torch_sources`, does not load the analysis and its runner.
"""
from __future__ import annotations

from typing import Any

_LAYOUT = ("Layout", "analyze", "read_layout", "read_layout_text")
__all__ = sorted(_LAYOUT + ("findings_for_example", "run_guards"))


def __getattr__(name: str) -> Any:
    if name in _LAYOUT:
        from dflash_doctor.guards import layout

        return getattr(layout, name)
    if name == "findings_for_example":
        from dflash_doctor.guards.hazard_findings import findings_for_example

        return findings_for_example
    if name == "run_guards":
        from dflash_doctor.guards.run import run_guards

        return run_guards
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
