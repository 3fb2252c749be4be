"""Start the probe host as a child process, bounded in time, and turn what it printed into probe results.

The process runner is a parameter (`runner(argv, timeout) -> ChildResult`) so tests can hand in results for the
paths this machine cannot produce on demand; the default really starts, waits for and kills processes.
"""
from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Union

from dflash_doctor import children
from dflash_doctor.children import child_env, python_argv
from dflash_doctor.guards.host_document import HostDocument, HostDocumentError, HostSeconds, ProbeResult, decode
from dflash_doctor.guards.isolation import can_fork
from dflash_doctor.guards.state import LiveState

HOST_MODULE = "dflash_doctor.guards.probe_host"
# The host reports on its own shortly before `timeout`; this is how much longer we wait before killing it.
HOST_GRACE_S = 3.0
_KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class ChildResult:
    returncode: Optional[int]
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False


Runner = Callable[[Sequence[str], float], ChildResult]


# The probe host's progress lines on stderr start with this (probe_host._tell); the rest is ordinary stderr.
PROGRESS_MARK = "@dflash-doctor-progress"


def run_child(argv: Sequence[str], timeout: float,
              on_stderr_line: Optional[Callable[[str], None]] = None,
              stdin_line: Optional[Callable[[], str]] = None) -> ChildResult:
    """Run `argv` in a new session with children.child_env(); past `timeout` the whole process group (the forked
    probes too) is killed. `on_stderr_line` sees each stderr line as the child writes it (its progress).
    `stdin_line()`, called once the child has started (it may wait for something read meanwhile), is the one line
    the child gets on stdin; if it raises, the child is killed and the exception goes to the caller."""
    began = time.monotonic()
    proc = children.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL if stdin_line is None else subprocess.PIPE,
                          text=True, errors="replace", env=child_env())
    out: List[str] = []
    err: List[str] = []

    def read_out() -> None:
        assert proc.stdout is not None
        out.append(proc.stdout.read())

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)
            if on_stderr_line is not None:
                on_stderr_line(line.rstrip("\n"))

    # Both pipes are drained by threads (communicate() would hide stderr until the end).
    readers = [threading.Thread(target=read, daemon=True) for read in (read_out, read_err)]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        if stdin_line is not None:
            _send(proc, stdin_line)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            try:
                proc.wait(timeout=_KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        # The child's own children can hold the pipes open after it exits: they get what is left of `timeout`,
        # then the group is killed, as when the child itself overran.
        for reader in readers:
            reader.join(max(0.0, timeout - (time.monotonic() - began)))
        if any(reader.is_alive() for reader in readers):
            timed_out = True
            _kill_group(proc)
        for reader in readers:  # something still holding the pipes open: give up on the rest of the output
            reader.join(_KILL_WAIT_S)
        _kill_group(proc)  # the host is done; a forked probe it left behind is not
        return ChildResult(proc.returncode, "".join(out), "".join(err), time.monotonic() - began,
                           timed_out=timed_out)
    finally:
        children.release(proc.pid)


def _send(proc: subprocess.Popen, stdin_line: Callable[[], str]) -> None:
    assert proc.stdin is not None
    try:
        line = stdin_line()
    except BaseException:
        _kill_group(proc)
        proc.wait(timeout=_KILL_WAIT_S)
        raise
    try:
        proc.stdin.write(line + "\n")
        proc.stdin.close()
    except OSError:  # the child has ended already (BrokenPipeError): its exit and output say why
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()


@dataclass
class ProbeRun:
    results: Dict[str, ProbeResult]
    state: Optional[LiveState] = None  # the fresh interpreter's config flags, FX flag and GPU count
    seconds: Optional[HostSeconds] = None  # the first host's import and total (None: no host reported)


def host_argv(names: Sequence[str], timeout: float, fx_flag: Optional[str], isolation: str,
              python: str = sys.executable, fx_flag_stdin: bool = False) -> List[str]:
    """The probe host's argv, through children.python_argv: a `torch.py` in the working folder is never imported.
    With `fx_flag_stdin` the host reads the FX flag's name from its stdin once it has imported torch."""
    args = ["--timeout", f"{timeout:g}", "--isolation", isolation]
    if fx_flag_stdin:
        args += ["--fx-flag-stdin"]
    elif fx_flag:
        args += ["--fx-flag", fx_flag]
    return python_argv(HOST_MODULE, *args, *names, python=python)


def run_probes(names: Sequence[str], timeout: float, fx_flag: Optional[str] = None, *,
               runner: Runner = run_child, fork: Optional[bool] = None, python: str = sys.executable,
               on_progress: Optional[Callable[[Sequence[str]], None]] = None,
               fx_flag_from: Optional[Callable[[], Optional[str]]] = None) -> ProbeRun:
    """Run the named probes in one forked-per-probe host (Linux) or one host process per probe elsewhere.

    `on_progress(words)` gets each progress line the hosts write (`imported`, `probe NAME OUTCOME`), as they
    come, from the real runner (a test's stand-in for it reports none). `fx_flag_from()`, instead of `fx_flag`,
    gives the FX flag's name once the hosts have started (the real runner sends it on their stdin, so whatever
    it waits for is done while they import torch; a stand-in runner gets it in the argv, asked first)."""
    fork = can_fork() if fork is None else fork
    later = fx_flag_from is not None and runner is run_child
    if fx_flag_from is not None and not later:
        fx_flag = fx_flag_from()
    if runner is run_child and (on_progress is not None or later):
        runner = functools.partial(run_child, on_stderr_line=None if on_progress is None else _heard(on_progress),
                                   stdin_line=None if fx_flag_from is None else lambda: fx_flag_from() or "")
    groups = [list(names)] if fork else [[name] for name in names]
    argvs = [host_argv(group, timeout, fx_flag, "fork" if fork else "none", python, fx_flag_stdin=later)
             for group in groups]
    if len(argvs) == 1:
        children = [runner(argvs[0], timeout + HOST_GRACE_S)]
    else:
        with ThreadPoolExecutor(max_workers=len(argvs)) as pool:
            children = list(pool.map(lambda argv: runner(argv, timeout + HOST_GRACE_S), argvs))
    run = ProbeRun(results={})
    for group, child in zip(groups, children):
        document = _host_document(child)
        if not isinstance(document, HostDocument):
            failure = ProbeResult.failed(document, child.seconds)
            run.results.update({name: failure for name in group})
            continue
        for name in group:
            run.results[name] = document.probes.get(name) or ProbeResult.failed(
                "the probe host reported nothing for this probe")
        run.state = run.state or document.state
        run.seconds = run.seconds or document.seconds
    return run


def _heard(on_progress: Callable[[Sequence[str]], None]) -> Callable[[str], None]:
    def heard(line: str) -> None:
        if line.startswith(PROGRESS_MARK + " "):
            on_progress(line[len(PROGRESS_MARK) + 1:].split())

    return heard


def _host_document(child: ChildResult) -> Union[HostDocument, str]:
    """The host's document (its last line that opens a JSON object), or why there is none."""
    if child.timed_out:
        return _why_no_result(child)
    line = next((line for line in reversed(child.stdout.splitlines()) if line.startswith("{")), None)
    if line is None:
        return _why_no_result(child)
    try:
        return decode(line)
    except HostDocumentError as exc:
        if child.returncode != 0:  # it died while writing: say how it ended
            return _why_no_result(child)
        return f"the probe host's document was refused: {exc}"


def _why_no_result(child: ChildResult) -> str:
    tail = next((line.strip() for line in reversed(child.stderr.splitlines()) if line.strip()), "")
    tail = f": {tail}" if tail else ""
    if child.timed_out:
        return f"the probe process ran past {child.seconds:.1f} s and was killed{tail}"
    if child.returncode is not None and child.returncode < 0:
        return f"the probe process was killed by signal {-child.returncode}{tail}"
    if child.returncode:
        return f"the probe process exited with status {child.returncode}{tail}"
    return f"the probe process printed no result{tail}"
