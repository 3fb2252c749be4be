"""Every process the user's command starts, found and ended, so nothing outlives the run unless asked.

A process group is not enough: torchrun starts its workers in sessions of their own, and any program may call
setsid() or setpgid(). Three ways of finding them, each covering what the others miss:

- `run` becomes a child subreaper (prctl PR_SET_CHILD_SUBREAPER): a descendant whose parent ends is re-parented
  to `run`, not to init, so while `run` lives every process of the command is a descendant of it (`descendants`);
- every process the command starts carries the run's token in its environment (`carrying`), which finds them
  after `run` itself is gone;
- a watcher process (`Watcher`), forked before the command in a session of its own, holds the read end of a pipe
  whose write end only `run` has: when `run` dies without saying goodbye (SIGKILL cannot be caught), the watcher
  ends every process that carries the token and removes the session folder.

Linux only (/proc); elsewhere the process group is what is ended.
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set, Tuple

from dflash_doctor.supervise.sessionfs import TOKEN_ENV

PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 3.0
_GOODBYE = b"done"


@dataclass(frozen=True)
class EndedProcess:
    pid: int
    name: str

    def __str__(self) -> str:
        return f"{self.pid} ({self.name})"


def become_subreaper() -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _table() -> Dict[int, Tuple[int, str, str]]:
    """pid -> (ppid, name, state) of every process in /proc."""
    found: Dict[int, Tuple[int, str, str]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for entry in names:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                raw = handle.read().decode("utf-8", "replace")
        except OSError:
            continue
        name_end = raw.rfind(")")  # the name may hold spaces and parentheses: it ends at the last ')'
        fields = raw[name_end + 2:].split()
        if len(fields) >= 2:
            found[int(entry)] = (int(fields[1]), raw[raw.find("(") + 1:name_end], fields[0])
    return found


def process_names() -> Dict[int, str]:
    return {pid: name for pid, (_, name, _) in _table().items()}


def descendants(root: int, table: Optional[Dict[int, Tuple[int, str, str]]] = None) -> List[int]:
    """Live (not zombie) descendants of `root`, parents before children."""
    table = _table() if table is None else table
    children: Dict[int, List[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, pending = [], list(children.get(root, ()))
    while pending:
        pid = pending.pop(0)
        if table[pid][2] != "Z":
            found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


def carrying(token: str) -> List[int]:
    """Processes whose environment holds this run's token (readable for our own user's processes, and all of
    them as root)."""
    if not token:
        return []
    needle = f"{TOKEN_ENV}={token}".encode("ascii") + b"\0"
    me = os.getpid()
    found: List[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for entry in names:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        if needle in b"\0" + environ + b"\0" or environ.startswith(needle):
            found.append(int(entry))
    return found


def _name(pid: int, table: Dict[int, Tuple[int, str, str]]) -> str:
    return table.get(pid, (0, "?", ""))[1]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
        return raw[raw.rfind(b")") + 2:][:1] != b"Z"
    except OSError:
        return False


def reap_children(keep: Iterable[int] = ()) -> None:
    """Collect the exit status of re-parented descendants that ended (a subreaper must, or they stay zombies);
    never the ones in `keep` (the command itself, whose status the supervisor reads)."""
    kept = set(keep)
    for pid in descendants(os.getpid()) + [p for p, (ppid, _, state) in _table().items()
                                          if ppid == os.getpid() and state == "Z"]:
        if pid in kept:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue


def end_processes(pids: Iterable[int], grace_s: float = GRACE_S, at_once: bool = False,
                  keep: Iterable[int] = ()) -> List[EndedProcess]:
    """SIGTERM (or, `at_once`, SIGKILL) to each, SIGKILL to those left after `grace_s`; what was ended."""
    table = _table()
    doomed = [pid for pid in dict.fromkeys(pids) if pid != os.getpid() and _alive(pid)]
    ended = [EndedProcess(pid, _name(pid, table)) for pid in doomed]
    for pid in doomed:
        _signal(pid, signal.SIGKILL if at_once else signal.SIGTERM)
    deadline = time.monotonic() + (0.0 if at_once else grace_s)
    while not at_once and time.monotonic() < deadline and any(_alive(pid) for pid in doomed):
        reap_children(keep)
        time.sleep(0.05)
    for pid in doomed:
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
    reap_children(keep)
    return ended


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def command_processes(pgid: int, token: str, exclude: Set[int]) -> List[int]:
    """The command's processes now: this process's descendants (it is their subreaper), the command's group,
    and whatever carries the token."""
    table = _table()
    found = descendants(os.getpid(), table)
    found += [pid for pid in table if pid not in found and _group(pid) == pgid]
    found += [pid for pid in carrying(token) if pid not in found]
    return [pid for pid in found if pid not in exclude and table.get(pid, (0, "", ""))[2] != "Z"]


def _group(pid: int) -> Optional[int]:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


class Watcher:
    """The process that cleans up after a `run` killed by SIGKILL (module docstring)."""

    def __init__(self, session: str, token: str) -> None:
        read_end, self._write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the watcher: only os calls from here on, and os._exit
            try:
                _watch(read_end, self._write_end, session, token)
            finally:
                os._exit(0)
        os.close(read_end)

    def goodbye(self) -> None:
        """`run` ends normally: the watcher leaves without touching anything."""
        try:
            os.write(self._write_end, _GOODBYE)
            os.close(self._write_end)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _watch(read_end: int, write_end: int, session: str, token: str) -> None:
    if read_end < 3:  # run's stdin was closed, and the pipe took its number: keep it clear of 0-2
        import fcntl

        read_end = fcntl.fcntl(read_end, fcntl.F_DUPFD, 3)
    os.setsid()  # out of run's group and terminal: a Ctrl-C or a signal to the group must not reach it
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGALRM):
        signal.signal(signum, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # never hold the caller's pipes open (a test reading run's stderr would wait on us)
    os.closerange(3, read_end)
    os.closerange(read_end + 1, 65536)
    del write_end
    said = b""
    while True:
        chunk = os.read(read_end, 16)
        if not chunk:
            break
        said += chunk
    if said == _GOODBYE:
        return
    for _ in range(3):  # a process may be starting another while we end it
        end_processes(carrying(token), at_once=True)
    shutil.rmtree(session, ignore_errors=True)
