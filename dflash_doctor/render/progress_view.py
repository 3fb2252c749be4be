"""How progress events (dflash_doctor/progress.py) reach the user, on stderr: a live display of what is running on
a terminal, plain lines otherwise (a CI log, `2> file`), nothing with -q.

Plain lines are `COMMAND [   25.7s] TASK: OUTCOME`, the time being the event's own `at_s`. While tasks run and
nothing else was written for `HEARTBEAT_S`, a line says what is still running and for how long, so a log never
goes quiet for minutes. rich's live display is imported only when a terminal asks for it (`--help` and `scan`
never load it).
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Dict, Iterator, List, Optional, TextIO, Tuple

from dflash_doctor.progress import EventKind, ProgressEvent, Reporter, silent
from dflash_doctor.printable import printable

if TYPE_CHECKING:
    from rich.text import Text

HEARTBEAT_S = 15.0  # a plain log says what is still running after this long without a line
LIVE_REFRESH_PER_S = 4


def _stamp(at_s: float) -> str:
    return f"[{at_s:7.1f}s]"


class _Tasks:
    """What is running: key -> (text, at_s it started); and the run's clock, estimated between events from the
    last event's `at_s` and the local clock (the domain's clock is its own, the display only extrapolates it)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.running: Dict[str, Tuple[str, float]] = {}
        self._anchor: Optional[Tuple[float, float]] = None  # (at_s, local clock) of the last event

    def record(self, event: ProgressEvent) -> None:
        self._anchor = (event.at_s, self.clock())
        if event.kind is EventKind.STARTED:
            self.running[event.key] = (event.text, event.at_s)
        elif event.kind is EventKind.FINISHED:
            self.running.pop(event.key, None)

    def now_s(self) -> float:
        if self._anchor is None:
            return 0.0
        at_s, local = self._anchor
        return at_s + (self.clock() - local)


def line_for(command: str, event: ProgressEvent) -> str:
    """The plain line for one event (also what the live display prints above itself)."""
    if event.kind is EventKind.STARTED:
        words = f"{event.key}: started" if event.text == event.key else f"{event.key}: started, {event.text}"
    elif event.kind is EventKind.FINISHED:
        words = f"{event.key}: {event.text}"
    else:
        words = event.text
    return f"{command} {_stamp(event.at_s)} {printable(words)}"


class LineReporter:
    """Plain lines, one per event, plus a heartbeat line while tasks run silently (see `beat`)."""

    def __init__(self, command: str, stream: TextIO, *, clock: Callable[[], float] = time.monotonic,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.command, self.stream, self.heartbeat_s = command, stream, heartbeat_s
        self.tasks = _Tasks(clock)
        self._lock = threading.Lock()  # the heartbeat thread writes too
        self._last_line = clock()

    def __call__(self, event: ProgressEvent) -> None:
        with self._lock:
            self.tasks.record(event)
            self._write(line_for(self.command, event))

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()
        self._last_line = self.tasks.clock()

    def beat(self) -> None:
        """Write the still-running line if tasks run and nothing was written for `heartbeat_s`."""
        with self._lock:
            if not self.tasks.running or self.tasks.clock() - self._last_line < self.heartbeat_s:
                return
            now = self.tasks.now_s()
            running = "; ".join(f"{key} for {now - since:.0f} s" for key, (_, since) in self.tasks.running.items())
            self._write(f"{self.command} {_stamp(now)} running: {printable(running)}")


class _LiveTasks:
    """The live region: one line per running task with its elapsed time, redrawn by rich on every refresh."""

    def __init__(self, command: str, tasks: _Tasks) -> None:
        self.command, self.tasks = command, tasks

    def __rich__(self) -> "Text":
        from rich.text import Text

        now = self.tasks.now_s()
        lines: List[Text] = []
        for key, (text, since) in list(self.tasks.running.items()):
            shown = key if text == key else f"{key}, {text}"
            # One screen line per task, the elapsed time first so an ellipsis never hides it.
            line = Text(f"{self.command} {_stamp(now)} ", style="dim", no_wrap=True, overflow="ellipsis")
            line.append(f"{now - since:5.1f} s  ", style="cyan")
            line.append(printable(shown))
            lines.append(line)
        return Text("\n", no_wrap=True, overflow="ellipsis").join(lines)


class LiveReporter:
    """On a terminal: finished tasks and notes printed as lines, the running ones in a live region below them."""

    def __init__(self, command: str, stream: TextIO, *, clock: Callable[[], float] = time.monotonic) -> None:
        from rich.live import Live

        from dflash_doctor.render.text import console_for

        self.command = command
        self.tasks = _Tasks(clock)
        self._lock = threading.Lock()
        self.live = Live(_LiveTasks(command, self.tasks), console=console_for(stream), transient=True,
                         refresh_per_second=LIVE_REFRESH_PER_S, redirect_stdout=False, redirect_stderr=False)

    def __call__(self, event: ProgressEvent) -> None:
        with self._lock:
            self.tasks.record(event)
            if event.kind is not EventKind.STARTED:
                from rich.text import Text

                self.live.console.print(Text(line_for(self.command, event), style="dim"))


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@contextlib.contextmanager
def reporting(command: str, *, quiet: bool = False, stream: Optional[TextIO] = None,
              heartbeat_s: float = HEARTBEAT_S) -> Iterator[Reporter]:
    """The reporter a command hands its domain, for the duration of the run."""
    stream = sys.stderr if stream is None else stream
    if quiet:
        yield silent
        return
    if _is_terminal(stream):
        live = LiveReporter(command, stream)
        with live.live:
            yield live
        return
    lines = LineReporter(command, stream, heartbeat_s=heartbeat_s)
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(min(1.0, heartbeat_s)):
            try:
                lines.beat()
            except (OSError, ValueError):  # stderr gone or closed: the run goes on, its lines do not
                return

    beater = threading.Thread(target=heartbeat, name="dflash-doctor-progress", daemon=True)
    beater.start()
    try:
        yield lines
    finally:
        stop.set()
        beater.join(2.0)
