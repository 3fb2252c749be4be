"""Make the FX-tracing flag effectively thread-local on torch releases where it is a module global.

Up to torch 2.13, `Tracer.trace` saves, sets and restores the module global
`torch.fx._symbolic_trace._is_fx_tracing_flag`, and every torch.compile'd callable checks it on every call. So
one thread's FX trace (including the make_fx inside another thread's compile) makes a second thread's compiled
call raise "Detected that you are using FX to symbolically trace a dynamo-optimized function", and two traces
that exit out of order leave the flag stuck True for good. torch 2.14 made the flag thread-local upstream.

The shim keeps the global as it is (other code may read it) and adds a per-thread trace depth; the predicates
the compile wrapper consults are pointed at that depth. The wrapper binds its predicate when it is created, so
the shim must run before any `torch.compile` wrapper exists; `stale_compile_wrappers()` counts the ones that
were created earlier and still hold the old predicate.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Optional

from dflash_doctor.errors import require_torch

# Where compile wrappers look the predicates up, per release (docs/races.md, "The guard").
_PREDICATE_NAMES = ("is_fx_tracing", "is_fx_symbolic_tracing")
_PREDICATE_MODULES = ("torch.fx._symbolic_trace", "torch._dynamo.eval_frame")

_depth = threading.local()
_install_lock = threading.Lock()
_installed: Optional["ShimStatus"] = None


@dataclass(frozen=True)
class ShimStatus:
    """What `install_threadlocal_fx_flag` did. state: installed | native | unknown-layout."""

    state: str
    detail: str
    patched: tuple = ()  # "module.predicate" names now pointing at the thread-local depth
    stale_wrappers: int = 0  # compile wrappers created before the shim (they still read the global)

    @property
    def effective(self) -> bool:
        return self.state in ("installed", "native") and self.stale_wrappers == 0

    def to_dict(self) -> dict:
        return {
            "state": self.state,
            "detail": self.detail,
            "patched": list(self.patched),
            "stale_wrappers": self.stale_wrappers,
        }


def thread_is_fx_tracing() -> bool:
    """True while the calling thread (not any thread) is inside `torch.fx.Tracer.trace`."""
    return getattr(_depth, "value", 0) > 0


def install_threadlocal_fx_flag() -> ShimStatus:
    """Make the FX-tracing check thread-local. Call once, before creating any torch.compile wrapper.

    Idempotent. Returns a ShimStatus: `native` when this torch already keeps the flag per thread (2.14+),
    `installed` when the shim is in place, `unknown-layout` (nothing changed) when this torch's FX module does
    not look like any release the shim was written against.
    """
    global _installed
    with _install_lock:
        if _installed is not None:
            return _installed
        _installed = _install()
        return _installed


def _install() -> ShimStatus:
    import importlib

    require_torch("the thread-local FX flag shim")
    symbolic_trace = importlib.import_module("torch.fx._symbolic_trace")
    if hasattr(symbolic_trace, "_is_fx_tracing_tls"):
        return ShimStatus("native", "this torch keeps the FX-tracing flag per thread; nothing to patch")
    if not hasattr(symbolic_trace, "_is_fx_tracing_flag") or not callable(
        getattr(getattr(symbolic_trace, "Tracer", None), "trace", None)
    ):
        return ShimStatus(
            "unknown-layout",
            "torch.fx._symbolic_trace has no module-global _is_fx_tracing_flag / Tracer.trace; shim not installed",
        )
    if not any(hasattr(symbolic_trace, name) for name in _PREDICATE_NAMES):
        return ShimStatus("unknown-layout", "no FX-tracing predicate found in torch.fx._symbolic_trace")

    import torch

    original_trace = symbolic_trace.Tracer.trace

    @functools.wraps(original_trace)
    def trace(self, *args, **kwargs):
        _depth.value = getattr(_depth, "value", 0) + 1
        try:
            return original_trace(self, *args, **kwargs)
        finally:
            _depth.value -= 1

    def is_fx_tracing() -> bool:
        return thread_is_fx_tracing()

    def is_fx_symbolic_tracing() -> bool:
        return thread_is_fx_tracing() and not torch.compiler.is_compiling()

    replacements = {"is_fx_tracing": is_fx_tracing, "is_fx_symbolic_tracing": is_fx_symbolic_tracing}
    originals = {name: getattr(symbolic_trace, name) for name in _PREDICATE_NAMES if hasattr(symbolic_trace, name)}
    stale = stale_compile_wrappers(tuple(originals.values()))
    symbolic_trace.Tracer.trace = trace
    patched = []
    for module_name in _PREDICATE_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in _PREDICATE_NAMES:
            if hasattr(module, name):
                setattr(module, name, replacements[name])
                patched.append(f"{module_name}.{name}")
    detail = "Tracer.trace keeps a per-thread depth; the compile wrapper's predicate reads it"
    if stale:
        detail += f"; {stale} compile wrapper(s) created before the shim still read the global flag"
    return ShimStatus("installed", detail, tuple(patched), stale)


def stale_compile_wrappers(predicates: tuple) -> int:
    """Count torch.compile wrappers alive now whose closure holds one of `predicates` (bound at creation)."""
    import gc
    import types

    targets = {id(p) for p in predicates}
    count = 0
    for obj in gc.get_objects():
        # type(), not isinstance(): weak proxies among the objects raise on attribute access once dead.
        if type(obj) is not types.FunctionType or obj.__code__.co_name != "compile_wrapper" or not obj.__closure__:
            continue
        for cell in obj.__closure__:
            try:
                if id(cell.cell_contents) in targets:
                    count += 1
                    break
            except ValueError:  # an empty cell
                continue
    return count


def verify_threadlocal_fx_flag(timeout_s: float = 10.0, thread_factory=threading.Thread) -> tuple:
    """Prove the shim works in this process: while one thread sits inside a real FX trace, a freshly created
    compiled function must run in another thread, and the tracing thread must still see itself tracing.

    Returns (ok, detail). Uses the eager backend, so it costs a Dynamo trace, not an inductor compile.
    """
    import torch
    import torch.fx

    entered, release = threading.Event(), threading.Event()
    seen_inside = {}

    class _Blocks(torch.nn.Module):
        def forward(self, x):
            seen_inside["tracing"] = torch.fx._symbolic_trace.is_fx_symbolic_tracing()
            entered.set()
            release.wait(timeout_s)
            return x

    probe = torch.compile(lambda t: t + 1, backend="eager")
    holder = thread_factory(target=lambda: torch.fx.symbolic_trace(_Blocks()), name="shim-self-check", daemon=True)
    holder.start()
    try:
        if not entered.wait(timeout_s):
            return False, "the self-check trace did not start"
        try:
            probe(torch.zeros(1))
        except RuntimeError as exc:
            return False, f"a compiled call still raised while another thread traced: {exc}"
    finally:
        release.set()
        holder.join(timeout_s)
    if not seen_inside.get("tracing"):
        return False, "the tracing thread no longer sees its own trace"
    return True, "a compiled call ran while another thread was inside an FX trace"
