"""The live probes. They run only inside a probe child process (see probe_host.py), never in the caller: a probe
that reproduces the stuck flag leaves its interpreter corrupted for good.

`PROBES` is the one place a probe is declared (name, hazard, the rule its reproduction reports, function): the
probe host's choices, `guards`' run, the verdict and the findings all read it.

Each takes the imported torch, an already compiled function (`backend="eager"`), a wait bound for its Events
and a reader for the FX flag, and returns a ProbeResult (host_document.py): its outcome and detail. Every step is
ordered by Events, so a result does not depend on thread timing; an exception escaping a probe is reported as
outcome `error`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from dflash_doctor.guards.host_document import ProbeResult
from dflash_doctor.guards.layout import GUARD_MESSAGE
from dflash_doctor.hazards import Hazard
from dflash_doctor.outcomes import ProbeOutcome
from dflash_doctor.rules import guards as rules
from dflash_doctor.rules.registry import Rule


def _outcome(outcome: ProbeOutcome, detail: str) -> ProbeResult:
    return ProbeResult(outcome, detail=detail)


def _is_guard_error(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and GUARD_MESSAGE in str(exc)


def _blocking_module(torch, entered: threading.Event, release: threading.Event, wait_s: float):
    """A module whose forward, run by symbolic_trace inside Tracer.trace, signals and then waits."""

    class BlockingForward(torch.nn.Module):
        def forward(self, x):
            entered.set()
            release.wait(wait_s)
            return x

    return BlockingForward()


def _start_trace(torch, entered, release, wait_s: float, name: str, failures: Optional[list] = None):
    """Run symbolic_trace of a blocking module in a thread; what it raises goes to `failures`, not stderr."""
    module = _blocking_module(torch, entered, release, wait_s)

    def trace():
        try:
            torch.fx.symbolic_trace(module)
        except BaseException as exc:  # noqa: BLE001 - part of the probe's evidence
            if failures is not None:
                failures.append(f"{name}: {exc.__class__.__name__}: {exc}")

    thread = threading.Thread(target=trace, name=name, daemon=True)
    thread.start()
    return thread


def cross_thread_leak(torch, compiled, wait_s: float, read_flag: Callable[[], Optional[bool]]) -> ProbeResult:
    """Thread A is inside an FX trace; does thread B's call of an already compiled function raise?"""
    entered, release = threading.Event(), threading.Event()
    tracer = _start_trace(torch, entered, release, wait_s, "thread A")
    try:
        if not entered.wait(wait_s):
            return _outcome(ProbeOutcome.ERROR, "the tracing thread never reached its forward")
        try:
            compiled(torch.ones(2))
        except RuntimeError as exc:
            if _is_guard_error(exc):
                return _outcome(ProbeOutcome.REPRODUCED, f"thread B raised while thread A traced: {exc}")
            raise
        return _outcome(ProbeOutcome.NOT_REPRODUCED, "thread B's compiled call ran while thread A was inside symbolic_trace")
    finally:
        release.set()
        tracer.join(wait_s)


def stuck_flag(torch, compiled, wait_s: float, read_flag: Callable[[], Optional[bool]]) -> ProbeResult:
    """A enters Tracer.trace, B enters, A leaves, B leaves: is the flag left set, and do compiled calls raise?"""
    a_in, a_go, b_in, b_go = (threading.Event() for _ in range(4))
    failures: list = []
    first = _start_trace(torch, a_in, a_go, wait_s, "trace A", failures)
    if not a_in.wait(wait_s):
        a_go.set()
        return _outcome(ProbeOutcome.ERROR, "trace A never reached its forward")
    second = _start_trace(torch, b_in, b_go, wait_s, "trace B", failures)
    if not b_in.wait(wait_s):
        a_go.set()
        b_go.set()
        return _outcome(ProbeOutcome.ERROR, "trace B never reached its forward")
    a_go.set()
    first.join(wait_s)
    b_go.set()
    second.join(wait_s)
    if first.is_alive() or second.is_alive():
        return _outcome(ProbeOutcome.ERROR, "a trace did not finish")
    at_rest = read_flag()
    # On exit out of order the tracer's own (also global) patcher state can fail too: worth showing.
    also = f" (the traces themselves raised: {'; '.join(failures)})" if failures else ""
    try:
        compiled(torch.ones(2))
    except RuntimeError as exc:
        if _is_guard_error(exc):
            return _outcome(ProbeOutcome.REPRODUCED, f"after both traces ended (FX flag at rest: {at_rest}), a compiled "
                                        f"call raised: {exc}{also}")
        raise
    return _outcome(ProbeOutcome.NOT_REPRODUCED, f"after both traces ended the FX flag is {at_rest} and compiled calls "
                                    f"run{also}")


def is_compiling_leak(torch, compiled, wait_s: float, read_flag: Callable[[], Optional[bool]]) -> ProbeResult:
    """While thread A's compile is held inside its backend, does thread B see torch.compiler.is_compiling()?"""
    started, release = threading.Event(), threading.Event()
    failure = []

    def blocking_backend(graph_module, example_inputs):
        started.set()
        release.wait(wait_s)
        return graph_module.forward

    fresh = torch.compile(lambda x: x * 2, backend=blocking_backend)

    def compile_in_thread():
        try:
            fresh(torch.ones(2))
        except BaseException as exc:  # noqa: BLE001 - reported below as the probe's error
            failure.append(exc)

    compiler = threading.Thread(target=compile_in_thread, name="probe-compiler", daemon=True)
    compiler.start()
    try:
        if not started.wait(wait_s):
            return _outcome(ProbeOutcome.ERROR, f"the compile never reached its backend{_failure_text(failure)}")
        seen = torch.compiler.is_compiling()
    finally:
        release.set()
        compiler.join(wait_s)
    if failure:
        return _outcome(ProbeOutcome.ERROR, f"the compile in thread A failed{_failure_text(failure)}")
    if seen:
        return _outcome(ProbeOutcome.REPRODUCED, "thread B saw torch.compiler.is_compiling() == True during thread A's compile")
    return _outcome(ProbeOutcome.NOT_REPRODUCED, "thread B saw torch.compiler.is_compiling() == False during thread A's compile")


def patcher_race(torch, compiled, wait_s: float, read_flag: Callable[[], Optional[bool]]) -> ProbeResult:
    """Thread A is inside symbolic_trace; does thread B's plain eager nn.Linear call meet A's patches?"""
    entered, release = threading.Event(), threading.Event()
    failures: list = []
    tracer = _start_trace(torch, entered, release, wait_s, "thread A", failures)
    try:
        if not entered.wait(wait_s):
            return _outcome(ProbeOutcome.ERROR, "the tracing thread never reached its forward")
        try:
            torch.nn.Linear(2, 2)(torch.ones(1, 2))
        except NameError as exc:
            return _outcome(ProbeOutcome.REPRODUCED, f"thread B's eager nn.Linear raised while thread A traced: "
                                                     f"NameError: {exc}")
        return _outcome(ProbeOutcome.NOT_REPRODUCED, "thread B's eager nn.Linear ran while thread A was inside "
                                                     "symbolic_trace")
    finally:
        release.set()
        tracer.join(wait_s)


def _failure_text(failure: list) -> str:
    return f": {failure[0].__class__.__name__}: {failure[0]}" if failure else ""


@dataclass(frozen=True)
class Probe:
    name: str
    hazard: Hazard  # what a reproduction proves present on this install
    rule: Rule  # the finding a reproduction makes (a guards-state rule whose example reproduces this probe)
    run: Callable[..., ProbeResult]


# The compile-lock deadlock has no probe: it needs the autograd engine's device thread, i.e. a GPU.
PROBES: Tuple[Probe, ...] = (
    Probe("cross_thread_leak", Hazard.FX_FLAG_LEAK, rules.PROBE_CROSS_THREAD_LEAK, cross_thread_leak),
    Probe("stuck_flag", Hazard.STUCK_FLAG, rules.PROBE_STUCK_FLAG, stuck_flag),
    Probe("is_compiling_leak", Hazard.IS_COMPILING_LEAK, rules.PROBE_IS_COMPILING_LEAK, is_compiling_leak),
    Probe("patcher_race", Hazard.PATCHER_RACE, rules.PROBE_PATCHER_RACE, patcher_race),
)
PROBE_NAMES: Tuple[str, ...] = tuple(probe.name for probe in PROBES)
BY_NAME: Dict[str, Probe] = {probe.name: probe for probe in PROBES}
