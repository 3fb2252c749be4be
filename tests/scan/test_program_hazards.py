"""What a program must fix is what its threads do, and a fix counts where it acts: the registry's entries judged
against a compiled call in a thread and an FX trace in a thread; single-threaded autograd only inside the worker."""
from __future__ import annotations

import textwrap

import pytest

from dflash_doctor.findings import Severity
from dflash_doctor.hazards import Hazard
from dflash_doctor.mitigations import BY_NAME, REGISTRY, Mitigation
from dflash_doctor.rules.scan import COMPILED_CALL_IN_THREAD, FX_TRACE_IN_THREAD, SCAN_RULES
from dflash_doctor.scan import scan_source

COMPILED = """\
import threading

import torch
import torch.fx
from dflash_doctor import runtime

step = torch.compile(lambda x: x * 2)
{module_fix}

def drafter(x):
{thread_fix}    return step(x)


def profiler(module):
    return torch.fx.symbolic_trace(module)


threading.Thread(target=drafter, args=(1,)).start()
{tracer}"""
TRACER = "threading.Thread(target=profiler, args=(None,)).start()\n"
RUNTIME_MARKERS = [(m, marker) for m in REGISTRY for marker in m.source_markers
                   if not marker.startswith("force_") and marker != "set_multithreading_enabled"]


def trainer(entry: Mitigation, marker: str, traced: bool) -> str:
    """A trainer applying one registry fix where it acts: a per-thread switch around the worker's steps, anything
    else at module level before the threads start."""
    call = f"runtime.{marker}(lambda: 0)"
    if entry.in_each_thread is not None:
        return COMPILED.format(module_fix="", thread_fix=f"    with {call}:\n        pass\n",
                               tracer=TRACER if traced else "")
    return COMPILED.format(module_fix=call + "\n", thread_fix="", tracer=TRACER if traced else "")


def thread_findings(source: str) -> dict:
    return {f.code: f for f in scan_source(source) if f.code in (COMPILED_CALL_IN_THREAD.code,
                                                                  FX_TRACE_IN_THREAD.code)}


@pytest.mark.parametrize("traced", [False, True], ids=["compiled-call", "compiled-call-and-fx-trace"])
@pytest.mark.parametrize("entry,marker", RUNTIME_MARKERS, ids=[f"{m.name}:{k}" for m, k in RUNTIME_MARKERS])
def test_every_registry_fix_is_judged_by_what_it_covers(entry, marker, traced):
    found = thread_findings(trainer(entry, marker, traced))
    assert set(found) == ({COMPILED_CALL_IN_THREAD.code, FX_TRACE_IN_THREAD.code} if traced
                          else {COMPILED_CALL_IN_THREAD.code})
    needed = frozenset(h for code in found for h in SCAN_RULES[code].hazards)
    gaps = [h for h in Hazard if h in needed - entry.covers]
    for code, finding in found.items():
        applied = [a["mitigation"] for a in finding.evidence["mitigations"]["applied"]]
        if entry.in_each_thread is not None and code == FX_TRACE_IN_THREAD.code:
            # the switch is entered by the drafter, not by the profiler thread this finding is about
            assert applied == [] and finding.severity is Severity.ERROR
            assert "a per-thread switch this thread does not enter" in finding.message
            continue
        if getattr(entry, "around_foreign_trace", None) is not None and code == FX_TRACE_IN_THREAD.code:
            # applied at module level: the profiler does not hold it around its trace
            assert applied == [] and finding.severity is Severity.ERROR
            assert "not held around this FX trace" in finding.message
            continue
        assert applied == [entry.name]
        if not gaps and entry.recommended:
            assert finding.severity is Severity.INFO
            assert f"mitigated by {entry.name} (<string>:" in finding.message
        else:
            assert finding.severity is Severity.ERROR
            if gaps:
                assert f"leaves open: {', '.join(h.label for h in gaps)}" in finding.message


def test_the_readme_fix_does_not_mitigate_a_trainer_with_a_tracing_thread():
    fix = "runtime.install_threadlocal_fx_flag()\nruntime.enable_non_lazy_backward()\n"
    found = thread_findings(COMPILED.format(module_fix=fix, thread_fix="", tracer=TRACER))
    assert {code: f.severity for code, f in found.items()} == {
        COMPILED_CALL_IN_THREAD.code: Severity.ERROR, FX_TRACE_IN_THREAD.code: Severity.ERROR}
    assert all(f"leaves open: {Hazard.PATCHER_RACE.label}" in f.message for f in found.values())
    # without the tracing thread the same fix is enough
    [alone] = thread_findings(COMPILED.format(module_fix=fix, thread_fix="", tracer="")).values()
    assert alone.severity is Severity.INFO


needs_single_thread_autograd = pytest.mark.skipif(
    "single-thread-autograd" not in BY_NAME or "set_multithreading_enabled" not in
    BY_NAME.get("single-thread-autograd", REGISTRY[0]).source_markers,
    reason="the registry has no single-thread-autograd entry yet")
FLAG = "runtime.install_threadlocal_fx_flag()\n"


@needs_single_thread_autograd
@pytest.mark.parametrize("thread_fix", [
    "    with torch.autograd.set_multithreading_enabled(False):\n        pass\n",
    "    with torch.autograd.set_multithreading_enabled(mode=False):\n        pass\n",
    "    torch.autograd.grad_mode.set_multithreading_enabled(False)\n",
])
def test_single_threaded_autograd_entered_by_the_worker_completes_the_fix(thread_fix):
    [finding] = thread_findings(COMPILED.format(module_fix=FLAG, thread_fix=thread_fix, tracer="")).values()
    assert finding.severity is Severity.INFO
    assert "mitigated by threadlocal-flag (<string>:8), single-thread-autograd (<string>:12)" in finding.message


@needs_single_thread_autograd
def test_single_threaded_autograd_in_a_function_the_worker_calls_counts():
    source = textwrap.dedent("""\
        import threading

        import torch
        from dflash_doctor import runtime

        runtime.install_threadlocal_fx_flag()
        step = torch.compile(lambda x: x * 2)


        def loop(x):
            with torch.autograd.set_multithreading_enabled(False):
                for _ in range(3):
                    step(x)


        def drafter(x):
            loop(x)


        threading.Thread(target=drafter, args=(1,)).start()
    """)
    [finding] = thread_findings(source).values()
    assert finding.severity is Severity.INFO


@needs_single_thread_autograd
@pytest.mark.parametrize("module_fix,thread_fix,why", [
    (FLAG + "torch.autograd.set_multithreading_enabled(False)\n", "",
     "single-thread-autograd (<string>:9): a per-thread switch this thread does not enter"),
    (FLAG + "with torch.autograd.set_multithreading_enabled(False):\n    pass\n", "",
     "single-thread-autograd (<string>:9): a per-thread switch this thread does not enter"),
    (FLAG, "    with torch.autograd.set_multithreading_enabled(True):\n        pass\n", ""),
    (FLAG, "    torch.autograd.set_multithreading_enabled(enabled)\n", ""),
])
def test_single_threaded_autograd_in_the_main_thread_or_switched_on_is_no_fix(module_fix, thread_fix, why):
    [finding] = thread_findings(COMPILED.format(module_fix=module_fix, thread_fix=thread_fix, tracer="")).values()
    assert finding.severity is Severity.ERROR
    assert f"leaves open: {Hazard.DEADLOCK.label}" in finding.message
    assert why in finding.message
    assert [a["mitigation"] for a in finding.evidence["mitigations"]["applied"]] == ["threadlocal-flag"]


AROUND_TRACE = [m for m in REGISTRY if getattr(m, "around_foreign_trace", None) is not None
                and "fx_trace_lock" in m.source_markers]
LOCKED = """\
import threading

import torch.fx
from dflash_doctor import runtime

{step_lock}def step(x):
    return x


def profiler(module):
{trace_lock}    return torch.fx.symbolic_trace(module)


threading.Thread(target=step, args=(1,)).start()
threading.Thread(target=profiler, args=(None,)).start()
"""


@pytest.mark.skipif(not AROUND_TRACE, reason="no registry fix is held around a foreign trace yet")
@pytest.mark.parametrize("step_lock,trace_lock,severity,why", [
    ("@runtime.global_lock\n", "    with runtime.fx_trace_lock():\n        pass\n", Severity.INFO, ""),
    ("@runtime.global_lock\n", "", Severity.ERROR, "not held around this FX trace"),
    ("", "    with runtime.fx_trace_lock():\n        pass\n", Severity.ERROR,
     "held around this FX trace, but nothing else in the program takes it"),
])
def test_a_lock_counts_for_a_tracing_thread_only_when_both_the_trace_and_the_steps_take_it(
        step_lock, trace_lock, severity, why):
    [finding] = [f for f in scan_source(LOCKED.format(step_lock=step_lock, trace_lock=trace_lock))
                 if f.code == FX_TRACE_IN_THREAD.code]
    assert finding.severity is severity
    assert why in finding.message
    if severity is Severity.INFO:
        assert f"mitigated by {AROUND_TRACE[0].name} (<string>:" in finding.message
