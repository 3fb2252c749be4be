"""The hang classifier on synthetic stacks (function and file names, as torch's frames carry them), and the
faulthandler parser on a real dump."""
from __future__ import annotations

import faulthandler
import tempfile
import threading
from dataclasses import replace

import pytest

from dflash_doctor.outcomes import HangCycle
from dflash_doctor.runtime.deadlock import classify_hang
from dflash_doctor.runtime.lock_sites import LockRef
from dflash_doctor.runtime.stacks import Frame, ThreadStack, parse_faulthandler

TORCH = "/venv/lib/python3.12/site-packages/torch"


def stack(name, *frames, ident=1):
    return ThreadStack(name, ident, tuple(frames))


def frame(file, function, source="", line=10, enclosing=()):
    return Frame(file, line, function, source, tuple(enclosing))


def dynamo_compiler(name="drafter-1"):
    return stack(
        name,
        frame("/work/train.py", "worker"),
        frame(f"{TORCH}/_dynamo/convert_frame.py", "__call__"),
        frame(f"{TORCH}/_dynamo/convert_frame.py", "_compile", "with compile_lock, _disable_current_modes():"),
        frame(f"{TORCH}/_functorch/_aot_autograd/graph_capture.py", "aot_dispatch_autograd_graph"),
        frame(f"{TORCH}/autograd/__init__.py", "grad"),
        frame(f"{TORCH}/autograd/graph.py", "_engine_run_backward", "return Variable._execution_engine.run_backward("),
    )


def backward_waiter(name="thread-140211"):
    return stack(
        name,
        frame(f"{TORCH}/_functorch/_aot_autograd/runtime_wrappers.py", "_backward_impl"),
        frame(f"{TORCH}/_inductor/compile_fx.py", "compile_fx_backward", "with compile_lock:"),
        ident=2,
    )


def test_the_dynamo_compile_lock_autograd_cycle_is_named_with_both_threads():
    diagnosis = classify_hang([dynamo_compiler(), backward_waiter(), stack("MainThread", frame(
        "/usr/lib/python3.12/threading.py", "_wait_for_tstate_lock", "if lock.acquire(block, timeout):"))], 42.0)
    assert (diagnosis.kind, diagnosis.cycle) == ("deadlock", HangCycle.COMPILE_LOCK_AUTOGRAD)
    assert diagnosis.threads == ("drafter-1", "thread-140211")
    assert diagnosis.chain[0].startswith("drafter-1 holds compile_lock")
    assert "torch.autograd.grad" in diagnosis.chain[0]
    assert "compile_fx_backward" in diagnosis.chain[1] and diagnosis.chain[1].startswith("thread-140211")
    assert diagnosis.stalled_s == 42.0


def test_the_2_6_backward_compiler_name_counts_too():
    waiter = stack("t", frame(f"{TORCH}/_inductor/compile_fx.py", "bw_compiler", "with compile_lock:"))
    assert classify_hang([dynamo_compiler(), waiter]).cycle == HangCycle.COMPILE_LOCK_AUTOGRAD


def test_a_compiling_thread_alone_is_not_the_dynamo_cycle():
    # Half the cycle (nobody waits for compile_lock in a backward compile) is no cycle.
    assert classify_hang([dynamo_compiler()]).cycle == HangCycle.NO_CYCLE


def test_a_lock_order_cycle_between_two_threads_names_the_locks():
    a = stack("worker-a", frame("/app/locks.py", "take_ab", "with lock_b:", line=12,
                                enclosing=((11, "lock_a"), (12, "lock_b"))))
    b = stack("worker-b", frame("/app/locks.py", "take_ba", "with lock_a:", line=18,
                                enclosing=((17, "lock_b"), (18, "lock_a"))))
    diagnosis = classify_hang([a, b], 5.0)
    assert (diagnosis.kind, diagnosis.cycle) == ("deadlock", HangCycle.LOCK_CYCLE)
    assert set(diagnosis.threads) == {"worker-a", "worker-b"}
    assert "worker-a holds lock_a and waits for lock_b at /app/locks.py:12 in take_ab" in diagnosis.chain
    assert "worker-b holds lock_b and waits for lock_a at /app/locks.py:18 in take_ba" in diagnosis.chain


def test_self_locks_read_from_text_alone_are_no_cycle_and_read_by_object_they_are():
    # From a dump without objects, `self.lock_a` in two frames may be two objects' locks: no edge, no cycle.
    a = stack("a", frame("/app/x.py", "outer", "inner()", line=5, enclosing=((4, "self.lock_a"),)),
              frame("/app/x.py", "inner", "self.lock_b.acquire()", line=9))
    b = stack("b", frame("/app/x.py", "other", "self.lock_a.acquire()", line=30, enclosing=((29, "self.lock_b"),)))
    assert classify_hang([a, b]).cycle != HangCycle.LOCK_CYCLE
    # The same frames as a reader that saw the objects gives them: the held lock of one is the wanted of the other.
    lock_a, lock_b = LockRef("object 0xa", "self.lock_a"), LockRef("object 0xb", "self.lock_b")
    a = ThreadStack("a", 1, (replace(a.frames[0], holds=(lock_a,)), replace(a.frames[1], waits_for=lock_b)), True)
    b = ThreadStack("b", 2, (replace(b.frames[0], holds=(lock_b,), waits_for=lock_a),), True)
    diagnosis = classify_hang([a, b])
    assert diagnosis.cycle == HangCycle.LOCK_CYCLE and set(diagnosis.locks) == {"object 0xa", "object 0xb"}


def test_a_ring_of_three_locks_is_one_cycle_and_a_queue_behind_a_holder_is_not():
    refs = [LockRef(f"object 0x{i}", f"locks[{i}]") for i in range(3)]
    ring = [ThreadStack(f"t{i}", i, (Frame("/app/ring.py", 7, "turn", "locks[(i + 1) % 3].acquire()", (),
                                           refs[(i + 1) % 3], (refs[i],)),), True) for i in range(3)]
    diagnosis = classify_hang(ring)
    assert diagnosis.cycle == HangCycle.LOCK_CYCLE and sorted(diagnosis.threads) == ["t0", "t1", "t2"]
    holder = ThreadStack("holder", 9, (Frame("/app/q.py", 4, "slow", "time.sleep(5)", (), None, (refs[0],)),), True)
    queued = [ThreadStack(f"q{i}", 10 + i, (Frame("/app/q.py", 3, "slow", "with lock:", (), refs[0], ()),), True)
              for i in range(2)]
    assert classify_hang([holder, *queued]).cycle == HangCycle.LOCK_WAIT


def test_threads_waiting_on_locks_whose_holders_are_unknown_are_a_lock_wait():
    a = stack("a", frame("/app/x.py", "f", "with shared:", line=3, enclosing=((3, "shared"),)))
    b = stack("b", frame("/app/x.py", "g", "registry_lock.acquire()", line=7))
    diagnosis = classify_hang([a, b])
    assert (diagnosis.kind, diagnosis.cycle) == ("deadlock", HangCycle.LOCK_WAIT)


def test_threads_busy_elsewhere_are_not_called_a_deadlock():
    a = stack("a", frame("/app/x.py", "spin", "while True: pass", line=3))
    b = stack("b", frame("/usr/lib/python3.12/threading.py", "wait", "waiter.acquire()", line=355))
    diagnosis = classify_hang([a, b], 9.0)
    assert (diagnosis.kind, diagnosis.cycle) == ("other-error", HangCycle.NO_CYCLE)


@pytest.mark.timeout(30)
def test_a_real_faulthandler_dump_parses_into_named_stacks():
    release = threading.Event()

    def parked_here():
        release.wait(20)

    thread = threading.Thread(target=parked_here, name="parked")
    thread.start()
    try:
        with tempfile.TemporaryFile("w+") as handle:
            faulthandler.dump_traceback(file=handle, all_threads=True)
            handle.seek(0)
            text = handle.read()
    finally:
        release.set()
        thread.join(10)
    stacks = parse_faulthandler(text, {thread.ident: "parked"})
    parked = next(s for s in stacks if s.name == "parked")
    assert parked.ident == thread.ident
    assert [f.function for f in parked.frames][-3:] == ["parked_here", "wait", "wait"]
    assert parked.frames[-3].source == "release.wait(20)"


def test_a_lock_cycle_through_compile_lock_while_a_thread_compiles_in_autograd_is_the_dynamo_cycle():
    """The same deadlock seen from a sample in which the device thread is not yet in the backward compiler: it
    holds another lock the compiling thread waits for. Named DFD902's cycle, not a plain lock-order one."""
    cache = LockRef("object 0xc", "self._cache_lock")
    compile_lock = LockRef("torch compile_lock", "compile_lock")
    compiler = ThreadStack("drafter-0", 1, (
        Frame(f"{TORCH}/_dynamo/convert_frame.py", 900, "_compile", "", (), None, (compile_lock,)),
        Frame(f"{TORCH}/autograd/__init__.py", 400, "grad", "result = _engine_run_backward("),
        Frame(f"{TORCH}/_inductor/codecache.py", 50, "load", "with self._cache_lock:", (), cache)), True)
    device = ThreadStack("thread-77", 2, (
        Frame(f"{TORCH}/_inductor/codecache.py", 60, "store", "", (), None, (cache,)),
        Frame(f"{TORCH}/_dynamo/convert_frame.py", 880, "__call__", "with compile_lock:", (), compile_lock)), True)
    diagnosis = classify_hang([compiler, device])
    assert diagnosis.cycle == HangCycle.COMPILE_LOCK_AUTOGRAD and diagnosis.threads == ("drafter-0", "thread-77")


def test_lock_sites_read_one_line_and_multi_line_with_headers_and_earlier_acquires():
    import ast

    from dflash_doctor.runtime.lock_sites import sites_in

    tree = ast.parse(
        "def f(self, other):\n"            # 1
        "    with (self.lock,\n"           # 2
        "          other.lock):\n"         # 3
        "        work()\n"                 # 4
        "    with self.lock: pass\n"       # 5
        "    self.extra.acquire()\n"       # 6
        "    try:\n"                       # 7
        "        other.extra.acquire()\n"  # 8
        "    finally:\n"                   # 9
        "        self.extra.release()\n")  # 10
    assert sites_in(tree, 3).entering == ("other.lock",) and sites_in(tree, 3).inside == ("self.lock",)
    assert sites_in(tree, 4).inside == ("self.lock", "other.lock")
    assert sites_in(tree, 5).entering == ("self.lock",)
    assert sites_in(tree, 8).acquiring == ("other.extra",) and sites_in(tree, 8).acquired == ("self.extra",)
    assert sites_in(tree, 10).acquired == ("other.extra",)  # self.extra released on this line
    assert {"self", "other"} <= sites_in(tree, 8).local_names


def _closure_deadlock(starters: int):
    """`starters` threads each run `start_pair`, which deadlocks with a helper thread of its own through two locks
    local to that call (the helper's closure shares them). Returns a faulthandler dump and thread names."""
    names = {}
    ready = threading.Barrier(2 * starters + 1)

    def start_pair(index):
        mine, theirs = threading.Lock(), threading.Lock()
        both_hold = threading.Barrier(2)

        def helper():
            with theirs:
                both_hold.wait()
                ready.wait()
                with mine:
                    return

        helper_thread = threading.Thread(target=helper, name=f"helper-{index}", daemon=True)
        helper_thread.start()
        names[helper_thread.ident] = helper_thread.name
        with mine:
            both_hold.wait()
            ready.wait()
            with theirs:
                return

    threads = [threading.Thread(target=start_pair, args=(i,), name=f"starter-{i}", daemon=True)
               for i in range(starters)]
    for thread in threads:
        thread.start()
        names[thread.ident] = thread.name
    ready.wait(20)
    import time

    time.sleep(0.3)  # every thread is now blocked entering its second `with`
    with tempfile.TemporaryFile("w+") as handle:
        faulthandler.dump_traceback(file=handle, all_threads=True)
        handle.seek(0)
        # this call's threads only: a worker of the suite also holds other tests' deadlocked daemons (an earlier
        # call's pair, the reference's injected hang), each a cycle of its own
        return [stack for stack in parse_faulthandler(handle.read(), names) if stack.ident in names]


@pytest.mark.timeout(30)
def test_from_a_dump_a_closures_shared_locks_close_a_cycle_only_when_one_call_owns_them():
    # real threads, left deadlocked (daemons): one starter and its helper form a cycle through their cells
    diagnosis = classify_hang(_closure_deadlock(1))
    assert diagnosis.cycle == HangCycle.LOCK_CYCLE and sorted(diagnosis.threads) == ["helper-0", "starter-0"]
    # two starters run the same function: `mine` in each is another call's, so the dump cannot pair them up
    assert classify_hang(_closure_deadlock(2)).cycle != HangCycle.LOCK_CYCLE
