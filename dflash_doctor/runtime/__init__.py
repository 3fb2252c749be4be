"""Things to import into your own trainer: mitigations, the flight recorder and the hang watchdog.

    from dflash_doctor import runtime

    runtime.install_threadlocal_fx_flag()      # before any torch.compile wrapper is created
    runtime.enable_non_lazy_backward()         # the backward compiles with the forward: no lock cycle (here and
                                               # in every thread started later: torch 2.12+ keeps it per thread)
    with runtime.non_lazy_backward_in_thread(): # or: in a worker thread already running, around its steps
    runtime.isolate_fx_patches()               # a thread's symbolic_trace patches nn.Module for that thread only
    with runtime.single_thread_autograd():     # or: in each worker thread, its backward runs on that thread
        ...
    recorder = runtime.install()               # FX traces, compiles, recompile reasons, exceptions per thread
    ...
    with recorder.step():                      # in each worker thread
        loss = train_step(batch)
    runtime.write_chrome_trace("trace.json", [("trainer", recorder.events)])

None of these import torch until called, and each is imported on first use (PEP 562), so a process that
needs only the recorder (every process under `dflash-doctor run`) does not load the rest.
"""
from typing import TYPE_CHECKING, Any

# Eager: the submodule shares the function's name, and importing a submodule later would rebind the package's
# attribute to the module (it costs little beyond the recorder, which it needs)
from dflash_doctor.runtime.chrome_trace import chrome_trace, write_chrome_trace

if TYPE_CHECKING:
    from dflash_doctor.runtime.deadlock import HangDiagnosis, classify_hang
    from dflash_doctor.runtime.fx_flag import (
        ShimStatus,
        install_threadlocal_fx_flag,
        thread_is_fx_tracing,
        verify_threadlocal_fx_flag,
    )
    from dflash_doctor.runtime.fx_patches import (
        PatchIsolation,
        isolate_fx_patches,
        thread_has_fx_patches,
        verify_isolated_fx_patches,
    )
    from dflash_doctor.runtime.mitigations import (
        MitigationUnavailable,
        enable_non_lazy_backward,
        first_call_lock,
        fx_trace_lock,
        global_lock,
        non_lazy_backward_in_thread,
        single_thread_autograd,
        warmup,
    )
    from dflash_doctor.runtime.recorder import Blame, Event, FlightRecorder, active_recorder, install, uninstall
    from dflash_doctor.runtime.stacks import ThreadStack, capture_stacks, parse_faulthandler
    from dflash_doctor.runtime.watchdog import HangReport, Watchdog, arm_faulthandler

_MODULES = {
    'deadlock': ('HangDiagnosis', 'classify_hang'),
    'fx_flag': ('ShimStatus', 'install_threadlocal_fx_flag', 'thread_is_fx_tracing',
                'verify_threadlocal_fx_flag'),
    'fx_patches': ('PatchIsolation', 'isolate_fx_patches', 'thread_has_fx_patches',
                   'verify_isolated_fx_patches'),
    'mitigations': ('MitigationUnavailable', 'enable_non_lazy_backward', 'first_call_lock', 'fx_trace_lock',
                    'global_lock', 'non_lazy_backward_in_thread', 'single_thread_autograd', 'warmup'),
    'recorder': ('Blame', 'Event', 'FlightRecorder', 'active_recorder', 'install', 'uninstall'),
    'stacks': ('ThreadStack', 'capture_stacks', 'parse_faulthandler'),
    'watchdog': ('HangReport', 'Watchdog', 'arm_faulthandler'),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "Blame", "Event", "FlightRecorder", "HangDiagnosis", "HangReport", "MitigationUnavailable", "PatchIsolation",
    "ShimStatus", "fx_trace_lock", "isolate_fx_patches", "thread_has_fx_patches", "verify_isolated_fx_patches",
    "ThreadStack", "Watchdog", "active_recorder", "arm_faulthandler", "capture_stacks", "chrome_trace",
    "classify_hang", "enable_non_lazy_backward", "first_call_lock", "global_lock", "install",
    "install_threadlocal_fx_flag", "non_lazy_backward_in_thread", "parse_faulthandler", "single_thread_autograd", "thread_is_fx_tracing", "uninstall",
    "verify_threadlocal_fx_flag", "warmup", "write_chrome_trace",
]
