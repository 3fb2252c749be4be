"""Prints the interpreter's switch interval as a thread of the program sees it (it matters only once one runs)."""
import sys
import threading

seen = []
worker = threading.Thread(target=lambda: seen.append(sys.getswitchinterval()), name="worker-0")
worker.start()
worker.join()
print(seen[0])
