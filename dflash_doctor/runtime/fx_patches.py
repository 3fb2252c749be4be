"""Keep torch.fx's patches to the thread that traces: the FX patcher race (docs/races.md, "The FX patcher race").

In every release read (2.6-2.15), `Tracer.trace` opens a `_Patcher` (`with _new_patcher() as patcher:`) that
replaces `torch.nn.Module.__call__` and `__getattr__` on the classes, and autowrapped functions in module
globals, for the length of the trace, and keeps the active patcher in the module global `CURRENT_PATCHER`. So
while one thread traces, every other thread's eager module call runs the tracer's wrapper and raises
`NameError: module is not installed as a submodule`, and two traces that overlap restore each other's state
(`AssertionError: CURRENT_PATCHER is None in finally block`).

`isolate_fx_patches()` leaves torch's `_Patcher` logic as it is and changes only where a patch lands:

- the three `_PatchedFn` kinds `_Patcher` creates (looked up as module globals each time it patches) are
  replaced by versions that record the new function in a table of the *calling* thread, and put one dispatcher
  in the patched place while any thread has a patch there; the dispatcher calls the calling thread's newest
  patch, or the original. When the last thread's patch is reverted the original goes back, so with no trace
  running nothing of this module is in torch's way;
- `_new_patcher` and `_maybe_revert_all_patches` (Dynamo calls the latter around each compile) keep the current
  patcher per thread instead of in `CURRENT_PATCHER`, which stays None.

It must run before any thread starts tracing (a trace already running keeps its process-wide patches). On a
release whose patches are already per thread (no module-global `CURRENT_PATCHER`) it does nothing and says so.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from dflash_doctor.errors import require_torch

_FX_MODULE = "torch.fx._symbolic_trace"
# What the race raises, as the classifiers (repro, the pipeline's findings) recognise it: Tracer.path_of_module's
# NameError and the finally block of _new_patcher (docs/races.md, "The FX patcher race").
PATCHER_ERROR_MARKS = ("module is not installed as a submodule", "CURRENT_PATCHER")
# What a Dynamo compile prints when torch.fx's patches swap nn.Module.__call__ / __getattr__ under it while it
# builds its guards (seen on torch 2.13 beside a tracing thread: InternalTorchDynamoError wrapping these). Alone
# they are not specific; next to a thread that traces they are this race (repro/classify.py, supervise/agent.py).
GUARD_BREAK_MARKS = ("Guard failed on the same frame it was created", "object has no attribute '__closure__'",
                     "'NoneType' object is not subscriptable")


def is_patcher_error(error: Optional[str]) -> bool:
    """An error in the race's own words (NameError, the CURRENT_PATCHER assertions): the race, wherever seen."""
    return error is not None and any(mark in error for mark in PATCHER_ERROR_MARKS)


def is_guard_break(error: Optional[str]) -> bool:
    """A Dynamo compile failing on its own guards: the patcher race when a thread traced beside it."""
    if error is None:
        return False
    return GUARD_BREAK_MARKS[0] in error or ("TorchDynamo" in error
                                             and any(mark in error for mark in GUARD_BREAK_MARKS[1:]))
# What _Patcher uses and this shim replaces; a release missing one is a layout the shim does not know.
_REQUIRED = ("_Patcher", "_create_wrapped_func", "_PatchedFnSetItem", "_PatchedFnDel", "_PatchedFnSetAttr",
             "_new_patcher", "_maybe_revert_all_patches", "_autowrap_check")
_MISSING = object()
# nn.Module's places every trace patches get their dispatcher at install, for the life of the process, instead of
# at each trace's first patch and back at its last revert: a Dynamo compile in another thread that met
# nn.Module.__call__ as a dispatcher, then built its guards after the trace had put the original back, failed
# (InternalTorchDynamoError: TypeError: 'NoneType' object is not subscriptable, in CLOSURE_MATCH; torch 2.13, a
# trainer compiling its whole model beside a thread that traced it). One identity for the whole run.
PINNED = ("__call__", "__getattr__")

# .patches: Dict[key, List[_Entry]]; .patcher: the thread's current _Patcher; .busy: keys whose guarded patch
# is running in this thread
_thread = threading.local()
_table_lock = threading.RLock()
_install_lock = threading.Lock()
_installed: Optional["PatchIsolation"] = None
Key = Tuple[int, str]  # (id of the patched class or globals dict, attribute name)


@dataclass(frozen=True)
class PatchIsolation:
    """What `isolate_fx_patches` did. state: installed | native | unknown-layout."""

    state: str
    detail: str
    replaced: Tuple[str, ...] = ()  # torch.fx._symbolic_trace names now pointing at this module's versions

    def to_dict(self) -> dict:
        return {"state": self.state, "detail": self.detail, "replaced": list(self.replaced)}


@dataclass
class _Slot:
    """One patched place while some thread has a patch in it."""

    owner: Any  # the class (setattr) or the globals dict (item)
    name: str
    original: Any  # _MISSING for a globals dict that had no such key (a builtin shadowed by the patch)
    users: int = 0


@dataclass(frozen=True)
class _Entry:
    new_fn: Callable[..., Any]
    # The patch wraps whatever was in place when it was made, which is the dispatcher once another thread
    # traces (torch's _create_wrapped_func / _create_wrapped_method read it): its call through to "the
    # original" must reach the real one, not itself again.
    wraps_dispatcher: bool


_slots: Dict[Key, _Slot] = {}
# One dispatcher per place, kept for the next trace (a trace patches some fifty math functions: building their
# dispatchers anew each time was most of the shim's cost); reused only while the place's original is the same.
_dispatchers: Dict[Key, Tuple[Any, Callable[..., Any]]] = {}


def _own_patches() -> Dict[Key, List[_Entry]]:
    patches = getattr(_thread, "patches", None)
    if patches is None:
        patches = _thread.patches = {}
    return patches


def thread_has_fx_patches() -> bool:
    """True while the calling thread has torch.fx patches in place (it is inside a trace)."""
    return any(getattr(_thread, "patches", {}).values())


def _dispatcher(key: Key, original: Any) -> Callable[..., Any]:
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        # Per call: the calling thread's newest patch for this place, else what was there before any trace.
        patches = getattr(_thread, "patches", None)
        chosen = patches.get(key) if patches else None
        if not chosen:
            return original(*args, **kwargs)
        entry = chosen[-1]
        if not entry.wraps_dispatcher:
            return entry.new_fn(*args, **kwargs)
        busy = getattr(_thread, "busy", None)
        if busy is None:
            busy = _thread.busy = set()
        if key in busy:  # the patch calling what it wrapped (this dispatcher): the real original
            return original(*args, **kwargs)
        busy.add(key)
        try:
            return entry.new_fn(*args, **kwargs)
        finally:
            busy.discard(key)

    if callable(original):
        functools.update_wrapper(dispatch, original)
    dispatch.__dflash_fx_dispatch__ = True  # type: ignore[attr-defined]
    dispatch.__dflash_fx_original__ = original  # type: ignore[attr-defined]
    return dispatch


def _original_of(value: Any) -> Any:
    return getattr(value, "__dflash_fx_original__", value) if getattr(value, "__dflash_fx_dispatch__", False) \
        else value


def _read(owner: Any, name: str, is_class: bool) -> Any:
    if is_class:
        return owner.__dict__.get(name, getattr(owner, name, _MISSING))
    return owner.get(name, _MISSING)


def _write(owner: Any, name: str, value: Any, is_class: bool) -> None:
    if is_class:
        setattr(owner, name, value)
    elif value is _MISSING:
        owner.pop(name, None)
    else:
        owner[name] = value


def _cached_dispatcher(key: Key, original: Any) -> Callable[..., Any]:
    cached = _dispatchers.get(key)
    if cached is not None and cached[0] is original:
        return cached[1]
    dispatch = _dispatcher(key, original)
    _dispatchers[key] = (original, dispatch)
    return dispatch


def _push(owner: Any, name: str, new_fn: Callable[..., Any], is_class: bool) -> None:
    key = (id(owner), name)
    with _table_lock:
        slot = _slots.get(key)
        if slot is None:
            original = _read(owner, name, is_class)
            if original is _MISSING and not is_class:
                import builtins

                fallback = getattr(builtins, name)  # _PatchedFnDel: the name resolved to the builtin
                slot = _Slot(owner, name, _MISSING)
                _write(owner, name, _cached_dispatcher(key, fallback), is_class)
            else:
                slot = _Slot(owner, name, original)
                _write(owner, name, _cached_dispatcher(key, original), is_class)
            _slots[key] = slot
        slot.users += 1
        wrapped = getattr(new_fn, "__wrapped__", None)
        entry = _Entry(new_fn, wraps_dispatcher=getattr(wrapped, "__dflash_fx_dispatch__", False) is True)
        _own_patches().setdefault(key, []).append(entry)


def _pin(owner: Any, name: str) -> None:
    """Put the dispatcher in a class's place now, for good (a user that never pops): see PINNED."""
    key = (id(owner), name)
    with _table_lock:
        slot = _slots.get(key)
        if slot is None:
            original = _read(owner, name, True)
            slot = _slots[key] = _Slot(owner, name, original)
            _write(owner, name, _cached_dispatcher(key, original), True)
        slot.users += 1


def _pop(owner: Any, name: str, new_fn: Callable[..., Any], is_class: bool) -> None:
    key = (id(owner), name)
    with _table_lock:
        mine = _own_patches().get(key, [])
        for index in range(len(mine) - 1, -1, -1):  # the newest occurrence: nested traces revert in reverse
            if mine[index].new_fn is new_fn:
                del mine[index]
                break
        else:
            return  # not this thread's patch (reverted already): nothing of ours to undo
        if not mine:
            _own_patches().pop(key, None)
        slot = _slots.get(key)
        if slot is None:
            return
        slot.users -= 1
        if slot.users <= 0:
            del _slots[key]
            current = _read(owner, name, is_class)
            if getattr(current, "__dflash_fx_dispatch__", False):  # leave anything someone else put there
                _write(owner, name, slot.original, is_class)


def _is_extension_module_dict(frame_dict: Dict[str, Any]) -> bool:
    """The globals of a module not written in Python (math, the autowrap module every Tracer searches).

    A module's globals are one dict for every thread, so a patch there cannot be per thread; a Dynamo compile in
    another thread that reads `math.sqrt` meanwhile sees a Python function where a builtin was, and fails
    (measured: InternalTorchDynamoError, and 'Guard failed on the same frame it was created', in a worker
    compiling flex_attention, torch 2.13). These dicts are left alone: in the tracing thread `math.f(proxy)`
    then raises instead of being recorded, while a function a Python module imported by name, or registered
    with torch.fx.wrap, is still patched in that module's globals."""
    return "__spec__" in frame_dict and not str(frame_dict.get("__file__") or "").endswith(".py")


def _thread_patch_kinds(fx):
    """Subclasses of torch's three _PatchedFn kinds whose patch/revert land in the calling thread's table."""

    class SetItem(fx._PatchedFnSetItem):
        def patch(self) -> None:
            _push(self.frame_dict, self.fn_name, self.new_fn, is_class=False)

        def revert(self) -> None:
            _pop(self.frame_dict, self.fn_name, self.new_fn, is_class=False)

    class Del(fx._PatchedFnDel):
        def patch(self) -> None:
            _push(self.frame_dict, self.fn_name, self.new_fn, is_class=False)

        def revert(self) -> None:
            _pop(self.frame_dict, self.fn_name, self.new_fn, is_class=False)

    class SetAttr(fx._PatchedFnSetAttr):
        def patch(self) -> None:
            _push(self.frame_dict, self.fn_name, self.new_fn, is_class=True)

        def revert(self) -> None:
            _pop(self.frame_dict, self.fn_name, self.new_fn, is_class=True)

    return SetItem, Del, SetAttr


def _patcher_functions(fx):
    """Per-thread versions of `_new_patcher` and `_maybe_revert_all_patches` (same contract as torch's)."""

    @contextlib.contextmanager
    def _new_patcher() -> Iterator[Any]:
        prior = getattr(_thread, "patcher", None)
        patcher = _thread.patcher = fx._Patcher()
        try:
            yield patcher
        finally:
            patcher.revert_all_patches()
            _thread.patcher = prior

    @contextlib.contextmanager
    def _maybe_revert_all_patches() -> Iterator[None]:
        current = getattr(_thread, "patcher", None)
        removed = made = None
        try:
            if current is not None:
                removed = current.revert_all_patches()
            yield
        finally:
            if current is not None:
                made = current.reapply_all_patches()
            if made != removed:
                raise AssertionError("CURRENT_PATCHER was changed during a revert_all_patches")

    def _autowrap_check(patcher: Any, frame_dict: Dict[str, Any], function_ids: set) -> None:
        # torch's check compares ids with the functions to autowrap (math.sqrt...); while another thread traces,
        # the place holds a dispatcher, so the check looks at what the dispatcher stands for.
        if _is_extension_module_dict(frame_dict):
            return
        if patcher.visit_once(frame_dict):
            for name, value in list(frame_dict.items()):
                original = _original_of(value)
                if not name.startswith("_") and callable(original) and id(original) in function_ids:
                    patcher.patch(frame_dict, name, fx._create_wrapped_func(original))

    return _new_patcher, _maybe_revert_all_patches, _autowrap_check


def isolate_fx_patches() -> PatchIsolation:
    """Make torch.fx's tracing patches apply to the tracing thread only. Call once, before threads trace."""
    global _installed
    require_torch("isolating torch.fx's patches")
    import importlib

    with _install_lock:
        if _installed is not None:
            return _installed
        fx = importlib.import_module(_FX_MODULE)
        if not hasattr(fx, "CURRENT_PATCHER") and hasattr(fx, "_Patcher"):
            _installed = PatchIsolation("native", "this torch keeps no module-global CURRENT_PATCHER: its patches "
                                                  "are already per thread; nothing done")
            return _installed
        missing = [name for name in _REQUIRED if not hasattr(fx, name)]
        if missing:
            return PatchIsolation("unknown-layout", f"{_FX_MODULE} has no {', '.join(missing)}")
        if not hasattr(fx._PatchedFnSetAttr, "patch"):
            # torch 2.4: _Patcher writes the patches itself; there is no patch() on the kinds to redirect.
            return PatchIsolation("unknown-layout", f"{_FX_MODULE}'s _Patcher writes its patches itself (torch "
                                                    "2.4); isolate-fx-patches needs torch 2.5 or later")
        set_item, delete, set_attr = _thread_patch_kinds(fx)
        new_patcher, maybe_revert, autowrap_check = _patcher_functions(fx)
        replacements = {"_PatchedFnSetItem": set_item, "_PatchedFnDel": delete, "_PatchedFnSetAttr": set_attr,
                        "_new_patcher": new_patcher, "_maybe_revert_all_patches": maybe_revert,
                        "_autowrap_check": autowrap_check}
        for name, replacement in replacements.items():  # module globals torch.fx looks up on every use
            setattr(fx, name, replacement)
        import torch

        for name in PINNED:
            _pin(torch.nn.Module, name)
        _installed = PatchIsolation("installed", "nn.Module.__call__/__getattr__ and autowrapped functions now "
                                                 "dispatch per thread (math's own functions are left unpatched); "
                                                 "the current patcher is per thread",
                                    tuple(f"{_FX_MODULE}.{name}" for name in _REQUIRED[2:]))
        return _installed


def verify_isolated_fx_patches(timeout_s: float = 10.0, thread_factory=threading.Thread) -> Tuple[bool, str]:
    """Prove it in this process: while one thread sits inside a real `symbolic_trace`, an eager nn.Linear must
    run in another thread, and the trace must still record its own submodule. Returns (ok, detail)."""
    import torch
    import torch.fx

    entered, release = threading.Event(), threading.Event()

    class _Blocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

        def forward(self, x):
            entered.set()
            release.wait(timeout_s)
            return self.inner(x)

    traced: dict = {}

    def trace() -> None:
        try:
            traced["graph"] = torch.fx.symbolic_trace(_Blocks()).graph
        except Exception as exc:  # noqa: BLE001 - the self-check's own evidence
            traced["error"] = f"{type(exc).__name__}: {exc}"

    holder = thread_factory(target=trace, name="fx-patches-self-check", daemon=True)
    holder.start()
    try:
        if not entered.wait(timeout_s):
            return False, "the self-check trace did not start"
        try:
            torch.nn.Linear(2, 2)(torch.zeros(1, 2))
        except NameError as exc:
            return False, f"an eager module call still raised while another thread traced: {exc}"
    finally:
        release.set()
        holder.join(timeout_s)
    if "error" in traced:
        return False, f"the tracing thread's own trace failed: {traced['error']}"
    if not any(node.op == "call_module" and node.target == "inner" for node in getattr(traced.get("graph"), "nodes", ())):
        return False, "the tracing thread's trace no longer records its own submodule"
    return True, "an eager module call ran while another thread was inside symbolic_trace, whose graph is intact"
