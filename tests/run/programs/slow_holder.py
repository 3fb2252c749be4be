"""A cache whose refresh holds its lock for a long time (a slow remote read) while two readers queue behind it. No
cycle: the refresher waits for nothing the readers hold; it finishes after `sys.argv[1]` seconds (default 30) and
the readers then go on. Prints 'ready PID' once both readers are queued."""
import os
import sys
import threading
import time


class Cache:
    def __init__(self):
        self.lock = threading.Lock()
        self.values = {}

    def refresh(self, seconds):
        with self.lock:
            time.sleep(seconds)  # the slow remote read
            self.values = {"step": 1}

    def get(self, key):
        with self.lock:
            return self.values.get(key)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    cache = Cache()
    refresher = threading.Thread(target=cache.refresh, args=(seconds,), name="refresher")
    refresher.start()
    time.sleep(0.2)
    readers = [threading.Thread(target=cache.get, args=("step",), name=f"reader-{i}") for i in range(2)]
    for thread in readers:
        thread.start()
    time.sleep(0.3)
    print(f"ready {os.getpid()}", flush=True)
    for thread in [refresher, *readers]:
        thread.join()
    print("done", flush=True)


if __name__ == "__main__":
    main()
