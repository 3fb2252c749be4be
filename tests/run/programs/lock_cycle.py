"""Two real threads take two real locks in opposite orders: a lock-order deadlock (no torch). Prints its pid and
'ready' once both threads hold their first lock, then hangs until killed."""
import os
import sys
import threading

LOAD_LOCK = threading.Lock()
STEP_LOCK = threading.Lock()
both_hold_one = threading.Barrier(3)


def load_then_step():
    with LOAD_LOCK:
        both_hold_one.wait()
        with STEP_LOCK:
            pass


def step_then_load():
    with STEP_LOCK:
        both_hold_one.wait()
        with LOAD_LOCK:
            pass


threads = [threading.Thread(target=load_then_step, name="loader"),
           threading.Thread(target=step_then_load, name="trainer")]
for thread in threads:
    thread.start()
both_hold_one.wait()
print(f"ready {os.getpid()}", flush=True)
for thread in threads:
    thread.join()
sys.exit(0)
