"""The verdict and the ranked fixes, each with its cost, chosen for the layout that was read.

`vulnerable`: a trace in one thread can make another thread's compiled calls raise (a module-global FX flag, a
live reproduction, or a flag already stuck). `safe`: the flag is per thread and nothing reproduced a leak.
`unknown`: the source did not say where the flag lives and no probe settled it; that is reported, not guessed.

Ranking follows the measurements in shared/FACTS.md section 3: a single-thread warm-up is the cheapest fix that
was seen to work; the thread-local flag (2.14) removes the race itself but, alone, not the compile-lock deadlock.
"""
from __future__ import annotations

from typing import List, Mapping, Optional

from dflash_doctor.guards.layout import MODULE_GLOBAL, THREAD_LOCAL
from dflash_doctor.guards.probes import REPRODUCED
from dflash_doctor.guards.state import CONFIG_DEFAULTS

VULNERABLE, SAFE, UNKNOWN = "vulnerable", "safe", "unknown"
LEAK_PROBES = ("cross_thread_leak", "stuck_flag")

RESTART = {
    "fix": "Restart the process: its FX-tracing flag is stuck True and never clears, so every compiled call raises.",
    "cost": "the process's in-memory state (resume from the last checkpoint)",
}
RESTORE_CONFIG = {
    "fix": "Set torch._dynamo.config.error_on_nested_fx_trace = True and force_compile_during_fx_trace = False "
           "(the defaults), then remove the race with one of the fixes below.",
    "cost": "none; the race raises again instead of silently running uncompiled code (for flex_attention: the "
            "dense path that materialises QK^T and can run out of memory)",
}
WARM_UP = {
    "fix": "Warm up in one thread before starting the workers: one compiled forward+backward for every shape on "
           "every device, with TORCHINDUCTOR_CACHE_DIR on persistent storage so later runs start warm.",
    "cost": "a serial warm-up per process (15.6 s for 3 GPUs of compiled flex_attention fwd+bwd on torch 2.11); "
            "every shape must be known up front, and a new shape or a recompile later reopens the race window",
}
UPGRADE = {
    "fix": "Upgrade to torch 2.14 or later, whose FX-tracing flag is thread-local.",
    "cost": "a torch upgrade and re-validation (wheels matching your CUDA/ROCm and triton); it removes the "
            "cross-thread leak and the stuck flag, but not the compile-lock deadlock of lazy backward compiles: "
            "pair it with the warm-up or torch._functorch.config.force_non_lazy_backward_lowering = True",
}
NON_LAZY_BACKWARD = {
    "fix": "Compile backward with forward: torch._functorch.config.force_non_lazy_backward_lowering = True, so "
           "no lazy backward compile waits on Dynamo's compile lock from the autograd device thread.",
    "cost": "a longer first step (backward compiled before it is needed); measured to let three threads compile "
            "concurrently once the FX flag is per thread (12.9 s, torch 2.11 with a thread-local shim)",
}
GLOBAL_LOCK = {
    "fix": "Hold one process-wide lock around every compiled step (forward and backward) in every thread.",
    "cost": "the threads stop overlapping compiled work: 60 steps took 15.8 s under the lock vs 0.27 s after a "
            "warm-up (3 threads, torch 2.11, H200)",
}
PROCESSES = {
    "fix": "Run the workers as processes instead of threads, so each has its own Dynamo and FX state.",
    "cost": "a rewrite of the hand-off between workers (IPC or shared memory for hidden states), one compile and "
            "one CUDA context per process, more host memory",
}


def decide_verdict(storage: str, probes: Mapping[str, str], fx_flag_now: Optional[bool]) -> str:
    if fx_flag_now or any(probes.get(name) == REPRODUCED for name in LEAK_PROBES):
        return VULNERABLE
    if storage == MODULE_GLOBAL:
        return VULNERABLE
    if storage == THREAD_LOCAL:
        return SAFE
    return UNKNOWN


def verdict_reasons(layout, probes: Mapping[str, str], fx_flag_now: Optional[bool]) -> List[str]:
    reasons = []
    flag = layout.fx_flag
    if layout.fx_flag_storage == MODULE_GLOBAL:
        reasons.append(f"the FX-tracing flag {flag.name} ({flag.file}:{flag.line}) is a module global: a trace in "
                       f"any thread makes every thread's compiled calls raise")
    elif layout.fx_flag_storage == THREAD_LOCAL:
        reasons.append(f"the FX-tracing flag {flag.name}.{flag.attribute} ({flag.file}:{flag.line}) is thread-local")
    else:
        reasons.append(f"the source does not say where the FX-tracing flag lives: {layout.unknown_reason}")
    for name in LEAK_PROBES:
        if probes.get(name) == REPRODUCED:
            reasons.append(f"probe {name} reproduced the race in a child process")
    if fx_flag_now:
        reasons.append("the FX-tracing flag is True right now, outside any trace: this process is already corrupted")
    return reasons


def rank_fixes(verdict: str, storage: str, fx_flag_now: Optional[bool], config: Mapping[str, object]) -> List[dict]:
    fixes = []
    if fx_flag_now:
        fixes.append(RESTART)
    if any(config.get(name) is not None and config.get(name) != default for name, default in CONFIG_DEFAULTS.items()):
        fixes.append(RESTORE_CONFIG)
    if storage == MODULE_GLOBAL:
        fixes += [WARM_UP, UPGRADE, GLOBAL_LOCK, PROCESSES]
    elif storage == THREAD_LOCAL:
        fixes += [WARM_UP, NON_LAZY_BACKWARD, PROCESSES] if verdict == VULNERABLE else [WARM_UP, NON_LAZY_BACKWARD]
    else:
        fixes += [WARM_UP, GLOBAL_LOCK, PROCESSES]
    return [dict(rank=rank, **fix) for rank, fix in enumerate(fixes, start=1)]
