"""A worker thread dies of a KeyError; the main thread goes on until the file named by argv[1] appears (or 60 s
pass), then writes argv[2] and exits 3: proves the death was announced while it ran, and that the run went on."""
import os
import sys
import threading
import time


def load(batch):
    return batch["input_ids"]


worker = threading.Thread(target=load, args=({},), name="loader-0")
worker.start()
worker.join()
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
with open(sys.argv[2], "w") as handle:
    handle.write("still running")
sys.exit(3)
