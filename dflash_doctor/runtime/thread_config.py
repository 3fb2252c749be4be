"""Compile settings that reach every thread that compiles, on every release: the one mechanism behind every
config-based fix (dflash_doctor/mitigations.py), and the run-time check of what a worker thread really reads.

From torch 2.12 a value assigned to `torch._dynamo.config`, `torch._inductor.config` or `torch._functorch.config`
lives in a `ContextVar`, and a thread started later begins with an empty context: it reads the defaults
(docs/races.md, "Compile settings are per thread from torch 2.12"). So a fix that switches a setting has two forms:

- `set_for_every_thread(values)`: the process-level set-up. It sets the values in the calling thread and makes
  every `threading.Thread` started from now on (ThreadPoolExecutor workers and DataParallel's replica threads are
  such threads) set them first thing in its own context. Threads already running are not reached.
- `in_this_thread(values)`: the per-thread form, a context manager a worker enters around its steps (like
  `single_thread_autograd()`); for a thread started before the set-up, or one whose context was reset.

On a release that keeps the settings process-wide (2.11 and earlier) the assignment in the calling thread already
reaches every thread: the hook then sets nothing, and leaving `in_this_thread` does not restore the old value,
which would switch the fix off for every other thread still inside it. Nothing changes there from a plain
assignment.

`watch(report)` is the run-time hazard (`run`'s DFD910): each thread remembers, when it is started, the values of
the settings in compile_settings.SETTINGS its starter read; at its first Dynamo compile it compares them with what
it reads itself and reports each difference (main assigned it, the worker reads the default).

Torch is imported only by the functions that read or write a setting, never at import.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from dflash_doctor.compile_settings import SETTINGS

# The settings every thread started after a set-up applies first (dotted name -> value), and the hook's state.
_INHERITED: Dict[str, object] = {}
_LOCK = threading.Lock()
_HOOKED: List[str] = []  # the Thread method wrapped, once per process
# Set on a Thread object by the start hook of `watch`: the starter's values of the settings that matter.
_STARTED_WITH = "_dflash_doctor_settings_at_start"


class SettingUnavailable(RuntimeError):
    """This torch has no such config module or key."""


def _resolve(dotted: str):
    module_name, _, key = dotted.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SettingUnavailable(f"this torch has no {module_name}") from exc
    if not _has_key(module, key):
        raise SettingUnavailable(f"this torch has no {dotted}")
    return module, key


def _has_key(module, key: str) -> bool:
    entries = getattr(module, "_config", None)
    return key in entries if isinstance(entries, dict) else hasattr(module, key)


def available(dotted: str) -> bool:
    try:
        _resolve(dotted)
    except SettingUnavailable:
        return False
    return True


def per_thread_storage(module_name: str = "torch._dynamo.config") -> Optional[bool]:
    """Whether the imported torch keeps this config module's assigned values per thread: its entries hold the
    user override in a ContextVar (2.12+), read from the live objects, not from the version. None when the
    module is not a config module this reader knows."""
    module = importlib.import_module(module_name)
    entries = getattr(module, "_config", None)
    if not isinstance(entries, dict) or not entries:
        return None
    entry = next(iter(entries.values()))
    if not hasattr(entry, "user_override"):
        return False  # 2.4-2.5: the values themselves sit in the module's dict, shared by every thread
    return isinstance(entry.user_override, contextvars.ContextVar)


def _per_thread_for(values: Mapping[str, object]) -> bool:
    modules = {dotted.rpartition(".")[0] for dotted in values}
    return any(per_thread_storage(name) for name in modules)


def read(dotted: str) -> object:
    """The value of one setting as the calling thread reads it."""
    module, key = _resolve(dotted)
    return getattr(module, key)


def set_in_this_thread(values: Mapping[str, object]) -> Dict[str, object]:
    """Assign each value in the calling thread (every thread on a process-wide release); the previous values."""
    previous: Dict[str, object] = {}
    for dotted, value in values.items():
        module, key = _resolve(dotted)
        previous[dotted] = getattr(module, key)
        setattr(module, key, value)
    return previous


def set_for_every_thread(values: Mapping[str, object]) -> Dict[str, object]:
    """The process-level set-up: the values now, in this thread, and in every thread started from now on.
    Returns the values this thread read before."""
    previous = set_in_this_thread(values)
    with _LOCK:
        _INHERITED.update(values)
    _hook_thread_start()
    return previous


def inherited() -> Dict[str, object]:
    """What threads started from now on set first (empty before any set-up)."""
    with _LOCK:
        return dict(_INHERITED)


@contextlib.contextmanager
def in_this_thread(values: Mapping[str, object]) -> Iterator[Dict[str, object]]:
    """The per-thread form: the values for the calling thread while inside, its own values again after (on a
    per-thread release; on a process-wide one the values stay, see the module's docstring)."""
    per_thread = _per_thread_for(values)
    previous = set_in_this_thread(values)
    try:
        yield previous
    finally:
        if per_thread:
            set_in_this_thread(previous)


def _apply_inherited() -> None:
    values = inherited()
    if values and _per_thread_for(values):
        set_in_this_thread(values)


def _hook_thread_start() -> None:
    """Wrap Thread._bootstrap_inner (which runs `run()` for subclasses that override it too, in the new thread)
    once per process; the agent of `run` wraps the same method, and either order chains."""
    with _LOCK:
        if _HOOKED:
            return
        owner = threading.Thread
        name = "_bootstrap_inner" if hasattr(owner, "_bootstrap_inner") else "run"
        original = getattr(owner, name)

        def bootstrap(thread_self):
            with contextlib.suppress(Exception):  # a setting that cannot be set must not stop the thread
                _apply_inherited()
            return original(thread_self)

        setattr(owner, name, bootstrap)
        _HOOKED.append(name)


# -- the run-time check ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SettingGap:
    """A thread that compiled reading another value of a setting than the thread that started it."""

    key: str  # the dotted name
    thread: str
    reads: str  # repr of the worker's value
    starter: str
    starter_reads: str

    def to_detail(self) -> Dict[str, str]:
        """The detail of its recorder event (outcomes.RecorderEventKind.COMPILE_SETTING); `from_detail` is the one
        reader (run's records cross a process)."""
        return {"key": self.key, "thread": self.thread, "reads": self.reads, "starter": self.starter,
                "starter_reads": self.starter_reads}

    @classmethod
    def from_detail(cls, detail: Mapping[str, object]) -> "SettingGap":
        return cls(str(detail["key"]), str(detail["thread"]), str(detail["reads"]), str(detail["starter"]),
                   str(detail["starter_reads"]))


def _is_alias(dotted: str) -> bool:
    """A key that only forwards to another (cache_size_limit to recompile_limit where both exist): watched once,
    under the name it forwards to."""
    module, key = _resolve(dotted)
    entries = getattr(module, "_config", None)
    entry = entries.get(key) if isinstance(entries, dict) else None
    return getattr(entry, "alias", None) is not None


def _snapshot() -> Dict[str, object]:
    values: Dict[str, object] = {}
    for setting in SETTINGS:
        with contextlib.suppress(Exception):
            if not _is_alias(setting.dotted):
                values[setting.dotted] = read(setting.dotted)
    return values


def gaps_in_this_thread(started_with: Mapping[str, object], starter: str) -> Tuple[SettingGap, ...]:
    """The settings this thread reads otherwise than its starter did when it started the thread."""
    me = threading.current_thread().name
    found = []
    for dotted, expected in started_with.items():
        with contextlib.suppress(Exception):
            value = read(dotted)
            if value != expected:
                found.append(SettingGap(dotted, me, repr(value), starter, repr(expected)))
    return tuple(found)


def watch(report: Callable[[SettingGap], object]) -> Callable[[], None]:
    """Report, at each thread's first Dynamo compile, every setting of compile_settings.SETTINGS it reads
    otherwise than its starter did. Returns the undo.

    The check runs in front of `torch._dynamo.convert_frame._compile` (called through its module global in every
    release read, 2.4-2.15), in the compiling thread. Dynamo's start callbacks are not used: they run only for the
    outermost of compiles that overlap across threads, so a worker whose compile began while another thread's was
    in progress would go unchecked (seen in repro's two-thread CPU runs: a lazy backward compile with an end event
    and no start)."""
    import torch._dynamo.convert_frame as convert_frame

    owner = threading.Thread
    original_start = owner.start
    original_compile = getattr(convert_frame, "_compile", None)

    def start(thread_self, *args, **kwargs):
        with contextlib.suppress(Exception):
            setattr(thread_self, _STARTED_WITH, (threading.current_thread().name, _snapshot()))
        return original_start(thread_self, *args, **kwargs)

    def check_this_thread() -> None:
        thread = threading.current_thread()
        # Popped, so each thread is checked at its first compile only (marked on the Thread object: an ident is
        # reused by the next thread once one ends). None: the main thread, or one torch's C++ side started.
        started = thread.__dict__.pop(_STARTED_WITH, None)
        if started is None:
            return
        for gap in gaps_in_this_thread(started[1], started[0]):
            with contextlib.suppress(Exception):
                report(gap)

    owner.start = start  # type: ignore[method-assign,assignment]
    if callable(original_compile):
        def compile_(*args, **kwargs):
            with contextlib.suppress(Exception):  # the tool's check never stands in the way of the compile
                check_this_thread()
            return original_compile(*args, **kwargs)

        convert_frame._compile = compile_

    def undo() -> None:
        owner.start = original_start  # type: ignore[method-assign]
        if callable(original_compile):
            convert_frame._compile = original_compile

    return undo


def watch_lazy_backward(on_lazy: Callable[[str], object]) -> Callable[[], None]:
    """Call `on_lazy(thread name)` each time a backward graph is compiled lazily, at a backward call, in the thread
    that compiles it: what the non-lazy switch, where it reached the thread, prevents. Returns the undo.

    AOTAutograd enters `callback_handler.install_callbacks(CallbackTrigger.LAZY_BACKWARD, ...)` around every lazy
    backward compile (2.9 and later); it is wrapped on the handler itself because the callbacks it runs fire only
    for the outermost of compiles that overlap across threads. Nothing on a release without the trigger."""
    import torch._dynamo.callback as dynamo_callback

    handler = getattr(dynamo_callback, "callback_handler", None)
    original = getattr(handler, "install_callbacks", None)
    if handler is None or original is None or not hasattr(getattr(dynamo_callback, "CallbackTrigger", None),
                                                           "LAZY_BACKWARD"):
        return lambda: None

    def install_callbacks(*args, **kwargs):
        trigger = args[0] if args else kwargs.get("trigger")
        if getattr(trigger, "name", None) == "LAZY_BACKWARD":
            with contextlib.suppress(Exception):
                on_lazy(threading.current_thread().name)
        return original(*args, **kwargs)

    handler.install_callbacks = install_callbacks

    def undo() -> None:
        with contextlib.suppress(AttributeError):
            del handler.install_callbacks

    return undo


__all__ = ["SettingGap", "SettingUnavailable", "available", "gaps_in_this_thread", "in_this_thread",
           "inherited", "per_thread_storage", "read", "set_for_every_thread", "set_in_this_thread", "watch", "watch_lazy_backward"]
