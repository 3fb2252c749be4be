"""What a thread is to the user when its name says nothing: nn.DataParallel's replica threads.

`torch.nn.parallel.parallel_apply` (what nn.DataParallel and the Hugging Face Trainer on several GPUs without a
launcher run each step) starts one unnamed thread per replica ('Thread-3 (_worker)') whose target is its local
`_worker(i, module, input, kwargs, device, stream)`; a replica's exception is caught there, wrapped in
torch._utils.ExceptionWrapper with where='in replica I on device D', and re-raised in the caller, which may catch
it (docs/races.md, "nn.DataParallel's replica threads"). Read from the thread's target and arguments while it
runs (Thread.run deletes them when the target returns).
"""
from __future__ import annotations

import re
import threading
from typing import Optional, Tuple

_PARALLEL_APPLY = "torch.nn.parallel.parallel_apply"
_WHERE = re.compile(r"^in replica (\d+) on device (\S+)$")
# ExceptionWrapper.reraise in the caller: 'Caught <Error> in replica N on device D.' (the same `where`, re-raised)
_RERAISE = re.compile(r"^Caught [\w.]+ in replica \d+ on device \S+")


def replica_of(thread: threading.Thread) -> Optional[Tuple[int, str]]:
    """(replica index, device) of a parallel_apply worker thread, else None."""
    target = getattr(thread, "_target", None)
    if target is None or getattr(target, "__name__", "") != "_worker" \
            or getattr(target, "__module__", "") != _PARALLEL_APPLY:
        return None
    args: tuple = tuple(getattr(thread, "_args", ()) or ())
    index = args[0] if args and isinstance(args[0], int) else -1
    device = args[4] if len(args) > 4 and args[4] is not None else "?"
    return index, str(device)


def replicates_compiled_module(thread: threading.Thread) -> bool:
    """Whether a parallel_apply worker runs a replica of a torch.compile'd module (Dynamo's OptimizedModule):
    nn.DataParallel(torch.compile(model)), whose replicate corrupts the user's model (docs/races.md,
    "nn.DataParallel over a compiled model"), not a thread race. Read by type, never by calling the module."""
    if replica_of(thread) is None:
        return False
    args: tuple = tuple(getattr(thread, "_args", ()) or ())
    module_type = type(args[1]) if len(args) > 1 else None
    return module_type is not None and module_type.__name__ == "OptimizedModule" \
        and module_type.__module__.startswith("torch._dynamo")


def is_replica_reraise(message: str) -> bool:
    """Whether an error's message is DataParallel re-raising a replica's error in the thread that called it."""
    return _RERAISE.match(message) is not None


def thread_label(thread: Optional[threading.Thread] = None, where: str = "") -> str:
    """The thread's name, with its replica role when it is one: 'replica 1 on device 0 (Thread-3 (_worker))'.
    `where`: torch's own words for the replica (ExceptionWrapper's), which know the device it resolved."""
    thread = thread or threading.current_thread()
    said = _WHERE.match(where.strip())
    if said is not None and replica_of(thread) is not None:
        return f"replica {said.group(1)} on device {said.group(2)} ({thread.name})"
    replica = replica_of(thread)
    if replica is None:
        return thread.name
    return f"replica {replica[0]} on device {replica[1]} ({thread.name})"


def role_of(label: str) -> str:
    """A thread_label's role without the thread's own name: 'replica 1 on device 0' (a plain name stays whole)."""
    return label.split(" (", 1)[0] if label.startswith("replica ") else label
