"""Mitigations for torch.compile thread races, each a function a trainer can call. What each did on an H200 with
torch 2.11: docs/races.md, "The plain loop"; `dflash-doctor repro --matrix` measures them on your install; what
each stops and leaves open is declared in dflash_doctor/mitigations.py.

- `first_call_lock(step)`: serialise each thread's first call only (the seeds' `_exec_lock`). Not enough: a
  thread already past its first call still runs while another compiles.
- `global_lock(step)`: serialise every call. Safe, but the workers no longer overlap.
- `warmup(steps)`: run every shape and device (forward and backward) in one thread before the workers start.
- `install_threadlocal_fx_flag()` (fx_flag.py): make the FX flag per thread. Fixes the RuntimeError, not the
  compile_lock <-> autograd deadlock.
- `enable_non_lazy_backward()`: compile the backward together with the forward, so the autograd device thread
  never waits for compile_lock; in this thread and every thread started afterwards (torch 2.12+ keeps compile
  settings per thread: thread_config.py). `non_lazy_backward_in_thread()` is its per-thread form. Combined with the shim, the only configuration that let three threads compile
  concurrently with no error and no hang.
- `single_thread_autograd()`: a context manager each worker thread enters around its steps, so its backward runs
  on the worker itself instead of the autograd device thread: no device thread to wait for, no lock cycle.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time
from typing import Callable, Iterable, Iterator, List, Optional

# Shared by every wrapper that is not given its own lock, so separate threads' steps serialise on one lock.
FIRST_CALL_LOCK = threading.Lock()
GLOBAL_STEP_LOCK = threading.RLock()


class MitigationUnavailable(RuntimeError):
    """This torch has no hook for the mitigation (e.g. no force_non_lazy_backward_lowering)."""


def first_call_lock(step: Callable, lock: Optional[threading.Lock] = None) -> Callable:
    """Wrap `step` so that each thread's first call holds `lock` (shared across threads); later calls run free."""
    lock = lock if lock is not None else FIRST_CALL_LOCK
    done = threading.local()

    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        if getattr(done, "value", False):
            return step(*args, **kwargs)
        with lock:
            result = step(*args, **kwargs)
        done.value = True
        return result

    return wrapper


def global_lock(step: Callable, lock: Optional[threading.RLock] = None) -> Callable:
    """Wrap `step` so that every call, in every thread, holds one shared lock."""
    lock = lock if lock is not None else GLOBAL_STEP_LOCK

    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        with lock:
            return step(*args, **kwargs)

    return wrapper


def warmup(steps: Iterable[Callable[[], object]], clock: Callable[[], float] = time.perf_counter) -> List[float]:
    """Run each zero-argument step once, in the calling thread, before any worker starts.

    Pass one step per (shape, device) the workers will see, each doing forward and backward, so every graph
    and its backward are compiled here, serially. Returns the seconds each took.
    """
    seconds = []
    for step in steps:
        started = clock()
        step()
        seconds.append(clock() - started)
    return seconds


NON_LAZY_BACKWARD = "torch._functorch.config.force_non_lazy_backward_lowering"


def _non_lazy_values() -> dict:
    from dflash_doctor.errors import require_torch
    from dflash_doctor.runtime import thread_config

    require_torch("non-lazy backward lowering")
    if not thread_config.available(NON_LAZY_BACKWARD):
        raise MitigationUnavailable(f"this torch has no {NON_LAZY_BACKWARD}")
    return {NON_LAZY_BACKWARD: True}


def enable_non_lazy_backward() -> bool:
    """Compile the backward with the forward (`torch._functorch.config.force_non_lazy_backward_lowering`), in
    this thread and in every thread started from now on.

    Call it before the workers start. torch 2.12+ keeps compile settings per thread, so a plain assignment in
    the main thread never reaches a worker; this also sets it first thing in every later `threading.Thread`
    (ThreadPoolExecutor and DataParallel threads included: runtime/thread_config.py). A thread already running
    enters `non_lazy_backward_in_thread()` instead. Returns the previous value in this thread. Raises
    MitigationUnavailable on a torch without the option.
    """
    from dflash_doctor.runtime import thread_config

    return bool(thread_config.set_for_every_thread(_non_lazy_values())[NON_LAZY_BACKWARD])


@contextlib.contextmanager
def non_lazy_backward_in_thread() -> Iterator[None]:
    """The per-thread form of `enable_non_lazy_backward()`: entered by a worker thread around its steps, its
    compiles lower the backward with the forward (on every release; needed on 2.12+ for a thread that started
    before the set-up)."""
    from dflash_doctor.runtime import thread_config

    with thread_config.in_this_thread(_non_lazy_values()):
        yield


@contextlib.contextmanager
def single_thread_autograd() -> Iterator[None]:
    """Run this thread's backward passes on this thread (`torch.autograd.set_multithreading_enabled(False)`).

    The switch is thread-local (documented since torch 2.0): every worker thread that calls backward must enter
    it itself, around its steps; entering it in the main thread covers no worker. With it the autograd engine
    does not hand the backward to its per-device thread, which is the thread the lazy backward compile waited on
    for compile_lock in the deadlock (docs/races.md, "Single-threaded autograd").
    """
    from dflash_doctor.errors import require_torch

    require_torch("single-threaded autograd")
    import torch

    with torch.autograd.set_multithreading_enabled(False):
        yield


@contextlib.contextmanager
def fx_trace_lock(lock: Optional[threading.RLock] = None) -> Iterator[None]:
    """Hold `global_lock`'s lock around your own FX trace (a profiler's symbolic_trace) in any thread.

    With every worker step under `global_lock`, a trace under this lock never overlaps a step, so its
    process-wide nn.Module patches and FX flag never meet another thread's module or compiled call."""
    lock = lock if lock is not None else GLOBAL_STEP_LOCK
    with lock:
        yield
