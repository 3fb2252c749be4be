"""The lock-order deadlock of lock_cycle.py, formed only when told: the two threads first wait on an Event (their
stacks sit at that wait), then, once stdin gives a line, take the two locks in opposite orders. Prints 'ready'
before, and 'locked' once both threads hold their first lock."""
import os
import sys
import threading

LOAD_LOCK = threading.Lock()
STEP_LOCK = threading.Lock()
go = threading.Event()
both_hold_one = threading.Barrier(3)


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
print(f"ready {os.getpid()}", flush=True)
sys.stdin.readline()
go.set()
both_hold_one.wait()
print("locked", flush=True)
for thread in threads:
    thread.join()
