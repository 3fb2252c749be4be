"""dflash-doctor run's bootstrap: Python imports this at start-up because `run` put this folder first on
PYTHONPATH. It keeps the user's process as it would be without the tool:

- this folder leaves sys.path again at once (PYTHONPATH keeps it, so grandchildren such as torchrun workers load
  it too), and dflash_doctor is imported through a path entry that is removed right after;
- a sitecustomize the user already had (later on the path, or the interpreter's own) is imported after us;
- the agent (dflash_doctor/supervise/agent.py) hooks torch only when the user's code imports it.

Any failure here is written to the session folder and never stops the user's program.
"""
import os
import sys


def _start():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    session = os.environ.get("DFLASH_DOCTOR_RUN_SESSION")
    root = os.environ.get("DFLASH_DOCTOR_RUN_ROOT")
    if session and root:
        added = root not in sys.path
        if added:
            sys.path.append(root)  # last: it must never shadow a module of the user's
        try:
            from dflash_doctor.supervise import agent

            agent.start(session)
        except Exception as exc:  # noqa: BLE001 - the user's program runs whatever happens to the tool
            try:
                with open(os.path.join(session, "bootstrap-errors.txt"), "a", encoding="utf-8") as handle:
                    handle.write(f"{os.getpid()}: {type(exc).__name__}: {exc}\n")
            except OSError:
                pass
        finally:
            if added and root in sys.path:
                sys.path.remove(root)
    # The user's own sitecustomize, if any: forget this module so the import finds the next one on the path.
    this = sys.modules.pop("sitecustomize", None)
    try:
        # the user's, found now that this folder left sys.path
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        if "sitecustomize" not in sys.modules and this is not None:
            sys.modules["sitecustomize"] = this


_start()
