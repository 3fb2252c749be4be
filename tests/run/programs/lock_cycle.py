"""Two real threads take two real locks in opposite orders: a lock-order deadlock (no torch). Prints its pid and
'ready' once both threads hold their first lock, then hangs until killed.

With `--when-told` the threads first wait on an Event (their stacks sit at that wait): it prints 'ready PID' at
once, forms the deadlock when stdin gives a line, and prints 'locked' once both threads hold their first lock."""
import os
import sys
import threading

LOAD_LOCK = threading.Lock()
STEP_LOCK = threading.Lock()
go = threading.Event()
both_hold_one = threading.Barrier(3)
when_told = sys.argv[1:] == ["--when-told"]


def load_then_step():
    go.wait()
    with LOAD_LOCK:
        both_hold_one.wait()
        with STEP_LOCK:
            pass


def step_then_load():
    go.wait()
    with STEP_LOCK:
        both_hold_one.wait()
        with LOAD_LOCK:
            pass


threads = [threading.Thread(target=load_then_step, name="loader"),
           threading.Thread(target=step_then_load, name="trainer")]
for thread in threads:
    thread.start()
if when_told:
    print(f"ready {os.getpid()}", flush=True)
    sys.stdin.readline()
go.set()
both_hold_one.wait()
print("locked" if when_told else f"ready {os.getpid()}", flush=True)
for thread in threads:
    thread.join()
sys.exit(0)
