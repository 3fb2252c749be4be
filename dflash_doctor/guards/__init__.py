"""`dflash-doctor guards`: is compiled code safe to call from several threads, with *this* torch?

Public API:
- `run_guards(probes=True, timeout=30.0, ...) -> Report`: the whole check (layout, state, probes, verdict).
- `read_layout(torch_root) -> Layout`: the guard layout read from a torch package folder's source (AST only).
- `read_layout_text(bundle) -> Layout`: the same over stand-in sources in one `# ==> PATH <==` bundle.
- `findings_for_example(example_format, text)`: what a DFD6xx rule example yields (the examples' tests).

Nothing here imports torch at import time; the probes run in child processes (probe_host.py).
"""
from dflash_doctor.guards.hazards import findings_for_example
from dflash_doctor.guards.layout import Layout, analyze, read_layout, read_layout_text
from dflash_doctor.guards.run import run_guards

__all__ = ["Layout", "analyze", "findings_for_example", "read_layout", "read_layout_text", "run_guards"]
