"""The one way children are started (dflash_doctor/children.py): a Ctrl-C or SIGTERM that lands while Popen runs
is held until the child is registered, so stop_all can still kill it. Real signals in a real interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

# The signal is sent from inside Popen's window (a preexec_fn runs in the forked child before exec: it signals
# the parent, which is still inside Popen waiting for the exec). The parent's handler raises KeyboardInterrupt.
PROGRAM = textwrap.dedent("""
    import json, os, signal, sys, time
    from dflash_doctor import children

    parent = os.getpid()
    said = {}
    try:
        proc = children.popen([sys.executable, "-c", "import time; time.sleep(30)"],
                              preexec_fn=lambda: os.kill(parent, signal.SIGINT))
        time.sleep(5)  # not reached: the held Ctrl-C is raised as popen returns
        said["interrupted"] = False
    except KeyboardInterrupt:
        said["interrupted"] = True
    said["registered"] = sorted(children._LIVE)
    children.stop_all()  # and so it is killed
    print(json.dumps(said))
""")


@pytest.mark.timeout(60)
def test_a_signal_inside_popen_waits_until_the_child_is_registered():
    proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=50,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout)
    assert said["interrupted"] is True
    assert len(said["registered"]) == 1  # the child that Popen had started when the signal came
