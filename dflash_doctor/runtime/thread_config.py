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
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Set, Tuple

from dflash_doctor.compile_settings import SETTINGS

# The settings every thread started after a set-up applies first (dotted name -> value), and the hook's state.
_INHERITED: Dict[str, object] = {}
_LOCK = threading.Lock()
_HOOKED: List[str] = []  # the Thread method wrapped, once per process
# Set on a Thread object by the start hook of `watch`: the starter's values of the settings that matter.
_STARTED_WITH = "_dflash_doctor_settings_at_start"
EVENT_KIND = "compile-setting"  # the recorder event of a worker whose value differs from its starter's


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
        """The recorder event's detail; `from_detail` is the one reader (run's records cross a process)."""
        return {"key": self.key, "thread": self.thread, "reads": self.reads, "starter": self.starter,
                "starter_reads": self.starter_reads}

    @classmethod
    def from_detail(cls, detail: Mapping[str, object]) -> "SettingGap":
        return cls(str(detail["key"]), str(detail["thread"]), str(detail["reads"]), str(detail["starter"]),
                   str(detail["starter_reads"]))


def _snapshot() -> Dict[str, object]:
    values: Dict[str, object] = {}
    for setting in SETTINGS:
        with contextlib.suppress(Exception):
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


def watch(report: Callable[[SettingGap], None]) -> Callable[[], None]:
    """Report, at each thread's first Dynamo compile, every setting of compile_settings.SETTINGS it reads
    otherwise than its starter did. Returns the undo. Quietly nothing on a torch without Dynamo's callbacks."""
    import torch._dynamo.callback as dynamo_callback

    handler = getattr(dynamo_callback, "callback_handler", None)
    if handler is None or not hasattr(handler, "register_start_callback"):
        return lambda: None
    owner = threading.Thread
    original_start = owner.start
    checked: Set[int] = set()

    def start(thread_self, *args, **kwargs):
        with contextlib.suppress(Exception):
            setattr(thread_self, _STARTED_WITH, (threading.current_thread().name, _snapshot()))
        return original_start(thread_self, *args, **kwargs)

    def on_compile_start(_args) -> None:
        thread = threading.current_thread()
        if thread.ident in checked:
            return
        checked.add(thread.ident or 0)
        started = getattr(thread, _STARTED_WITH, None)  # None: the main thread, or one torch's C++ side started
        if started is None:
            return
        for gap in gaps_in_this_thread(started[1], started[0]):
            with contextlib.suppress(Exception):
                report(gap)

    owner.start = start  # type: ignore[method-assign]
    handler.register_start_callback(on_compile_start)

    def undo() -> None:
        owner.start = original_start  # type: ignore[method-assign]
        with contextlib.suppress(Exception):
            handler.remove_start_callback(on_compile_start)

    return undo


__all__ = ["EVENT_KIND", "SettingGap", "SettingUnavailable", "available", "gaps_in_this_thread", "in_this_thread",
           "inherited", "per_thread_storage", "read", "set_for_every_thread", "set_in_this_thread", "watch"]
