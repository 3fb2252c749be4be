"""SIGINT and SIGTERM during a run: the first asks the run to stop (workers get a few seconds, then the partial
report is written and the command exits 130 / 143); a second one stops waiting and exits at once, after killing
any worker processes.

Without this, Ctrl-C raised KeyboardInterrupt in the main thread while worker threads were inside torch, and the
interpreter's shutdown aborted with exit 134 ("terminate called without an active exception"); SIGTERM ended the
parent at once and left its worker processes training as orphans.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code_for(signal_name: str) -> int:
    """The shell's convention: 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signal.Signals[signal_name])


class StopRequest:
    """Set by the first stop signal (or by code that wants the run to end the same way)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal_name: Optional[str] = None
        self.hard_stop: List[Callable[[], None]] = []  # run before exiting on a second signal

    def request(self, signal_name: str) -> None:
        if self.signal_name is None:
            self.signal_name = signal_name
        self.event.set()

    @property
    def requested(self) -> bool:
        return self.event.is_set()


@contextmanager
def stop_signals(request: StopRequest) -> Iterator[StopRequest]:
    """Route SIGINT/SIGTERM to `request` while the block runs (main thread only: elsewhere Python cannot install
    handlers, and the caller's own handling stays in place)."""
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signum, frame) -> None:
        if request.requested:
            from dflash_doctor import children

            for stop in request.hard_stop:
                stop()
            children.stop_all()
            os._exit(128 + signum)
        request.request(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield request
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
