"""A `--model` factory whose input builder takes two locks in opposite orders in threads 0 and 1 (with
`--shapes per-thread` the shape index is the thread index): a genuine lock-order deadlock with no torch.compile
in it, which the harness must report as hung and classify as a generic lock cycle, not the Dynamo one."""
from __future__ import annotations

import threading

LOCK_A = threading.Lock()
LOCK_B = threading.Lock()
BOTH_HOLD_ONE = threading.Barrier(2)


def _partner_arrived() -> bool:
    # Alone (the single-thread phase) the barrier breaks after a second and nobody deadlocks.
    try:
        BOTH_HOLD_ONE.wait(timeout=1.0)
        return True
    except threading.BrokenBarrierError:
        return False


def take_a_then_b() -> None:
    with LOCK_A:
        if _partner_arrived():
            with LOCK_B:
                pass


def take_b_then_a() -> None:
    with LOCK_B:
        if _partner_arrived():
            with LOCK_A:
                pass


def build():
    import torch

    def inputs(device, shape_index):
        (take_a_then_b if shape_index == 0 else take_b_then_a)()
        return (torch.ones(2, 4, device=device),)

    return torch.nn.Linear(4, 2), inputs
