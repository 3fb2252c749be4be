"""The disturbances each mode adds inside a phase child (torch is imported here, inside the child only).

- amplified: `TracerBase.create_proxy` sleeps while the FX flag is set; time.sleep releases the GIL, so other
  threads run exactly while the flag is up (docs/races.md: it turned a rare race into a reliable one).
- forced: a holder thread sits inside a real `torch.fx` trace (`Tracer.trace` of a module whose forward blocks on
  an Event) while the workers call their compiled step.
- stuck: two traces exit out of order (A enters, B enters, A leaves, B leaves restoring the True it saw), so
  the module-global flag stays True with no trace running.
- foreign-trace: a thread loops `torch.fx.symbolic_trace` with the default tracer, as a profiler or a graph
  inspection would, while the workers run: its patches of nn.Module reach their eager module calls (the
  FX patcher race, docs/races.md).
"""
from __future__ import annotations

import functools
import threading
import time
import contextlib
from dataclasses import dataclass, field
from typing import Callable, ContextManager, List, Optional


def install_amplifier(sleep_ms: float, sleep: Callable[[float], None] = time.sleep,
                      on_sleep: Callable[[], None] = lambda: None) -> None:
    """Widen the race window: sleep `sleep_ms` in every FX proxy creation made while the FX flag is set.

    `on_sleep` runs after each sleep: the harness marks progress there, so a trace slowed down on purpose is not
    mistaken for a hang."""
    import torch.fx._symbolic_trace as symbolic_trace
    import torch.fx.proxy as fx_proxy

    original = fx_proxy.TracerBase.create_proxy

    @functools.wraps(original)
    def create_proxy(self, *args, **kwargs):
        if getattr(symbolic_trace, "_is_fx_tracing_flag", False):
            sleep(sleep_ms / 1000.0)
            on_sleep()
        return original(self, *args, **kwargs)

    setattr(fx_proxy.TracerBase, "create_proxy", create_proxy)  # process-wide, on purpose: every tracer


def _blocking_module(entered: threading.Event, release: threading.Event, hold_s: float):
    import torch

    class BlocksInsideTrace(torch.nn.Module):
        def forward(self, x):
            entered.set()
            release.wait(hold_s)
            return x + 1

    return BlocksInsideTrace()


@dataclass
class Disturbance:
    """Started before the workers; `stop()` lets a holder leave its trace."""

    threads: List[threading.Thread] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    description: str = ""
    errors: List[str] = field(default_factory=list)  # what the tracing threads themselves raised
    traces: Optional[List[int]] = None  # foreign-trace: how many traces the looping thread finished

    def wants_company(self, traces_at_start: int) -> bool:
        """foreign-trace: the workers should go on stepping until they have run beside TRACES_TO_FACE of the
        tracer's traces. A trace keeps its patches in place for a few milliseconds of every BETWEEN_TRACES_S, so
        a worker whose own steps end within a handful of traces can miss every window: one CI run's foreign-trace
        trial (workers done in 0.2 s) did, and "a foreign trace settles in one trial" did not hold."""
        if self.traces is None or self.errors or self.release.is_set():
            return False
        if not any(thread.is_alive() for thread in self.threads):
            return False
        return self.traces[0] - traces_at_start < TRACES_TO_FACE

    def stop(self, timeout_s: float = 10.0) -> None:
        self.release.set()
        for thread in self.threads:
            thread.join(timeout_s)


def _inlining_tracer():
    """A real `torch.fx.Tracer` that inlines submodules, as AOTAutograd's make_fx tracer does.

    While any Tracer.trace runs, torch.fx patches `nn.Module.__call__` process-wide; the default tracer would then
    try to record other threads' module calls as its own (NameError: module is not installed as a submodule).
    make_fx's tracer runs them through, so other threads reach their compiled call: the race we reproduce.
    """
    import torch.fx

    class InliningTracer(torch.fx.Tracer):
        def call_module(self, m, forward, args, kwargs):
            return forward(*args, **kwargs)

    return InliningTracer()


def _trace_in_thread(name: str, entered: threading.Event, release: threading.Event, hold_s: float,
                     thread_factory, errors: List[str]) -> threading.Thread:
    module = _blocking_module(entered, release, hold_s)
    tracer = _inlining_tracer()

    def trace() -> None:
        try:
            tracer.trace(module)
        except Exception as exc:  # noqa: BLE001 - torch.fx's other globals break too; reported, not fatal
            errors.append(f"{name}: {type(exc).__name__}: {exc}")

    thread = thread_factory(target=trace, name=name, daemon=True)
    thread.start()
    return thread


def hold_fx_flag(hold_s: float, *, name: str = "fx-holder", timeout_s: float = 30.0,
                 thread_factory=threading.Thread) -> Disturbance:
    """forced: return once a thread is inside a real FX trace, held there until stop() (or `hold_s`)."""
    disturbance = Disturbance(description=f"{name} holds the FX flag inside torch.fx.Tracer.trace")
    entered = threading.Event()
    disturbance.threads.append(_trace_in_thread(name, entered, disturbance.release, hold_s, thread_factory,
                                                disturbance.errors))
    if not entered.wait(timeout_s):
        raise RuntimeError(f"{name} never entered its FX trace")
    return disturbance


def leave_fx_flag_stuck(*, names=("fx-trace-a", "fx-trace-b"), timeout_s: float = 30.0,
                        thread_factory=threading.Thread) -> Disturbance:
    """stuck: A enters, B enters, A leaves, B leaves: B restores the True it saw on entry.

    On torch 2.13 B's exit also trips torch.fx's patcher bookkeeping (another module global); that error is kept
    in `errors`, not raised: the flag is stuck either way.
    """
    first, second = names
    errors: List[str] = []
    release_a, release_b = threading.Event(), threading.Event()
    entered_a, entered_b = threading.Event(), threading.Event()
    thread_a = _trace_in_thread(first, entered_a, release_a, timeout_s, thread_factory, errors)
    if not entered_a.wait(timeout_s):
        raise RuntimeError(f"{first} never entered its FX trace")
    thread_b = _trace_in_thread(second, entered_b, release_b, timeout_s, thread_factory, errors)
    if not entered_b.wait(timeout_s):
        raise RuntimeError(f"{second} never entered its FX trace")
    release_a.set()
    thread_a.join(timeout_s)
    release_b.set()
    thread_b.join(timeout_s)
    description = f"{first} and {second} left their traces out of order: the FX flag is stuck"
    if errors:
        description += f" (the traces themselves raised: {'; '.join(errors)})"
    return Disturbance([], description=description, errors=errors)


# A trace of the profiled module stays this long inside Tracer.trace with the GIL released, as a real model's
# trace (hundreds of modules) lasts, so the workers run while the patches are in place; between traces the
# tracer sleeps, as a profiler does, which also lets a worker waiting for a lock the tracer shares (global-lock)
# in and keeps the tracer from taking the GIL from the workers' compiles.
TRACE_PAUSE_S = 0.002
BETWEEN_TRACES_S = 0.02
# How many of the tracer's traces the workers run beside before a foreign-trace trial may end (about 0.6 s): each
# trace is a window of its own, so the chance of missing all of them falls geometrically with this count.
TRACES_TO_FACE = 25


def _profiled_module(pause_s: float):
    import torch

    class Profiled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            time.sleep(pause_s)
            return self.proj(x).relu()

    return Profiled()


def trace_alongside(hold_s: float, *, around: Callable[[], ContextManager[object]] = contextlib.nullcontext,
                    name: str = "fx-profiler", pause_s: float = TRACE_PAUSE_S, timeout_s: float = 30.0,
                    thread_factory=threading.Thread) -> Disturbance:
    """foreign-trace: return once a thread has started looping `torch.fx.symbolic_trace` (the default tracer),
    each trace inside `around()` (what the mitigations ask of a tracing thread), until stop() or `hold_s`.

    The thread stops at its first error, as a user's profiler thread would die of it; the error is kept."""
    import torch.fx

    disturbance = Disturbance(description=f"{name} loops torch.fx.symbolic_trace next to the workers", traces=[0])
    module = _profiled_module(pause_s)
    started = threading.Event()
    deadline = time.monotonic() + hold_s

    def loop() -> None:
        counts = disturbance.traces
        assert counts is not None
        while not disturbance.release.is_set() and time.monotonic() < deadline:
            try:
                with around():
                    started.set()
                    torch.fx.symbolic_trace(module)
            except Exception as exc:  # noqa: BLE001 - the race's evidence, kept for the classifier
                disturbance.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                started.set()
                return
            counts[0] += 1
            time.sleep(BETWEEN_TRACES_S)

    thread = thread_factory(target=loop, name=name, daemon=True)
    disturbance.threads.append(thread)
    thread.start()
    if not started.wait(timeout_s):
        raise RuntimeError(f"{name} never started tracing")
    return disturbance
