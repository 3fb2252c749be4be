"""Phase children forked from one interpreter that has imported torch and Dynamo once, instead of each child
importing them again (about 3 s a child on the 2-core CPU box: torch 1.4 s, torch._dynamo 1.6 s;
benchmarks/results/repro_phases.md).

What a forked child shares with a fresh one: the imports every phase child makes in its main thread before any
worker thread starts (torch, torch._dynamo, which the flight recorder hooks, the reference drafter's modules), and
nothing else. The server never compiles, never touches CUDA and never starts a thread, so each child still begins
with empty Dynamo and inductor caches and initialises its own device. On a CPU build it also makes the imports
`torch.compile(fn)` makes (inductor's compile code), which a child made before its first compile anyway; what
is imported inside a compile is left for the child, so the first compile's length, the window the races need,
is what it was. The few settings torch reads from the environment when it is imported are
read again in the child (`_settings_from_env`), and a child whose environment differs from the server's in any
other way (WARM_ENV_KEYS) is started fresh, as is any child when the server cannot start.

The server (`python -m dflash_doctor.repro.warm_start`) reads one fork request a line on stdin and answers on
stdout: ready once, forked per request, exited per child it reaped (repro/warm_protocol.py, the typed lines and
their one codec, which both sides write and read them with). Each
child leads a session of its own (its compile workers are killed with it) and dies with the server
(PR_SET_PDEATHSIG), and the server exits when the harness closes its stdin or dies.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Dict, List, Mapping, Optional

from dflash_doctor.repro import warm_protocol
from dflash_doctor.repro.facts import WarmStartFacts
from dflash_doctor.repro.runner import ChildExit, ProcessRunner, kill_group
from dflash_doctor.repro.warm_protocol import Exited, Forked, ForkRequest, ProtocolError, Ready

# The keys a forked child's environment may differ in from the server's: what torch and triton read only when
# they compile (the caches), what the child re-reads (_settings_from_env), and the import path, which the child
# sets itself. Any other difference might have been read at import time: that child starts fresh.
PER_CHILD_KEYS = frozenset({"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS"})
WARM_ENV_KEYS = PER_CHILD_KEYS | {"PYTHONPATH", "PYTHONSAFEPATH"}
READY_TIMEOUT_S = 120.0  # the server's imports on a loaded 2-core machine; past it, every child starts fresh
REAP_S = 0.05  # how often the server looks for ended children between requests
PR_SET_PDEATHSIG = 1


# -- the server ----------------------------------------------------------------------------------------------
def _preload() -> None:
    """What every phase child imports in its main thread before its workers start (repro/child.py's run)."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401 - the flight recorder hooks it before the workers start
    import torch.fx  # noqa: F401

    import dflash_doctor.mitigations  # noqa: F401
    import dflash_doctor.reference.replay  # noqa: F401
    import dflash_doctor.repro.child  # noqa: F401
    import dflash_doctor.repro.disturb  # noqa: F401
    import dflash_doctor.repro.steps  # noqa: F401
    import dflash_doctor.runtime  # noqa: F401


def _identity(value):
    return value


CUDA_ERROR_NOT_INITIALIZED = 3


def cuda_driver_initialised() -> bool:
    """Whether this process has initialised the CUDA driver (cuInit), which a forked child cannot use. torch's
    `torch.cuda.is_initialized()` says only whether torch did; a device count asked of the runtime initialises the
    driver without it. Read without initialising anything: a driver that was never loaded was never initialised,
    and a loaded one answers cuDeviceGetCount with CUDA_ERROR_NOT_INITIALIZED until cuInit ran."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            if "libcuda.so" not in maps.read():
                return False
        import ctypes

        count = ctypes.c_int(0)
        return ctypes.CDLL("libcuda.so.1").cuDeviceGetCount(ctypes.byref(count)) != CUDA_ERROR_NOT_INITIALIZED
    except (OSError, AttributeError):  # no /proc (not Linux) or no libcuda to ask: nothing was initialised
        return False


def _preload_compile_entry() -> None:
    """What `torch.compile(fn)` imports when it makes a compiled function (on torch 2.13 about 590 modules, 2 s on
    the 2-core box: inductor's compile_fx, lowering and scheduler, the backends' registry). A child makes its
    compiled function before its first compile begins, so every compile window in it began after these imports
    anyway: making them here moves no window. Only on a build without CUDA or ROCm: on the H200 (torch
    2.11+cu130) making one initialised the CUDA driver (docs/gpu-results.md, call4's anchors), after which no
    forked child could use the device."""
    import torch

    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        return
    torch.compile(_identity, dynamic=False)  # made, never called: nothing is compiled


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - without it the harness's kill of the child's group still ends it
        return


def _settings_from_env() -> None:
    """Settings torch fixed while the server imported it, read again from this child's environment."""
    threads = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    if threads:
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = int(threads)


def _become_child(request: ForkRequest) -> None:
    """In the forked process: become the phase child the request describes, run it, and never return."""
    code = 1
    try:
        os.setsid()
        _die_with_parent()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        log = os.open(request.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
        extra_path = [p for p in request.path if p not in sys.path]
        sys.path[1:1] = extra_path  # a --model child's folder and the user's PYTHONPATH, as a fresh child has
        import gc
        import random

        random.seed()  # the server's state would otherwise be every child's
        if not _timing_free(request):  # collections traverse the imports' objects, as in a fresh child
            gc.unfreeze()
        _settings_from_env()
        from dflash_doctor.repro import child

        sys.argv = ["dflash_doctor.repro.child", *request.argv]
        code = child.main(list(request.argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the traceback goes to the child's log; the parent sees no result
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _timing_free(request: ForkRequest) -> bool:
    """The child's spec says nothing it meets depends on how long its compiles take (PhaseSpec.timing_free)."""
    from dflash_doctor.repro.spec import PhaseSpec

    try:
        with open(request.argv[0], encoding="utf-8") as spec:
            return PhaseSpec.from_dict(json.load(spec)).timing_free
    except (OSError, ValueError, IndexError):  # the child itself says what is wrong with its spec
        return False


def _say(out: IO[str], message: warm_protocol.ServerMessage) -> None:
    out.write(warm_protocol.encode(message))
    out.flush()


def _reap(out: IO[str], forked: set) -> None:
    while forked:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        forked.discard(pid)
        _say(out, Exited(pid, os.waitstatus_to_exitcode(status)))


def serve(stdin: IO[str], stdout: IO[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the harness's to handle; it closes our stdin
    _preload()
    _preload_compile_entry()
    import torch

    if torch.cuda.is_initialized() or cuda_driver_initialised():  # a forked child could not use the GPU
        sys.stderr.write("warm start: CUDA was initialised by the imports; children cannot be forked\n")
        return 3
    if threading.active_count() != 1:  # a fork keeps only this thread, and any lock another one held
        sys.stderr.write("warm start: the imports started a thread; children cannot be forked\n")
        return 3
    # The imports' objects leave every collection of a child: each collection would otherwise walk them all and,
    # by touching them, copy the pages the server shares with its children (measured on the 2-core box: three
    # such children side by side, 8.8 s against 11.0 s). Only for a child whose compiles' length cannot change
    # what it meets; every other child unfreezes them first and collects as a fresh one does (_become_child).
    import gc

    gc.collect()
    gc.freeze()
    forked: set = set()
    _say(stdout, Ready(os.getpid()))
    buffer = ""
    while True:
        readable, _, _ = select.select([stdin], [], [], REAP_S)
        _reap(stdout, forked)
        if not readable:
            continue
        chunk = os.read(stdin.fileno(), 65536).decode("utf-8")
        if not chunk:  # the harness closed our stdin, or died: its children die with us (PR_SET_PDEATHSIG)
            return 0
        buffer += chunk
        while "\n" in buffer:
            line, buffer = buffer.split("\n", 1)
            try:
                request = warm_protocol.decode_request(line)
            except ProtocolError as exc:  # a harness of another version: it sees us gone and starts fresh
                sys.stderr.write(f"warm start: {exc}\n")
                return 3
            pid = os.fork()
            if pid == 0:
                _become_child(request)
            forked.add(pid)
            _say(stdout, Forked(request.ident, pid))


# -- the harness's side --------------------------------------------------------------------------------------
class _Server:
    """The running server and what it has said: the pid of each fork, the status of each exit."""

    def __init__(self, popen: subprocess.Popen, log: IO[bytes]) -> None:
        self.popen = popen
        self._log = log
        self._changed = threading.Condition()
        self.pids: Dict[int, int] = {}
        self.exits: Dict[int, int] = {}
        self.ready = False
        self.gone = False
        self.unreadable: Optional[str] = None  # a line of another protocol version: the server is no use
        self._next_id = 0
        self._write_lock = threading.Lock()
        threading.Thread(target=self._read, name="warm-start-reader", daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            try:
                message = warm_protocol.decode_message(line)
            except ProtocolError as exc:
                self.unreadable = str(exc)
                break
            with self._changed:
                if isinstance(message, Ready):
                    self.ready = True
                elif isinstance(message, Forked):
                    self.pids[message.ident] = message.pid
                    # A pid is reused only once the server has reaped and reported its last owner, so an exit
                    # already on record for it belongs to that earlier child.
                    self.exits.pop(message.pid, None)
                elif isinstance(message, Exited):
                    self.exits[message.pid] = message.status
                self._changed.notify_all()
        with self._changed:
            self.gone = True
            self._changed.notify_all()

    def wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: condition() or self.gone, timeout_s) and condition()

    def fork(self, argv: List[str], env: Mapping[str, str], cwd: str, log: str, path: List[str],
             timeout_s: float = 30.0) -> Optional[int]:
        with self._write_lock:
            self._next_id += 1
            ident = self._next_id
            assert self.popen.stdin is not None
            request = ForkRequest(ident, tuple(argv), dict(env), cwd, log, tuple(path))
            try:
                self.popen.stdin.write(warm_protocol.encode(request).encode("utf-8"))
                self.popen.stdin.flush()
            except (BrokenPipeError, OSError):
                return None
        if not self.wait_until(lambda: ident in self.pids, timeout_s):
            return None
        return self.pids[ident]

    def close(self) -> None:
        """Close its stdin (it exits on its own), then make sure: its group killed and reaped."""
        try:
            if self.popen.stdin is not None:
                self.popen.stdin.close()
            self.popen.wait(5.0)
        except (OSError, subprocess.TimeoutExpired):
            pass
        kill_group(self.popen, 5.0)
        self._log.close()


class ForkedChild:
    """A phase child the server forked: the same `Child` interface as runner.ChildProcess."""

    def __init__(self, server: _Server, pid: int, result_path: Path, clock: Callable[[], float]) -> None:
        self._server = server
        self.pid = pid
        self._result_path = result_path
        self._clock = clock
        self._started = clock()

    def _exit(self, timed_out: bool = False) -> ChildExit:
        self.kill()
        self._server.wait_until(lambda: self.pid in self._server.exits, 10.0)
        from dflash_doctor import children

        children.release(self.pid)
        return ChildExit(self._server.exits.get(self.pid), timed_out, self._clock() - self._started)

    def poll(self, timeout_s: float) -> Optional[ChildExit]:
        if self.pid in self._server.exits or self._server.gone or self._result_path.exists():
            return self._exit()
        if self._clock() - self._started < timeout_s:
            return None
        return self._exit(timed_out=True)

    def stop(self) -> ChildExit:
        return self._exit()

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)  # the child and its compile workers: its session is its own
        except (ProcessLookupError, PermissionError):
            pass


class WarmStartRunner:
    """The harness's default runner: phase children forked from a warm server, or started fresh (ProcessRunner)
    where that cannot be done the same way; `fresh_reason` says why the last child started fresh, if one did."""

    def __init__(self, workdir: Path, python: str = sys.executable,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.workdir = workdir
        self.clock = clock
        self.fresh = ProcessRunner(python=python, clock=clock)
        self.python = python
        self._server: Optional[_Server] = None
        self._server_env: Optional[Dict[str, str]] = None
        self.unavailable: Optional[str] = None  # why no server could be had; then every child starts fresh
        if not sys.platform.startswith("linux"):  # macOS's system libraries are not safe to fork after import
            self.unavailable = f"no warm start on {sys.platform}: children start fresh"
        self.forked = 0
        self.started_fresh = 0

    def _start_server(self, env: Mapping[str, str]) -> Optional[_Server]:
        from dflash_doctor import children

        server_env = {k: v for k, v in env.items() if k not in PER_CHILD_KEYS}  # no phase's caches or share
        log = open(self.workdir / "warm-start.log", "wb")
        argv = children.python_argv("dflash_doctor.repro.warm_start", python=self.python)
        try:
            popen = children.popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                   env=server_env, cwd=str(self.workdir))
        except children.ChildrenStopped:
            log.close()
            raise
        except OSError as exc:
            log.close()
            self.unavailable = f"the warm-start server could not start: {exc}"
            return None
        server = _Server(popen, log)
        if not server.wait_until(lambda: server.ready, READY_TIMEOUT_S):
            server.close()
            self.unavailable = "the warm-start server did not get ready" + (
                f": {server.unreadable}" if server.unreadable else "")
            return None
        self._server_env = server_env
        return server

    def _differs(self, env: Mapping[str, str]) -> bool:
        assert self._server_env is not None
        keys = (set(env) | set(self._server_env)) - WARM_ENV_KEYS
        return any(env.get(k) != self._server_env.get(k) for k in keys)

    def start(self, spec_path: Path, result_path: Path, env: Dict[str, str], log_path: Path,
              user_code: bool = False):
        if self._server is None and self.unavailable is None:
            self._server = self._start_server(env)
        if self._server is None or self._server.gone or self._differs(env):
            self.started_fresh += 1
            return self.fresh.start(spec_path, result_path, env, log_path, user_code=user_code)
        cwd = os.getcwd() if user_code else str(spec_path.parent)
        path = [cwd] if user_code else []
        path += [os.path.join(cwd, p) if not os.path.isabs(p) else p
                 for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        from dflash_doctor import children

        pid = self._server.fork([str(spec_path), str(result_path)], env, cwd, str(log_path), path)
        if pid is None:  # the server died between children: this one and the rest start fresh
            self.unavailable = "the warm-start server stopped answering" + (
                f": {self._server.unreadable}" if self._server.unreadable else "")
            self.started_fresh += 1
            return self.fresh.start(spec_path, result_path, env, log_path, user_code=user_code)
        children.register_group(pid)
        self.forked += 1
        return ForkedChild(self._server, pid, result_path, self.clock)

    def warm_start_facts(self) -> WarmStartFacts:
        return {"forked": self.forked, "fresh": self.started_fresh, "unavailable": self.unavailable}

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def main() -> int:
    return serve(sys.stdin, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())


__all__: List[str] = ["ForkedChild", "WarmStartRunner", "WARM_ENV_KEYS", "serve"]
