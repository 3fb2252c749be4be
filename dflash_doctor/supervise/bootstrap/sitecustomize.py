"""dflash-doctor run's bootstrap: Python imports this at start-up because `run` put this folder first on
PYTHONPATH. It keeps the user's process as it would be without the tool:

- it imports nothing (only `sys`, `os` and `_thread`, which every interpreter has loaded before site runs), so a
  module of the user's named like a standard one (json.py, threading.py) or like the tool (dflash_doctor.py)
  still shadows it as without the tool, and an interpreter that never starts a thread nor imports torch pays
  well under a millisecond (benchmarks/run_bootstrap.py);
- the agent (dflash_doctor/supervise/agent.py) starts only when there is something to watch: at the first
  `Thread.start()` (a lock cycle, a thread's death) or right after `import torch`, whichever comes first. Its own
  imports then see the interpreter's library first and the user's folders last, and the standard modules it
  needed that the user's code had not imported yet are forgotten again afterwards, so the user's next `import`
  finds what it would without the tool. So is the name `dflash_doctor` itself: the agent's modules stay loaded
  under their full names (a submodule imports while its parent is listed), and the agent puts its package back
  under the name only while a `--fix` runs (agent.own_package);
- this folder leaves sys.path at once (PYTHONPATH keeps it, so grandchildren such as torchrun workers load it
  too); a sitecustomize the user already had (later on the path, or the interpreter's own) is imported after us.

Any failure of the tool is written to the checked session folder (one line: which interpreter, what failed) and
never stops the user's program.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_STATE = {"started": False}


def _user_entries(startup_path):
    """sys.path entries the user's run added or named: the script's folder (added after site ran) and
    PYTHONPATH's own entries. The agent imports with these last."""
    named = set(os.environ.get("PYTHONPATH", "").split(os.pathsep))
    return [entry for entry in sys.path if entry not in startup_path or entry in named]


def _users_modules(user):
    """Modules of the user's folders named like a standard one or like the tool (a json.py beside the script):
    the agent must not import them as its own, and the user keeps them. Any other module of theirs (torch built
    from a folder on PYTHONPATH) is left where it is."""
    folders = [os.path.join(os.path.abspath(entry or os.getcwd()), "") for entry in user]
    names = set(getattr(sys, "stdlib_module_names", ())) | {"dflash_doctor"}
    found = {}
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] not in names:
            continue
        where = getattr(module, "__file__", None)
        if isinstance(where, str) and any(os.path.abspath(where).startswith(f) for f in folders):
            found[name] = module
    return found


def _sessionfs(root):
    """sessionfs.py (os only), loaded from its file under a private name when the package cannot be imported
    (a module of the user's holds the name dflash_doctor, or this interpreter cannot run the package)."""
    loaded = sys.modules.get("dflash_doctor.supervise.sessionfs")
    if loaded is not None:
        return loaded
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_dflash_doctor_sessionfs", os.path.join(root, "dflash_doctor", "supervise", "sessionfs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _note_failure(session, root, why):
    """One line in a file of its own in the checked session folder; nothing when the folder fails the checks."""
    try:
        line = (f"pid {os.getpid()} ({sys.executable}, Python {sys.version.split()[0]}) ran without the recorder: "
                f"{why}\n")
        name = f"bootstrap-error-{os.getpid()}-{os.urandom(4).hex()}.txt"
        _sessionfs(root).SessionFolder.from_environ(session).create(name, line.encode("utf-8", "backslashreplace"))
    except Exception:  # noqa: BLE001 - nothing of the tool may reach the user's program
        pass


def _foreign_package(root):
    """Where a module named dflash_doctor that is not this tool's came from, if the program imported one."""
    module = sys.modules.get("dflash_doctor")
    where = str(getattr(module, "__file__", "") or "")
    if module is None or os.path.abspath(where).startswith(os.path.join(os.path.abspath(root), "")):
        return None
    return where or repr(module)


def _forget_new_standard_modules(before):
    """Forget the standard-library packages the agent's start imported that nothing had imported before (their
    code stays alive in the agent's references), so the user's next `import json` searches the path as it
    would have. Only whole new top-level packages, only from the interpreter's own library, never extensions."""
    library = os.path.join(os.path.dirname(os.path.abspath(os.__file__)), "")
    tops = {name.partition(".")[0] for name in before}
    for name in set(sys.modules) - before:
        where = str(getattr(sys.modules.get(name), "__file__", "") or "")
        if (name.partition(".")[0] not in tops and where.endswith(".py") and where.startswith(library)
                and "site-packages" not in where and "dist-packages" not in where):
            del sys.modules[name]


def _start_agent(session, root, startup_path, forget):
    """Import and start the agent once, with the interpreter's library ahead of the user's folders, then give
    the user back their own modules and the name dflash_doctor (see the module docstring). `forget`: the
    standard modules it pulled in too (not at `import torch`: torch's own imports done during the agent's hooks
    must stay single, one enum or sympy for the whole process)."""
    if _STATE["started"]:
        return
    _STATE["started"] = True
    saved = list(sys.path)
    before = set(sys.modules)
    user = _user_entries(startup_path)
    users_own = _users_modules(user)
    for name in users_own:
        del sys.modules[name]
    sys.path[:] = [root] + [entry for entry in saved if entry not in user] + user
    try:
        foreign = _foreign_package(root)
        if foreign is not None:
            _note_failure(session, root, f"it imported a module of its own named dflash_doctor ({foreign}), the "
                                         "name the recorder's package needs")
            return
        from dflash_doctor.supervise import agent

        agent.start(session)
    except Exception as exc:  # noqa: BLE001 - the user's program runs whatever happens to the tool
        _note_failure(session, root, f"{type(exc).__name__}: {exc}")
    finally:
        sys.path[:] = saved
        if forget:
            _forget_new_standard_modules(before)
        if "dflash_doctor" not in before:  # the agent's modules stay listed under their full names
            sys.modules.pop("dflash_doctor", None)
        sys.modules.update(users_own)


class _Trigger:
    """A finder that finds nothing itself: when `threading` or `torch` is imported, it lets the other finders
    find it and runs `then` right after the module's own code."""

    def __init__(self, then):
        self._then = then
        self._waiting = {"threading", "torch"}

    def find_spec(self, name, path=None, target=None):
        if name not in self._waiting:
            return None
        self._waiting.discard(name)
        if not self._waiting and self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is not self and find is not None:
                spec = find(name, path, target)
                if spec is not None:
                    break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original, then = loader.exec_module, self._then

        def exec_module(module):
            original(module)
            then(name)

        loader.exec_module = exec_module
        return spec


def _hook_thread_start(threading_module, start_agent):
    """The agent starts at the first Thread.start(), before that thread runs (its start hook sees it)."""
    owner = getattr(threading_module, "Thread", None)
    original = getattr(owner, "start", None)
    if original is None or getattr(original, "_dflash_doctor_start", False):
        return

    def start(thread_self):
        if not _STATE["started"]:
            owner.start = original  # the agent's own watchdog thread starts through the original
            start_agent()
        return original(thread_self)

    start._dflash_doctor_start = True
    owner.start = start


def _install(session, root):
    startup_path = list(sys.path)

    def start_agent(forget=True):
        _start_agent(session, root, startup_path, forget)

    def imported(name):
        if name == "torch":
            start_agent(forget=False)  # the agent sees torch in sys.modules, hooks it before the user's next line
        elif not _STATE["started"]:
            _hook_thread_start(sys.modules.get("threading"), start_agent)

    if "threading" in sys.modules:  # loaded by the interpreter's own start-up (a .pth file's import)
        _hook_thread_start(sys.modules["threading"], start_agent)
    sys.meta_path.insert(0, _Trigger(imported))


def _start():
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != _HERE]
    session = os.environ.get("DFLASH_DOCTOR_RUN_SESSION")
    root = os.environ.get("DFLASH_DOCTOR_RUN_ROOT")
    if session and root:
        _install(session, root)
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
