"""Two passes over forked worker processes, without multiprocessing.

A large scan runs a cheap first pass on even shares of the files, then a second pass on work planned from all the
first results, and, where the plan leaves some work to whichever worker is free first, that work one item at a time
(a queue of indexes on one more pipe, read as 4-byte records, written in whole records no longer than PIPE_BUF,
which a pipe never splits). On POSIX the workers are forked children talking over two pipes each: importing and starting a
ProcessPoolExecutor cost ~45 ms of a ~0.9 s scan of torch's sources, and a child that ends with os._exit skips
freeing the syntax trees it built. Elsewhere (no fork, or threads already running, where forking is unsafe) the
engine uses a process pool instead.
"""
from __future__ import annotations

import gc
import os
import pickle
import select
import struct
import threading
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

_LENGTH = struct.Struct("!Q")
_INDEX = struct.Struct("!I")  # one shared item's index on the queue
# Indexes are written this many at a time: a write of at most PIPE_BUF bytes reaches a pipe whole, so the queue only
# ever holds whole records and a worker's 4-byte read takes exactly one
_BATCH = max(1, getattr(select, "PIPE_BUF", 512) // _INDEX.size)


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


def _taken(queue: int) -> Iterator[int]:
    """The indexes this worker takes off the queue, until the parent has written them all and closed it."""
    while True:
        record = os.read(queue, _INDEX.size)
        if not record:
            return
        yield _INDEX.unpack(record)[0]


def _child(share: Any, first: Callable[[Any], Any], second: Callable[[Any], Any], up: int, down: int,
           after: Optional[Callable[[Any], Any]], queue: int) -> None:
    # The child lives for two calls and ends with os._exit: the cyclic collector would only re-scan what the
    # parent built (touching, so copying, its pages) and what is about to be dropped wholesale.
    gc.disable()
    status = 0
    try:
        _send(up, ("ok", first(share)))
        if after is None:
            _send(up, ("ok", second(_receive(down))))
        else:
            piece, shared = _receive(down)
            answer = second(piece)
            _send(up, ("ok", (answer, [(index, after(shared[index])) for index in _taken(queue)])))
    except BaseException as exc:  # reported to the parent, which raises it there
        status = 1
        try:
            _send(up, ("error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
    finally:
        os._exit(status)


def two_passes(shares: Sequence[Any], first: Callable[[Any], Any], plan: Callable[[List[Any]], Any],
               second: Callable[[Any], Any], after: Optional[Callable[[Any], Any]] = None
               ) -> Tuple[List[Any], List[Any]]:
    """One forked worker per share runs `first(share)`; `plan(first results)` returns one piece of work per
    worker, which it runs as `second(piece)`. Returns both passes' results, in share order.

    With `after`, `plan` returns (pieces, shared items): each worker, its piece done, takes shared items one at a
    time, whichever worker is free first, and runs `after(item)` on each; its result is then (second's result,
    [(index of the item, after's result), ...])."""
    children: List[Tuple[int, int, int]] = []
    queue_read, queue_write = os.pipe() if after is not None else (-1, -1)
    try:
        for share in shares:
            up_read, up_write = os.pipe()
            down_read, down_write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(up_read)
                os.close(down_write)
                if after is not None:
                    os.close(queue_write)  # else the queue never ends for this worker
                _child(share, first, second, up_write, down_read, after, queue_read)
            os.close(up_write)
            os.close(down_read)
            children.append((pid, up_read, down_write))
        if after is not None:
            os.close(queue_read)  # the workers alone read it: with none left, writing fails instead of waiting
            queue_read = -1
        firsts = [_receive(up) for _, up, _ in children]
        planned = plan(firsts)
        pieces, shared = planned if after is not None else (planned, [])
        for (_, _, down), piece in zip(children, pieces):
            _send(down, ("ok", (piece, shared) if after is not None else piece))
        if after is not None:
            try:
                for start in range(0, len(shared), _BATCH):
                    os.write(queue_write, b"".join(_INDEX.pack(index)
                                                   for index in range(start, min(start + _BATCH, len(shared)))))
            except BrokenPipeError:
                pass  # every worker has ended: reading their answers says how
            os.close(queue_write)
            queue_write = -1
        return firsts, [_receive(up) for _, up, _ in children]
    finally:
        for fd in (queue_read, queue_write):
            if fd != -1:
                os.close(fd)
        for pid, up, down in children:
            os.close(up)
            os.close(down)
            os.waitpid(pid, 0)
