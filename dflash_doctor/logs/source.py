"""Run the scanner over a path, stdin or a stream, or follow a growing file: what `logs` and `status` call."""
from __future__ import annotations

import time
from typing import Callable, List, Optional

from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Finding, Problem, Report
from dflash_doctor.logs.facts import LogsFacts
from dflash_doctor.logs.options import LogOptions
from dflash_doctor.printable import printable_log
from dflash_doctor.logs.reader import CHUNK, compression_of, cut_of, follow_blocks, iter_buffers, open_log
from dflash_doctor.logs.scanner import LogScanner

OnFindings = Callable[[List[Finding]], None]


def scan_stream(stream, path: str, options: LogOptions = LogOptions(), chunk: int = CHUNK) -> Report[LogsFacts]:
    """Scan a binary stream to its end. A read that fails half-way, or compressed data cut short or damaged (a
    truncated .gz), is a Problem saying after which line; the findings then cover the lines read before it."""
    scanner = LogScanner(path, options)
    feed_block = scanner.feed_block
    stopped: Optional[str] = None
    try:
        for block, end in iter_buffers(stream, chunk=chunk):
            feed_block(block, scanner.lines + 1, end)
    except OSError as exc:
        stopped = str(exc)
    stopped = stopped or cut_of(stream)
    report = scanner.finish()
    if stopped is not None:
        report.problems.append(Problem(path, f"read stopped after line {scanner.lines:,}: {stopped}",
                                       "the findings cover the lines read before it"))
    return report


def scan_log(path: str, options: LogOptions, follow: bool = False, max_seconds: Optional[float] = None,
             on_findings: Optional[OnFindings] = None) -> Report[LogsFacts]:
    """The logs Report for `path` (`-`: stdin), read to its end or followed until `max_seconds` / Ctrl-C.

    What cannot be read (a missing file, a device, a FIFO, binary data, an unknown compression) is a Problem in the
    report (exit bit 4), never a hang."""
    if follow:
        return _follow(path, options, max_seconds, on_findings)
    opened = open_log(path)
    if isinstance(opened, Problem):
        report: Report[LogsFacts] = Report(command="logs", problems=[opened])
        report.facts = {"path": opened.subject, "lines": 0, "bytes": 0, "exceptions": 0, "threads": {},
                        "next_steps": []}
        return report
    stream, name, compression = opened
    try:
        report = scan_stream(stream, name, options)
    finally:
        if path != "-":
            stream.close()
    report.facts["compression"] = compression
    return report


def _follow(path: str, options: LogOptions, max_seconds: Optional[float],
            on_findings: Optional[OnFindings]) -> Report[LogsFacts]:
    from pathlib import Path

    if path == "-":
        raise UsageError("--follow needs a file; a pipe is already read as it is written, until it closes")
    if not Path(path).is_file():
        raise UsageError(f"cannot follow {printable_log(path)}: not a regular file")
    with open(path, "rb") as handle:
        compression = compression_of(handle.read(8))
    if compression is not None:
        # (a compressed file is not written line by line: following it would read compressed bytes as text)
        raise UsageError(f"cannot follow {printable_log(path)}: it is {compression}-compressed; read it without "
                         "--follow, or follow the uncompressed log it was made from")
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    return follow_file(path, options, should_stop=lambda: deadline is not None and time.monotonic() >= deadline,
                       on_findings=on_findings)


def follow_file(path: str, options: LogOptions, should_stop: Callable[[], bool],
                on_findings: Optional[OnFindings] = None, sleep=None, poll: float = 0.25) -> Report[LogsFacts]:
    """`tail -F` a file from its start until `should_stop()` or Ctrl-C; `on_findings` gets new findings live.

    A rotated, re-created or truncated file is read on without losing lines; line numbers start over with the
    new content and facts['restarts'] counts how often."""
    scanner = LogScanner(printable_log(path), options)
    restarts = 0

    def deliver(found: List[Finding]) -> None:
        if found and on_findings is not None:
            on_findings(found)

    lineno = 1
    try:
        for block in follow_blocks(path, should_stop, on_idle=lambda: deliver(scanner.idle()), sleep=sleep,
                                   poll=poll):
            if isinstance(block, str):  # REOPENED or TRUNCATED: the content starts over
                deliver(scanner.restart())
                restarts += 1
                lineno = 1
                continue
            deliver(scanner.feed_block(block, lineno))
            lineno = scanner.lines + 1
    except KeyboardInterrupt:
        pass  # Ctrl-C ends following; the report of what was read still comes out
    report = scanner.finish()
    report.facts["restarts"] = restarts
    return report
