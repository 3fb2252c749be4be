"""The agent's thread-start hook with a per-thread fix, in a process of its own (the hook patches threading for
the whole process). The fix is a real registry `Mitigation` declared here, whose `in_each_thread` context notes
the thread that entered it; prints one JSON line: {thread name: entered inside it}."""
import contextlib
import json
import sys
import tempfile
import threading
from pathlib import Path

from dflash_doctor.hazards import Hazard
from dflash_doctor.mitigations import Mitigation
from dflash_doctor.supervise.agent import Agent
from dflash_doctor.supervise.session import RunConfig

inside = threading.local()
seen = {}


@contextlib.contextmanager
def note_thread():
    inside.value = True
    try:
        yield
    finally:
        inside.value = False


probe = Mitigation(name="probe", summary="test", api="with note_thread(): ...", covers=frozenset({Hazard.DEADLOCK}),
                   caveats=(), cost="none", in_each_thread=note_thread)
session = Path(tempfile.mkdtemp())
config = RunConfig(fixes=("probe",))
config.write(session)
early = threading.Thread(target=lambda: seen.update(early=getattr(inside, "value", False)), name="early")
Agent(session, config, lookup={"probe": probe}.__getitem__).start()
early.start()  # before torch is imported: entering a torch switch would import torch, so it runs without
early.join()
import torch  # noqa: E402,F401 - the agent's import hook fires here


class OwnRun(threading.Thread):
    def run(self):
        seen["subclass"] = getattr(inside, "value", False)


threads = [threading.Thread(target=lambda: seen.update(plain=getattr(inside, "value", False)), name="plain"),
           OwnRun(name="subclass")]
for thread in threads:
    thread.start()
    thread.join()
seen["main"] = getattr(inside, "value", False)  # torch was imported in the main thread: it entered it too
print(json.dumps(seen))
sys.exit(0)
