"""What runs inside every Python process `dflash-doctor run` starts (the bootstrap calls `start`).

At start-up (no torch): a flight recorder (plain data), the watchdog thread, a thread-start hook when a `--fix`
has a per-thread part, and the exit paths (atexit, sys.excepthook, os._exit, fork). When the user's code imports
torch, right after torch's own import finishes and before the user's code can create a compile wrapper: the
`--fix` set-ups, the recorder's hooks, and the blame hook on the FX-tracing predicate. A process that never
imports torch never imports it here either.

The record (records.py, its one codec) is written to the session folder when the watchdog fires, at the first
FX-tracing error of each thread, at a thread's death, and at exit, so a process killed afterwards (`--on-hang
kill`, SIGKILL) still reports. Every write checks the folder first (sessionfs.py): a process that outlives the run
writes nothing. A crash of the interpreter itself (SIGSEGV in an extension) leaves faulthandler's trace there.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Dict, List, Optional, Set

from dflash_doctor.outcomes import RecorderEventKind
from dflash_doctor.runtime.recorder import FX_ERROR_PREFIX, FlightRecorder
from dflash_doctor.supervise.session import FAULT_PREFIX, RunConfig, record_name
from dflash_doctor.supervise.sessionfs import SessionFolder

if TYPE_CHECKING:
    from dflash_doctor.findings import Problem
    from dflash_doctor.mitigations import Mitigation
    from dflash_doctor.runtime.watchdog import Watchdog
    from dflash_doctor.supervise.records import DeathRecord, HangRecord, ProcessRecord

MAX_EVENTS = 20_000  # per record: the newest ones (a long run's steady state adds none; recompiles do)
TOOL_THREAD_PREFIX = "dflash-doctor"
# Processes torch starts for itself, that sit idle by design: no watchdog there (inductor's compile workers).
HELPER_MARKERS = ("compile_worker",)
FX_MESSAGE = FX_ERROR_PREFIX + ". This is not supported at the moment."

_AGENT: Optional["Agent"] = None
_PACKAGE = sys.modules.get("dflash_doctor")  # this tool's package; the bootstrap takes the name off sys.modules
_PACKAGE_LOCK = threading.Lock()  # held only to count, never while the tool's code runs
_PACKAGE_USERS: Dict[str, Any] = {"depth": 0, "held": None}
# What the agent imports later (at a thread's death, at a hang, at exit), imported at its start while the package
# is under its name: afterwards only submodules whose parent is loaded can be imported.
_LATER = ("dflash_doctor.supervise.records", "dflash_doctor.runtime.fx_patches", "dflash_doctor.runtime.stacks",
          "dflash_doctor.runtime.deadlock", "dflash_doctor.runtime.watchdog", "dflash_doctor.findings")


@contextlib.contextmanager
def own_package():
    """This tool's package under the name `dflash_doctor` while the tool runs code that imports through it (the
    `--fix` set-ups and per-thread switches): the bootstrap leaves the name to the user's program, where a module
    of its own of that name shadows it as without the tool. Counted, so nested and concurrent uses (a set-up
    whose self-check starts a thread that enters the per-thread switches) share it and the last one restores."""
    with _PACKAGE_LOCK:
        if _PACKAGE_USERS["depth"] == 0:
            _PACKAGE_USERS["held"] = sys.modules.get("dflash_doctor")
            if _PACKAGE is not None:
                sys.modules["dflash_doctor"] = _PACKAGE
        _PACKAGE_USERS["depth"] += 1
    try:
        yield
    finally:
        with _PACKAGE_LOCK:
            _PACKAGE_USERS["depth"] -= 1
            held = _PACKAGE_USERS["held"]
            if _PACKAGE_USERS["depth"] == 0 and sys.modules.get("dflash_doctor") is _PACKAGE and held is not _PACKAGE:
                if held is None:
                    del sys.modules["dflash_doctor"]
                else:
                    sys.modules["dflash_doctor"] = held


def start(session: str) -> "Agent":
    """Called once per process by the bootstrap (it checked nothing: the config is read from a checked folder)."""
    global _AGENT
    if _AGENT is None:
        folder = SessionFolder.from_environ(session)
        for name in _LATER:
            importlib.import_module(name)
        _AGENT = Agent(Path(session), RunConfig.read(folder), folder=folder)
        _AGENT.start()
    return _AGENT


def current() -> Optional["Agent"]:
    return _AGENT


def _registry_entry(name: str) -> "Mitigation":
    with own_package():
        from dflash_doctor import mitigations as registry  # only with --fix: the registry is not small

        return registry.get(name)


class _CpuReader:
    """The watchdog's CPU reading of this process tree, deciding at its first reading (in the watchdog's thread,
    a second in, not at start-up): psutil's tree, or without psutil (another interpreter's environment) this
    process and its waited-for children through os.times()."""

    def __init__(self) -> None:
        self._read: Optional[Callable[[], float]] = None

    def __call__(self) -> float:
        if self._read is None:
            try:
                import psutil  # noqa: F401

                from dflash_doctor.runtime.watchdog import ProcessTreeCpu

                self._read = ProcessTreeCpu()
            except ImportError:
                self._read = _own_cpu
        return self._read()


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _mark_initialised(module) -> None:
    """Tell importlib that `module` has finished initialising, as it does itself the moment exec_module returns.
    Until then its module lock is held, and another thread's `import torch` would wait on it: a set-up that starts
    a thread (the shim's self-check) waited out its 10 s (docs/races.md, "What run and attach rely on")."""
    spec = getattr(module, "__spec__", None)
    if spec is not None and getattr(spec, "_initializing", False):
        spec._initializing = False


class _TorchImportHook:
    """Finds nothing itself: on the first `import torch` it lets the other finders find torch and wraps that
    loader's exec_module, so `then` runs right after torch's own __init__ has run."""

    def __init__(self, then: Callable[[], None]) -> None:
        self._then = then

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = _find_spec("torch")
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module
        then = self._then

        def exec_module(module):
            original(module)
            then()

        loader.exec_module = exec_module
        return spec


def _find_spec(name: str):
    """importlib.util.find_spec without importing it: ask each finder on sys.meta_path in turn."""
    for finder in list(sys.meta_path):
        find = getattr(finder, "find_spec", None)
        spec = find(name, None) if find is not None else None
        if spec is not None:
            return spec
    return None


# A Dynamo guard that broke while another thread traced (or had just traced) is the patcher race too: the trace
# swapped nn.Module.__call__ / __getattr__ on the class under the compile that was building its guards.
TRACE_NEARBY_S = 1.0
_GUARD_FUNCTIONS = ("CLOSURE_MATCH", "FUNCTION_MATCH", "ID_MATCH")


def _guard_broke(exc: BaseException) -> bool:
    """Whether `exc` or its causes is Dynamo failing on a guard of its own: 'Guard failed on the same frame it
    was created', or an error raised inside a guard builder (InternalTorchDynamoError: TypeError: 'NoneType'
    object is not subscriptable, from CLOSURE_MATCH, seen beside a tracing thread on torch 2.13)."""
    import traceback

    from dflash_doctor.runtime.fx_patches import GUARD_BREAK_MARKS

    seen = 0
    current: Optional[BaseException] = exc
    while current is not None and seen < 6:
        if GUARD_BREAK_MARKS[0] in str(current):
            return True
        for frame in traceback.extract_tb(current.__traceback__):
            if frame.name in _GUARD_FUNCTIONS and frame.filename.replace("\\", "/").endswith("_dynamo/guards.py"):
                return True
        current = current.__cause__ or current.__context__
        seen += 1
    return False


class ProcessHooks:
    """What the agent changes in the user's process, each change with its undo (`undo_all`, for a test or an
    agent that is stopped): the thread-start hook, the exit paths (atexit, sys.excepthook, os._exit), and
    faulthandler's crash trace."""

    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self.undo: List[Callable[[], object]] = []

    def undo_all(self) -> None:
        while self.undo:
            with contextlib.suppress(Exception):
                self.undo.pop()()

    def trace_crashes(self) -> None:
        """faulthandler into a file of the session folder, so an interpreter that dies of SIGSEGV or SIGABRT (a
        crash in an extension) leaves its threads' stacks in the report. Left alone when the user enabled it."""
        import faulthandler

        if faulthandler.is_enabled():
            return
        try:
            fd = self.agent.folder.open_new(f"{FAULT_PREFIX}{os.getpid()}.txt")
        except OSError:
            return
        faulthandler.enable(file=fd, all_threads=True)  # fd stays open for the life of the process: the crash writes it
        self.undo.append(faulthandler.disable)

    def thread_start(self) -> None:
        """Every thread started from now on enters the per-thread fixes around its whole life, and its death is
        watched. The hook sits on Thread._bootstrap_inner, which runs `run()` for subclasses that override it
        too. Threads that start before torch is imported run without the fixes (entering them would import
        torch), not without the watch."""
        agent = self.agent
        owner = threading.Thread
        name = "_bootstrap_inner" if hasattr(owner, "_bootstrap_inner") else "run"
        original = getattr(owner, name)
        per_thread = any(fix.in_each_thread is not None for fix in agent._fixes)

        def bootstrap(thread_self):
            if thread_self.name.startswith(TOOL_THREAD_PREFIX):
                return original(thread_self)
            agent.threads_started += 1
            if name == "_bootstrap_inner":
                self._watch_death(thread_self)
            if not per_thread or "torch" not in sys.modules:
                return original(thread_self)
            with contextlib.ExitStack() as stack:
                agent._enter_thread_fixes(stack)
                return original(thread_self)

        setattr(owner, name, bootstrap)
        self.undo.append(lambda: setattr(owner, name, original))

    def _watch_death(self, thread: threading.Thread) -> None:
        """Catch what escapes the thread's `run` (then re-raise it for whatever excepthook is there): a trainer
        that sets threading.excepthook to its own logger replaces the recorder's hook, and its dead threads
        would otherwise go unseen (a run that reads "no findings" while workers died)."""
        run = thread.run

        def watched_run() -> None:
            try:
                run()
            except SystemExit:  # threading ignores it too: the thread chose to end
                raise
            except BaseException as exc:
                with contextlib.suppress(Exception):  # the tool's own failure never replaces the user's error
                    self.agent.on_thread_death(exc)
                raise

        thread.run = watched_run  # type: ignore[method-assign]  # an instance attribute, this thread only

    def exits(self) -> None:
        import atexit

        agent = self.agent
        atexit.register(agent._at_exit)
        self.undo.append(lambda: atexit.unregister(agent._at_exit))
        previous_excepthook = sys.excepthook

        def excepthook(kind, value, traceback):
            if value is not None:
                agent.recorder.exception(value)
                if agent._main_thread_death_counts(value):
                    # the main thread dies of it: often a worker's error re-raised by future.result()
                    with contextlib.suppress(Exception):
                        agent.on_thread_death(value, reraised=True)
            previous_excepthook(kind, value, traceback)

        sys.excepthook = excepthook
        self.undo.append(lambda: setattr(sys, "excepthook", previous_excepthook))
        original_exit = os._exit

        def exit_now(code):
            with contextlib.suppress(Exception):
                agent.ended = "os._exit"
                if not agent.forked or agent._notable():
                    agent.write()
            original_exit(code)

        os._exit = exit_now
        self.undo.append(lambda: setattr(os, "_exit", original_exit))
        os.register_at_fork(after_in_child=agent._after_fork)  # the one change with no undo: Python has none


class Agent:
    def __init__(self, session: Path, config: RunConfig, clock: Callable[[], float] = time.perf_counter,
                 lookup: Optional[Callable[[str], "Mitigation"]] = None,
                 folder: Optional[SessionFolder] = None) -> None:
        self.session = session
        self.folder = folder or SessionFolder.from_environ(str(session))
        self.config = config
        self.recorder = FlightRecorder(clock=clock)
        self.clock = clock
        self.started_at = time.time()
        self.pid = os.getpid()
        self.forked = False
        self.problems: List["Problem"] = []
        self.fix_facts: Dict[str, Dict[str, Any]] = {}
        self.torch_version: Optional[str] = None
        self.fx_flag_thread_local: Optional[bool] = None
        self.hang: Optional["HangRecord"] = None
        self.deaths: List["DeathRecord"] = []  # each thread whose target raised
        self.threads_started = 0  # threads of the user's started since the agent began (not the tool's)
        self.ended: Optional[str] = None
        self.watchdog: Optional["Watchdog"] = None
        self._fixes = [(lookup or _registry_entry)(name) for name in config.fixes]
        self._write_lock = threading.Lock()
        self._blamed: Set[int] = set()  # threads whose first FX error is already written
        self._compiled = False
        self._seen_events = 0
        self._main_thread_fixes = contextlib.ExitStack()
        self.hooks = ProcessHooks(self)
        # a DataParallel replica's error, caught by parallel_apply and perhaps by the caller: reported as its death
        self.recorder.caught_in_replica.append(lambda exc, label: self.on_thread_death(exc, label=label))

    # -- start-up ------------------------------------------------------------------------------------------
    def start(self) -> None:
        from dflash_doctor.supervise import amplifiers

        amplifiers.at_start(amplifiers.parse(self.config.amplifiers))  # before the user's first thread starts
        self.hooks.trace_crashes()
        self.hooks.thread_start()  # the per-thread fixes, and every thread's death
        if "torch" in sys.modules:  # a sitecustomize chained before us imported it
            self.on_torch_imported()
        else:
            sys.meta_path.insert(0, _TorchImportHook(self.on_torch_imported))
        self.hooks.exits()
        if not any(marker in (sys.argv[0] if sys.argv else "") for marker in HELPER_MARKERS):
            self._start_watchdog()

    def _start_watchdog(self) -> None:
        from dflash_doctor.runtime.watchdog import Watchdog

        self.watchdog = Watchdog(lambda: self.recorder.last_progress, self.config.hang_after_s, self.on_hang,
                                 clock=self.clock, cpu_seconds=_CpuReader(),
                                 cycle_confirm_s=self.config.cycle_confirm_s, fallback_armed=self._compile_began,
                                 precheck=self._may_hold_a_cycle, thread_factory=threading.Thread)
        self.watchdog.start()

    @staticmethod
    def _may_hold_a_cycle() -> bool:
        from dflash_doctor.runtime.deadlock import may_hold_a_cycle

        me = threading.get_ident()
        return may_hold_a_cycle(top for ident, top in sys._current_frames().items() if ident != me)

    def _compile_began(self) -> bool:
        """Whether a Dynamo compile has started in this process (read incrementally from the events)."""
        if not self._compiled:
            events = self.recorder.events
            self._compiled = any(event.kind == RecorderEventKind.COMPILE for event in events[self._seen_events:])
            self._seen_events = len(events)
        return self._compiled

    def on_torch_imported(self) -> None:
        """Right after torch's __init__, before the user's next line: the `--fix` set-ups (the shim must precede
        every compile wrapper, a patcher fix every thread), the recorder's hooks, the blame hook. Never lets a
        failure of the tool break the user's import."""
        with own_package():
            self._on_torch_imported()

    def _on_torch_imported(self) -> None:
        from dflash_doctor import runtime

        try:
            torch = sys.modules["torch"]
            self.torch_version = str(getattr(torch, "__version__", "unknown"))
            symbolic_trace = importlib.import_module("torch.fx._symbolic_trace")
            self.fx_flag_thread_local = hasattr(symbolic_trace, "_is_fx_tracing_tls")
            runtime.install(self.recorder)
            self._watch_thread_settings()
            self._hook_fx_predicates()
            if any(fix.setup is not None for fix in self._fixes):
                _mark_initialised(torch)
                self.apply_setups()
            if threading.current_thread() is threading.main_thread():
                self._enter_thread_fixes(self._main_thread_fixes)
            helper = any(marker in (sys.argv[0] if sys.argv else "") for marker in HELPER_MARKERS)
            if self.config.amplifiers and not helper:  # after the fixes: a patcher fix precedes its first trace
                from dflash_doctor.supervise import amplifiers

                _mark_initialised(torch)  # its thread imports torch.fx while this import is finishing
                amplifiers.after_torch(amplifiers.parse(self.config.amplifiers))
        except Exception as exc:  # noqa: BLE001 - the user's `import torch` must succeed whatever the tool does
            self._problem("the flight recorder", exc, "the run went on without (some of) the recorder's hooks")

    def _watch_thread_settings(self) -> None:
        """DFD910: a worker whose compile settings differ from its starter's (runtime/thread_config.py)."""
        from dflash_doctor.runtime import thread_config

        self.hooks.undo.append(thread_config.watch(
            lambda gap: self.recorder.record(RecorderEventKind.COMPILE_SETTING, "I", **gap.to_detail())))

    def _problem(self, subject: str, exc: BaseException, hint: str) -> None:
        self._add_problem(subject, f"{type(exc).__name__}: {exc}", hint)

    def _add_problem(self, subject: str, reason: str, hint: str) -> None:
        from dflash_doctor.findings import Problem

        self.problems.append(Problem(subject, reason, hint))

    def apply_setups(self) -> None:
        """Each `--fix` set-up (mitigations.py), then the blame hook again: a set-up may have replaced the
        FX-tracing predicates (the shim does), and the blame must wrap what compile wrappers will bind."""
        from dflash_doctor import mitigations as registry

        for fix in self._fixes:
            if fix.setup is None:
                continue
            try:
                self.fix_facts[fix.name] = fix.setup()
            except registry.MitigationFailed as exc:
                self._add_problem(f"--fix {fix.name}", str(exc), "this torch cannot apply it; the run went on without it")
            except Exception as exc:  # noqa: BLE001 - a fix that breaks is reported, the user's compile goes on
                self._problem(f"--fix {fix.name}", exc, "the run went on without it")
        try:
            self._hook_fx_predicates()
        except Exception as exc:  # noqa: BLE001
            self._problem("the FX-error blame hook", exc, "FX errors are still recorded, without the holder")

    def _hook_fx_predicates(self) -> None:
        """Blame at the moment of the raise: compile_wrapper asks the FX-tracing predicate (bound when the wrapper
        is created, docs/races.md "The guard"), and raises when it says True under the default config. The
        predicate is wrapped here, before the user's code creates any wrapper; on True, and only when called from
        compile_wrapper, the recorder names the holder and its stack while the holder still holds the flag."""
        dynamo_config = importlib.import_module("torch._dynamo.config")
        for module_name in ("torch.fx._symbolic_trace", "torch._dynamo.eval_frame"):
            module = importlib.import_module(module_name)
            for name in ("is_fx_tracing", "is_fx_symbolic_tracing"):
                original = getattr(module, name, None)
                if original is None or getattr(original, "_dflash_doctor_blame", False):
                    continue
                setattr(module, name, self._blaming(original, dynamo_config))

    def _blaming(self, original: Callable[[], bool], dynamo_config) -> Callable[[], bool]:
        def predicate() -> bool:
            tracing = original()
            if (tracing and sys._getframe(1).f_code.co_name == "compile_wrapper"
                    and getattr(dynamo_config, "error_on_nested_fx_trace", True)
                    and not getattr(dynamo_config, "force_compile_during_fx_trace", False)):
                self.on_fx_error(RuntimeError(FX_MESSAGE))
            return tracing

        predicate._dflash_doctor_blame = True  # type: ignore[attr-defined]
        return predicate

    def on_fx_error(self, exc: BaseException) -> None:
        self.recorder.exception(exc)
        ident = threading.get_ident()
        if ident not in self._blamed:
            self._blamed.add(ident)
            self.write()

    # -- per-thread fixes ----------------------------------------------------------------------------------
    def _enter_thread_fixes(self, stack: contextlib.ExitStack) -> None:
        with own_package():
            self._enter_each(stack)

    def _enter_each(self, stack: contextlib.ExitStack) -> None:
        for fix in self._fixes:
            if fix.in_each_thread is None:
                continue
            try:
                context: ContextManager[object] = fix.in_each_thread()
                stack.enter_context(context)
            except Exception as exc:  # noqa: BLE001 - a thread must start even if a fix cannot be entered
                self._problem(f"--fix {fix.name}", exc, f"not applied in thread {threading.current_thread().name}")

    def on_thread_death(self, exc: BaseException, reraised: bool = False, label: Optional[str] = None) -> None:
        """Record a thread's death by `exc`. `reraised`: the main thread's, whose error may come from another
        thread (a ThreadPoolExecutor's future.result() raises the worker's): its own traces count as a tracer's."""
        import traceback

        from dflash_doctor.runtime.fx_patches import is_patcher_error
        from dflash_doctor.runtime.stacks import Frame
        from dflash_doctor.supervise.records import DeathRecord

        tracing = self.recorder.tracing_now()  # first: the tracer may leave its trace at any moment
        last = None if tracing else self.recorder.last_tracer(include_self=reraised)
        raised_at = tuple(Frame(f.filename, f.lineno or 0, f.name, (f.line or "").strip())
                          for f in traceback.extract_tb(exc.__traceback__))
        text = str(exc)
        traced_nearby = bool(tracing) or (last is not None and self.recorder.now() - last[1] <= TRACE_NEARBY_S)
        race = is_patcher_error(text) or (traced_nearby and _guard_broke(exc))
        from dflash_doctor.runtime.thread_roles import replicates_compiled_module, thread_label

        death = DeathRecord(label or thread_label(), type(exc).__name__, text[:500],
                            round(self.recorder.now(), 6), race,
                            raised_at, tuple(name for name, _ in tracing),
                            tracing[0][1] if tracing else self.recorder.trace_start_of(last[0]) if last else (),
                            last[0] if last else None, round(last[1], 6) if last else None,
                            replicates_compiled_module(threading.current_thread()))
        self.recorder.record(RecorderEventKind.THREAD_DIED, "I", type=death.error_type, message=death.error[:200])
        with self._write_lock:
            self.deaths.append(death)
        self.write()

    # -- hangs and exits -----------------------------------------------------------------------------------
    def on_hang(self, report) -> None:
        """The watchdog fired: write at once (the supervisor announces it); the process goes on as it is."""
        from dflash_doctor.supervise.records import HangRecord

        watchdog = self.watchdog
        fired = watchdog.fired_at if watchdog is not None and watchdog.fired_at is not None else self.clock()
        clear = watchdog.last_clear_sample_at if watchdog is not None else None
        start = self.recorder.started
        last_event = self.recorder.last_progress
        self.recorder.record(RecorderEventKind.HANG, "I", cycle=report.diagnosis.cycle)
        self.hang = HangRecord(report.diagnosis, tuple(report.stacks), round(fired - start, 6),
                               None if clear is None else round(clear - start, 6),
                               round(last_event - start, 6))
        self.write()

    def _main_thread_death_counts(self, value: BaseException) -> bool:
        """The main thread's death is a finding only in a process that ran threads of its own (a worker's error
        re-raised by future.result() is the case it is for). Ctrl-C, sys.exit and a reader that went away (a
        BrokenPipeError from `| head`) end a program in ordinary ways, as does any error of a single-threaded one:
        its exit code says so."""
        if isinstance(value, (KeyboardInterrupt, SystemExit, BrokenPipeError)):
            return False
        return self.threads_started > 0

    def _after_fork(self) -> None:
        """A forked child (a DataLoader worker): its own pid and an empty log; the watchdog thread did not
        survive the fork, and the child writes a record only if something happens in it."""
        self.forked = True
        self.pid = os.getpid()
        self.recorder.events.clear()
        self.recorder.blames.clear()
        self.hang, self.watchdog = None, None
        self._write_lock = threading.Lock()
        self._blamed = set()

    def _notable(self) -> bool:
        return bool(self.recorder.blames or self.hang or self.problems
                    or any(event.kind == RecorderEventKind.EXCEPTION for event in self.recorder.events))

    def _at_exit(self) -> None:
        self.ended = "exit"
        if self.watchdog is not None:
            self.watchdog.stop(1.0)
        if not self.forked or self._notable():
            self.write()

    # -- the record ----------------------------------------------------------------------------------------
    def record(self) -> "ProcessRecord":
        from dflash_doctor.supervise.records import BlameRecord, ProcessRecord

        def rank(name: str) -> Optional[int]:
            value = os.environ.get(name, "").strip()
            return int(value) if value.isdigit() and len(value) < 10 else None

        return ProcessRecord(
            pid=self.pid, ppid=os.getppid(), argv=tuple(str(arg) for arg in sys.argv), rank=rank("RANK"),
            local_rank=rank("LOCAL_RANK"), torch_version=self.torch_version,
            fx_flag_thread_local=self.fx_flag_thread_local, fixes=tuple(self.config.fixes),
            problems=tuple(self.problems), events=tuple(self.recorder.events[-MAX_EVENTS:]),
            blames=tuple(BlameRecord(b.victim, b.holder, b.kind, b.error, b.at_s, b.holder_stack, b.trace_start,
                                     b.victim_stack) for b in self.recorder.blames),
            hang=self.hang, deaths=tuple(self.deaths), ended=self.ended, started_at=self.started_at,
            fix_facts={name: dict(facts or {}) for name, facts in self.fix_facts.items()})

    def write(self) -> None:
        """Atomically replace this process's record (a reader never sees half of one), in a folder checked
        again first (sessionfs.py)."""
        from dflash_doctor.supervise.records import encode

        with self._write_lock:
            try:
                self.folder.replace(record_name(self.pid), encode(self.record()))
            except OSError:
                pass  # the session folder is gone or is not the run's: nothing left to tell
