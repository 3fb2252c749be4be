"""Two passes over forked worker processes, without multiprocessing.

A large scan runs a cheap first pass on even shares of the files, then a second pass on work planned from all the
first results. On POSIX the workers are forked children talking over two pipes each: importing and starting a
ProcessPoolExecutor cost ~45 ms of a ~0.9 s scan of torch's sources, and a child that ends with os._exit skips
freeing the syntax trees it built. Elsewhere (no fork, or threads already running, where forking is unsafe) the
engine uses a process pool instead.
"""
from __future__ import annotations

import gc
import os
import pickle
import struct
import threading
from typing import Any, Callable, List, Sequence, Tuple

_LENGTH = struct.Struct("!Q")


class WorkerFailed(RuntimeError):
    """A worker raised, or died before it answered."""


def fork_usable() -> bool:
    return hasattr(os, "fork") and threading.active_count() == 1


def _send(fd: int, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise WorkerFailed("a scan worker ended without answering")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(fd: int) -> Any:
    (size,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size))
    status, payload = pickle.loads(_read_exactly(fd, size))
    if status != "ok":
        raise WorkerFailed(f"a scan worker failed: {payload}")
    return payload


def _child(share: Any, first: Callable[[Any], Any], second: Callable[[Any], Any], up: int, down: int) -> None:
    # The child lives for two calls and ends with os._exit: the cyclic collector would only re-scan what the
    # parent built (touching, so copying, its pages) and what is about to be dropped wholesale.
    gc.disable()
    status = 0
    try:
        _send(up, ("ok", first(share)))
        _send(up, ("ok", second(_receive(down))))
    except BaseException as exc:  # reported to the parent, which raises it there
        status = 1
        try:
            _send(up, ("error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
    finally:
        os._exit(status)


def two_passes(shares: Sequence[Any], first: Callable[[Any], Any], plan: Callable[[List[Any]], List[Any]],
               second: Callable[[Any], Any]) -> Tuple[List[Any], List[Any]]:
    """One forked worker per share runs `first(share)`; `plan(first results)` returns one piece of work per
    worker, which it runs as `second(piece)`. Returns both passes' results, in share order."""
    children: List[Tuple[int, int, int]] = []
    try:
        for share in shares:
            up_read, up_write = os.pipe()
            down_read, down_write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(up_read)
                os.close(down_write)
                _child(share, first, second, up_write, down_read)
            os.close(up_write)
            os.close(down_read)
            children.append((pid, up_read, down_write))
        firsts = [_receive(up) for _, up, _ in children]
        pieces = plan(firsts)
        for (_, _, down), piece in zip(children, pieces):
            _send(down, ("ok", piece))
        return firsts, [_receive(up) for _, up, _ in children]
    finally:
        for pid, up, down in children:
            os.close(up)
            os.close(down)
            os.waitpid(pid, 0)
