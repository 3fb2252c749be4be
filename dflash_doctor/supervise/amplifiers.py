"""`run --amplify`: inside every Python process `run` starts, make a rare race likely without changing what the
user's code computes. The agent calls `at_start` as it starts (at the process's first Thread.start() or import
torch, before any of the user's threads runs) and
`after_torch` right after torch's own import; nothing here imports torch before the user's code does.

- switch-interval: `sys.setswitchinterval(SWITCH_INTERVAL_S)`. The interpreter asks the running thread to drop the
  GIL every 0.2 ms instead of every 5 ms, so a thread inside a torch.fx trace (the flag set, the patches on the
  nn.Module classes) is preempted inside it far more often, and another thread's call lands in the window. It
  changes when threads run, never what they compute.
- foreign-trace: a daemon thread of the tool's own (named FOREIGN_TRACE_THREAD, so findings name it) loops
  `torch.fx.symbolic_trace` over a small module of its own beside the user's threads, as a profiler or a
  graph-inspection thread does. A race it shows is one the run has IF a thread traces with FX while it runs; the
  report says so.
"""
from __future__ import annotations

import sys
import threading
from typing import Callable, Iterable, Optional

from dflash_doctor.vocabularies import Amplifier

# The value a user made a rare patcher race decisive with (3 of 3 under it, on a 2-core box; docs/races.md).
SWITCH_INTERVAL_S = 0.0002
FOREIGN_TRACE_THREAD = "dflash-doctor-foreign-trace"
FOREIGN_TRACE_PAUSE_S = 0.001  # between two traces: the window stays open most of the time without a busy loop

_STOP = threading.Event()


def parse(names: Iterable[str]) -> tuple:
    """The amplifiers a run config names, as the enum (an unknown name is a config from another version)."""
    return tuple(Amplifier(name) for name in names)


def describe(amplifier: Amplifier) -> str:
    """The amplifier as the report names it, so the result can be reproduced by hand."""
    if amplifier is Amplifier.SWITCH_INTERVAL:
        return f"sys.setswitchinterval({SWITCH_INTERVAL_S}) in every Python process before its first thread"
    return ("a thread looping torch.fx.symbolic_trace over a small module beside your threads "
            f"({FOREIGN_TRACE_THREAD})")


def at_start(amplifiers: Iterable[Amplifier]) -> None:
    if Amplifier.SWITCH_INTERVAL in amplifiers:
        sys.setswitchinterval(SWITCH_INTERVAL_S)


def after_torch(amplifiers: Iterable[Amplifier],
                thread_factory: Callable[..., threading.Thread] = threading.Thread) -> Optional[threading.Thread]:
    """Start the foreign trace (once torch is imported: the tracer is torch's own)."""
    if Amplifier.FOREIGN_TRACE not in amplifiers:
        return None
    import atexit

    atexit.register(_STOP.set)  # the interpreter's exit must not wait on a trace, nor trace while torch unloads
    thread = thread_factory(target=_trace_forever, name=FOREIGN_TRACE_THREAD, daemon=True)
    thread.start()
    return thread


def _trace_forever() -> None:
    import torch
    from torch.fx import symbolic_trace

    class Probe(torch.nn.Module):
        """What a graph-inspection thread traces: a small block of the kind trainers are made of."""

        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(16)
            self.up = torch.nn.Linear(16, 32)
            self.down = torch.nn.Linear(32, 16)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(self.norm(x))))

    probe = Probe()
    while not _STOP.is_set():
        try:
            symbolic_trace(probe)
        except Exception:  # noqa: BLE001 - its own trace may meet another thread's patcher; it goes on tracing
            pass
        _STOP.wait(FOREIGN_TRACE_PAUSE_S)
