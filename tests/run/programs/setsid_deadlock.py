"""A launcher that starts the lock-order deadlock (lock_cycle.py) in a session of its own, as torchrun starts its
workers, prints the worker's pid, and waits for it."""
import os
import subprocess
import sys

worker = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "lock_cycle.py")],
                          start_new_session=True)
print(f"worker {worker.pid}", flush=True)
sys.exit(worker.wait() and 1)
