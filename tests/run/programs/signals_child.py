"""Starts a grandchild (`sleep`), prints both pids, then waits. On SIGTERM it writes 'SIGTERM' to the file named
by argv[1] and dies of the signal (as a Python program with no handler would); on Ctrl-C, 'SIGINT' and dies of
KeyboardInterrupt."""
import os
import signal
import subprocess
import sys
import time

marker = sys.argv[1]
grandchild = subprocess.Popen(["sleep", "300"])


def on_term(signum, frame):
    with open(marker, "w") as handle:
        handle.write("SIGTERM")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


signal.signal(signal.SIGTERM, on_term)
try:
    # The pids are printed only once both handlers are in place: the test signals as soon as it reads them.
    print(f"pids {os.getpid()} {grandchild.pid}", flush=True)
    time.sleep(300)
except KeyboardInterrupt:
    with open(marker, "w") as handle:
        handle.write("SIGINT")
    raise
