"""Run callables each in its own forked process, with one deadline; a child still running then is killed.

Used by the probe host after it has imported torch once, so the three probes share that ~2-4 s import instead of
paying it three times, yet each still runs in a process of its own: one that corrupts its interpreter or hangs
touches nothing else. Linux only (fork after importing torch is what DataLoader workers do there too).
"""
from __future__ import annotations

import dataclasses
import os
import selectors
import signal
import sys
import time
from typing import Callable, Dict, Mapping, Optional

from dflash_doctor.guards.host_document import HostDocumentError, ProbeResult, decode_result, encode_result
from dflash_doctor.outcomes import ProbeOutcome


def can_fork() -> bool:
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def run_forked(tasks: Mapping[str, Callable[[], ProbeResult]], timeout: float,
               clock: Callable[[], float] = time.monotonic,
               on_done: Optional[Callable[[str, str], None]] = None) -> Dict[str, ProbeResult]:
    """{name: task()} with each task in a forked child; a task's result gets its `seconds`. The result crosses
    the pipe through host_document's codec.

    A child that times out, crashes or writes no result gets outcome `error` and why. `on_done(name, outcome)` is
    called as each child's result arrives (they end in any order), for progress.
    """
    started = clock()
    children = {}
    for name, task in tasks.items():
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never return into the caller's code
            os.close(read_fd)
            _child(task, write_fd)
        os.close(write_fd)
        children[name] = (pid, read_fd)
    output = {name: bytearray() for name in tasks}
    selector = selectors.DefaultSelector()
    for name, (_, read_fd) in children.items():
        selector.register(read_fd, selectors.EVENT_READ, name)
    deadline = started + timeout
    while selector.get_map():
        remaining = deadline - clock()
        if remaining <= 0:
            break
        for key, _ in selector.select(remaining):
            chunk = os.read(key.fd, 65536)
            if chunk:
                output[key.data].extend(chunk)
            else:
                selector.unregister(key.fd)
                os.close(key.fd)
                if on_done is not None:
                    on_done(key.data, _peek_outcome(bytes(output[key.data])))
    timed_out = {key.data for key in selector.get_map().values()}
    for key in list(selector.get_map().values()):
        selector.unregister(key.fd)
        os.close(key.fd)
    selector.close()
    results = {}
    for name, (pid, _) in children.items():
        if name in timed_out:
            _kill(pid)
        _, status = os.waitpid(pid, 0)
        results[name] = _result(name in timed_out, bytes(output[name]), status, timeout)
    return results


def _child(task: Callable[[], ProbeResult], write_fd: int) -> None:
    code = 0
    try:
        began = time.monotonic()
        try:
            result = task()
        except BaseException as exc:  # noqa: BLE001 - a failing probe is a result, not a crash of the host
            result = ProbeResult(ProbeOutcome.ERROR, error=f"{exc.__class__.__name__}: {exc}")
        payload = encode_result(dataclasses.replace(result, seconds=round(time.monotonic() - began, 3)))
        while payload:
            payload = payload[os.write(write_fd, payload):]
    except BaseException:  # noqa: BLE001 - whatever happens, this process must end here
        code = 1
    finally:
        os._exit(code)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _peek_outcome(payload: bytes) -> str:
    try:
        return decode_result(payload).outcome.value
    except HostDocumentError:
        return ProbeOutcome.ERROR.value


def _result(timed_out: bool, payload: bytes, status: int, timeout: float) -> ProbeResult:
    if timed_out:
        return ProbeResult.failed(f"timed out after {timeout:.1f} s; the probe process was killed", timeout)
    try:
        return decode_result(payload)
    except HostDocumentError as exc:
        if payload and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:  # it ended well and wrote this
            return ProbeResult.failed(f"the probe process wrote a result this reader refuses: {exc}")
    if os.WIFSIGNALED(status):
        why = f"killed by signal {os.WTERMSIG(status)}"
    else:
        why = f"exited with status {os.WEXITSTATUS(status)}"
    return ProbeResult.failed(f"the probe process {why} without a result")
