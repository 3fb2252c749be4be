"""The source files `attach` may read for a frame of another process: regular files of bounded size that the
target itself could read, opened so that nothing can block or grow without bound.

attach usually runs as root, and a frame's file name is whatever the target's code objects say: a FIFO (which
hung attach), /dev/zero (which grew it to 22.7 GB), a root-only file (whose line appeared in the report). So a
file is read only if it is a regular file no bigger than MAX_SOURCE_BYTES, opened with O_NONBLOCK and checked on
the open descriptor, and if the target's uid and groups may read it and search every folder above it (the mode
bits; ACLs are not consulted, so a file readable only through an ACL is left out). What is read goes into
linecache, and a refused file goes in as empty, so no later reader of linecache opens it itself.
"""
from __future__ import annotations

import linecache
import os
import stat
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence

MAX_SOURCE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Reader:
    """Who the target is, for permission checks: effective uid and all its groups; uid 0 reads everything."""

    uid: int
    groups: FrozenSet[int]
    cwd: Optional[str] = None
    refused: Dict[str, str] = field(default_factory=dict)  # file -> why it was not read
    pid: Optional[int] = None

    @classmethod
    def of_process(cls, pid: int) -> "Reader":
        import psutil

        process = psutil.Process(pid)
        uid = process.uids().effective
        groups = {process.gids().effective}
        try:
            with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
                for line in status:
                    if line.startswith("Groups:"):
                        groups.update(int(g) for g in line.split()[1:] if g.isdigit())
        except OSError:
            pass
        try:
            cwd: Optional[str] = process.cwd()
        except psutil.Error:
            cwd = None
        return cls(uid, frozenset(groups), cwd, pid=pid)

    def may(self, info: os.stat_result, want: int) -> bool:
        """Whether the target may read (want=4) or search (want=1) a file with this stat, by its mode bits."""
        if self.uid == 0:
            return True
        if info.st_uid == self.uid:
            return bool(info.st_mode & (want << 6))
        if info.st_gid in self.groups:
            return bool(info.st_mode & (want << 3))
        return bool(info.st_mode & want)


def _folders_searchable(path: str, reader: Reader) -> bool:
    folder = os.path.dirname(path)
    while True:
        try:
            info = os.stat(folder)
        except OSError:
            return False
        if not reader.may(info, 1):
            return False
        parent = os.path.dirname(folder)
        if parent == folder:
            return True
        folder = parent


def read_source(name: str, reader: Reader) -> List[str]:
    """The lines of one frame file, or [] with the reason kept in reader.refused."""
    path = name if os.path.isabs(name) or reader.cwd is None else os.path.join(reader.cwd, name)
    if not os.path.isabs(path) or "\0" in path:
        reader.refused[name] = "not an absolute path"
        return []
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        reader.refused[name] = exc.strerror or type(exc).__name__
        return []
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            reader.refused[name] = "not a regular file"
            return []
        if info.st_size > MAX_SOURCE_BYTES:
            reader.refused[name] = f"larger than {MAX_SOURCE_BYTES} bytes"
            return []
        if not reader.may(info, 4) or not _folders_searchable(os.path.realpath(path), reader):
            reader.refused[name] = "the target's user may not read it"
            return []
        data = os.read(descriptor, MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        reader.refused[name] = exc.strerror or type(exc).__name__
        return []
    finally:
        os.close(descriptor)
    if len(data) > MAX_SOURCE_BYTES:  # it grew since fstat
        reader.refused[name] = f"larger than {MAX_SOURCE_BYTES} bytes"
        return []
    return data.decode("utf-8", errors="replace").splitlines(keepends=True)


def load_into_linecache(names: Iterable[str], readers: Sequence[Reader],
                        named_by: Optional[Mapping[str, Sequence[int]]] = None) -> None:
    """Put every frame file into linecache as read_source allows it (refused ones as empty), so the stack and lock
    readers, which go through linecache, never open a frame file themselves. With several processes (`named_by`:
    file -> the pids naming it), a file is read only if every process naming it may read it; with no reader at all
    (the target is gone) nothing is read."""
    by_pid = {reader.pid: reader for reader in readers if reader.pid is not None}
    for name in set(names):
        if not name or name.startswith("<"):
            continue
        pids = list((named_by or {}).get(name, ()))
        asked = [by_pid[pid] for pid in pids if pid in by_pid] if pids else list(readers)
        if not asked or (pids and len(asked) < len(set(pids))):
            lines: List[str] = []
        else:
            lines = read_source(name, asked[0])
            if lines and any(not read_source(name, other) for other in asked[1:]):
                lines = []
        linecache.cache[name] = (sum(map(len, lines)), None, lines, name)  # mtime None: checkcache keeps it
