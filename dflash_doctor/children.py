"""The one way dflash-doctor starts a child (repro phases, guards probes, pipeline workers), and the one
registry of the children it has running.

`python -m pkg` puts the working folder first on the child's import path, so a `torch.py` in the folder where a
user (or a CI job on a pull request) runs `dflash-doctor check .` would be imported and executed. A child
started by `python_argv` runs its module through a bootstrap whose first path entry is this package's own root
instead, and `child_env` keeps empty (= working folder) entries out of PYTHONPATH.

Helpers started behind our back (multiprocessing's spawn and forkserver children and its resource tracker,
all `python -c ...`; inductor's compile workers) see only the process environment: `isolate_process` cleans
it when the CLI starts (PYTHONSAFEPATH set, empty and relative PYTHONPATH entries dropped), so they inherit
the clean one. Only `--model pkg.module:factory` (and a user's own command) asks for user code, explicitly:
`keep_working_folder=True` keeps the folder importable for that child alone, and `user_env()` gives it the
environment the user started us with.

Every child joins the registry (`popen` starts and registers one in its own process group; `adopt` registers
one multiprocessing started), and `stop_all` kills every registered group. `commands.common.guarded` calls it
on every way out of a command, and cli.py's SIGINT/SIGTERM handlers call it before the command unwinds, so a
thread still waiting on a probe cannot keep it alive; after `stop_all` no new child starts.
"""
# Only os and sys, which the interpreter has loaded before it searches any path entry: __main__.py imports this
# module while the working folder is still first on sys.path, so any other import (typing, pathlib, even
# __future__) could run a file of that name from there. Hence the quoted annotations, and MYPY for
# typing.TYPE_CHECKING (mypy takes it as always true).
import os
import sys

MYPY = False
if MYPY:
    import subprocess
    from typing import Any, Dict, List, Mapping, Optional, Sequence

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

_BOOTSTRAP = (
    "import runpy, sys; sys.path[0] = {root!r}; {keep}"
    "sys.argv[0] = {module!r}; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
)


def python_argv(module: str, *args: str, python: "Optional[str]" = None,
                keep_working_folder: bool = False) -> "List[str]":
    """argv running `module` as __main__ in a fresh interpreter that cannot import from the working folder."""
    keep = "sys.path.insert(1, __import__('os').getcwd()); " if keep_working_folder else ""
    code = _BOOTSTRAP.format(root=PACKAGE_ROOT, module=module, keep=keep)
    return [python or sys.executable, "-c", code, *map(str, args)]


def _safe_python_path(value: str) -> "List[str]":
    """PYTHONPATH's entries without the empty and relative ones (each means a folder below the working one)."""
    cwd = os.getcwd()
    return [p for p in value.split(os.pathsep) if p and os.path.isabs(p) and os.path.normpath(p) != cwd]


def child_env(base: "Optional[Mapping[str, str]]" = None,
              extra: "Optional[Mapping[str, str]]" = None) -> "Dict[str, str]":
    """The child's environment: this package importable first, no working-folder entries, unbuffered output."""
    env = dict(os.environ if base is None else base)
    kept = _safe_python_path(env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in kept if p != PACKAGE_ROOT])
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONSAFEPATH"] = "1"  # Python >= 3.11: no implicit working-folder entry, whatever starts the child
    env.update(extra or {})
    return env


_USER_ENV: "Optional[Dict[str, str]]" = None  # the environment before isolate_process, for user code


def isolate_process() -> None:
    """For the CLI: from now on every child this process starts, by any means, inherits child_env()."""
    global _USER_ENV
    if _USER_ENV is None:
        _USER_ENV = dict(os.environ)
    os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]
    os.environ["PYTHONSAFEPATH"] = "1"


def user_environ() -> "Dict[str, str]":
    """The environment exactly as the user started dflash-doctor with, for their own command (`run`)."""
    return dict(os.environ if _USER_ENV is None else _USER_ENV)


def user_env(extra: "Optional[Mapping[str, str]]" = None) -> "Dict[str, str]":
    """For a child that runs the user's own code through this package (`repro --model`): user_environ(), their
    PYTHONPATH as given (relative entries too), this package importable."""
    env = user_environ()
    given = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + ([given] if given else []))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


# -- the registry of running children -------------------------------------------------------------------------
_LIVE: "Dict[int, bool]" = {}  # pid -> whether it leads a process group of its own (kill the group)
_LOCK = __import__("_thread").allocate_lock()  # threading would be imported from the working folder (above)
_STOPPED = False


class ChildrenStopped(RuntimeError):
    """A child was to start after stop_all: the command is ending."""


def popen(argv: "Sequence[str]", **kwargs: "Any") -> "subprocess.Popen[Any]":
    """subprocess.Popen in a new session (so the child and what it starts are one group), registered."""
    import subprocess

    with _LOCK, _signals_deferred():
        if _STOPPED:
            raise ChildrenStopped("the command is stopping; no new child is started")
        proc: "subprocess.Popen[Any]" = subprocess.Popen(list(argv), start_new_session=True, **kwargs)
        _LIVE[proc.pid] = True
    return proc


class _signals_deferred:
    """Hold Ctrl-C and SIGTERM until the child is registered. Popen forks, execs, then reads a pipe from the
    child: a KeyboardInterrupt raised inside it leaves a running child that no one registered, so no one kills it
    (seen: a repro child still writing its result into a removed folder seconds after `repro` had exited on
    SIGTERM). The held signal is handled right after, where it would have been. Python runs signal handlers in the
    main thread only, so another thread's Popen cannot be interrupted and needs no deferral. (A class, not a
    contextlib generator: this module imports only os and sys.)"""

    def __enter__(self) -> None:
        import signal
        import threading

        self.caught: "List[int]" = []
        self.previous: "Dict[int, Any]" = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.getsignal(signum)
            signal.signal(signum, lambda number, frame: self.caught.append(number))

    def __exit__(self, *exc_info: "Any") -> None:
        import signal

        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        for signum in self.caught[:1]:  # the first one, as if it had come now
            handler = self.previous[signum]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


def adopt(pid: int) -> None:
    """Register a child started elsewhere (a multiprocessing worker, in our own process group)."""
    with _LOCK:
        if _STOPPED:
            _kill(pid, False)
            return
        _LIVE[pid] = False


def register_group(pid: int) -> None:
    """Register a child that leads a process group of its own but was not started by `popen` (a phase child
    forked by repro's warm-start server); after stop_all it is killed at once."""
    with _LOCK:
        if _STOPPED:
            _kill(pid, True)
            return
        _LIVE[pid] = True


def release(pid: int) -> None:
    """The child has been reaped: forget it (its pid may be reused)."""
    with _LOCK:
        _LIVE.pop(pid, None)


def live() -> "List[int]":
    with _LOCK:
        return list(_LIVE)


def _kill(pid: int, group: bool) -> None:
    import signal

    try:
        if group:
            os.killpg(pid, signal.SIGKILL)
        else:  # what it started (inductor's compile workers) first, while their parent is still known
            _kill_descendants(pid)
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_descendants(pid: int) -> None:
    try:
        import psutil

        for process in psutil.Process(pid).children(recursive=True):
            try:
                process.kill()
            except psutil.Error:
                continue
    except Exception:  # noqa: BLE001 - psutil missing or the process gone: the child itself is still killed
        return


def stop_all(reopen: bool = False) -> None:
    """Kill every registered child (with its group); safe in a signal handler, idempotent. Afterwards no new
    child starts, unless `reopen` (a command ended and the process may run another) and no signal stopped it."""
    global _STOPPED
    acquired = _LOCK.acquire(timeout=1.0)  # a signal may land while this thread holds it: do not deadlock
    try:
        _STOPPED = _STOPPED or not reopen
        doomed = dict(_LIVE)
        if reopen:
            _LIVE.clear()
    finally:
        if acquired:
            _LOCK.release()
    for pid, group in doomed.items():
        _kill(pid, group)


def drop_working_folder_from_path() -> None:
    """For `python -m dflash_doctor`: the package is already imported, so the working folder need not stay on
    sys.path, where it would shadow torch (or anything) with a file of the same name."""
    cwd = os.getcwd()
    # Python turns a relative PYTHONPATH entry into an absolute one below the working folder: drop those too.
    relative = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if not os.path.isabs(p)}
    sys.path[:] = [p for p in sys.path if p == PACKAGE_ROOT or (
        os.path.isabs(p) and os.path.normpath(p) != cwd and os.path.normpath(p) not in relative)]
