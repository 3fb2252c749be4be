"""A trainer that leaves helpers behind the way real ones do: one in a session of its own (as torchrun starts its
workers, or a daemon does), one in a process group of its own, one plain child. Prints all pids on one line, then
either exits at once (`exit`) or waits to be signalled (`wait`)."""
import os
import subprocess
import sys
import time

session_child = subprocess.Popen(["sleep", "300"], start_new_session=True)
group_child = subprocess.Popen(["sleep", "301"], process_group=0)
plain_child = subprocess.Popen(["sleep", "302"])
print(f"pids {os.getpid()} {session_child.pid} {group_child.pid} {plain_child.pid}", flush=True)
if sys.argv[1] == "wait":
    time.sleep(300)
