"""Live-run rules (DFD9xx): what `dflash-doctor run` saw inside the user's own processes, and what `attach` read
from a running process's stacks.

Examples are live facts documents (`{"processes": [record, ...]}`, one per-process record each, trimmed to what
the rules read); dflash_doctor.supervise.findings turns them into findings, and the tests run every example.
"""
import json
from typing import List, Optional

from dflash_doctor.dataparallel import fix_text as dataparallel_fix_text
from dflash_doctor.findings import Severity
from dflash_doctor.hazards import Hazard
from dflash_doctor.mitigations import fix_text
from dflash_doctor.outcomes import FailureKind, HangCycle, RecorderEventKind
from dflash_doctor.rules.registry import Rule, register

_FX_ERROR = ("Detected that you are using FX to symbolically trace a dynamo-optimized function. "
             "This is not supported at the moment.")


def _frame(file: str, line: int, function: str, source: str = "", withs: Optional[list] = None) -> dict:
    return {"file": file, "line": line, "function": function, "source": source, "enclosing_with": withs or []}


def _process(pid: int, rank: Optional[int] = None, blames: Optional[list] = None, hang: Optional[dict] = None,
             fixes: Optional[List[str]] = None, deaths: Optional[list] = None, events: Optional[list] = None) -> dict:
    return {"pid": pid, "ppid": 1, "argv": ["train.py"], "rank": rank, "local_rank": rank,
            "torch_version": "2.13.0+cpu", "fx_flag_thread_local": False, "fixes": fixes or [], "problems": [],
            "events": events or [], "blames": blames or [], "hang": hang, "deaths": deaths or [],
            "ended": None if hang else "exit", "started_at": 1764620000.0}


def _death(thread: str, error_type: str, error: str, raised_at: list, tracing: Optional[List[str]] = None,
           tracing_stack: Optional[list] = None) -> dict:
    return {"thread": thread, "error_type": error_type, "error": error, "at_s": 3.2,
            "patcher_race": "not installed as a submodule" in error or "CURRENT_PATCHER" in error,
            "raised_at": raised_at, "tracing": tracing or [], "tracing_stack": tracing_stack or []}


def _hang(cycle: HangCycle, kind: FailureKind, threads: List[str], chain: List[str],
          stacks: Optional[list] = None) -> dict:
    return {"diagnosis": {"kind": kind, "cycle": cycle, "chain": chain, "threads": threads, "stalled_s": 3.0,
                          "hint": ""},
            "stacks": stacks or [], "detected_at_s": 41.5, "last_clear_sample_at_s": 38.5}


def _facts(*processes: dict) -> str:
    return json.dumps({"processes": list(processes)}, indent=1) + "\n"


_GOOD = _facts(_process(4242, fixes=["threadlocal-flag", "non-lazy-backward"]))

RUN_FX_FLAG_ERROR = register(Rule(
    code="DFD901",
    name="run-fx-flag-error",
    severity=Severity.ERROR,
    summary="a thread of your run raised the FX-tracing RuntimeError while another thread held the FX flag",
    rationale=(
        "Every torch.compile'd call checks a process-global FX-tracing flag (torch < 2.14), and any thread's "
        "torch.fx trace sets it, make_fx inside another thread's compile included. `run` hooks the check in "
        "your unmodified process, so at the moment a thread raises it names the thread that held the flag and "
        "keeps that thread's stack as it was then; or the thread whose trace exit left the flag stuck."
    ),
    fix=fix_text(Hazard.FX_FLAG_LEAK) + " Prove it in your own trainer: the same command under "
        "`dflash-doctor run --fix ...`.",
    example_format="live-facts",
    bad=_facts(_process(4242, blames=[{
        "victim": "drafter-0", "holder": "profiler", "kind": "fx-flag-leak", "error": _FX_ERROR, "at_s": 12.5,
        "holder_stack": [_frame("train.py", 40, "profile_loop"), _frame("train.py", 12, "forward")]}])),
    good=_GOOD,
))

LIVE_COMPILE_DEADLOCK = register(Rule(
    code="DFD902",
    name="live-compile-deadlock",
    severity=Severity.ERROR,
    summary="threads of your run deadlocked on Dynamo's compile_lock and the autograd device thread",
    rationale=(
        "One thread holds compile_lock inside Dynamo's _compile while AOTAutograd's joint trace waits in "
        "torch.autograd.grad for the autograd engine's device thread; that thread runs another thread's backward "
        "and waits for compile_lock in the lazy backward compile. Nothing progresses and nothing raises. The "
        "watchdog names the cycle from two stack samples with no progress between them, seconds after it forms."
    ),
    fix=fix_text(Hazard.DEADLOCK) + " Prove it in your own trainer: the same command under "
        "`dflash-doctor run --fix ...`.",
    example_format="live-facts",
    bad=_facts(_process(4242, rank=1, hang=_hang(
        HangCycle.COMPILE_LOCK_AUTOGRAD, FailureKind.DEADLOCK, ["worker-1", "thread-7781"],
        ["worker-1 holds compile_lock (Dynamo compiling a frame) and waits in torch.autograd.grad",
         "thread-7781 (the autograd device thread) waits for compile_lock in compile_fx_backward",
         "cycle: compile_lock -> autograd device thread -> compile_lock"]))),
    good=_GOOD,
))

LIVE_LOCK_DEADLOCK = register(Rule(
    code="DFD903",
    name="live-lock-deadlock",
    severity=Severity.ERROR,
    summary="threads of your run wait on each other's locks (a lock-order deadlock)",
    rationale=(
        "Two stack samples with no progress between them show threads blocked acquiring locks that the others "
        "hold (read from the `with` and `.acquire()` lines of their frames), but not the compile_lock / autograd "
        "cycle. The chain in the evidence says who holds what and waits for what."
    ),
    fix="Take the locks in one global order; the chain and the stacks in the JSON report show where each thread "
        "waits.",
    example_format="live-facts",
    bad=_facts(_process(4242, hang=_hang(
        HangCycle.LOCK_CYCLE, FailureKind.DEADLOCK, ["loader", "trainer"],
        ["loader holds LOCK_A and waits for LOCK_B at train.py:20 in load",
         "trainer holds LOCK_B and waits for LOCK_A at train.py:30 in step", "lock-order cycle: no progress"]))),
    good=_GOOD,
))

LIVE_NO_PROGRESS = register(Rule(
    code="DFD904",
    name="live-no-progress",
    severity=Severity.ERROR,
    summary="your run made no progress (no compile event, no CPU use) for --hang-after seconds, with no lock "
            "cycle in its stacks",
    rationale=(
        "After a compile began, no recorder event and no CPU use of the process tree for --hang-after seconds, "
        "and the stacks show no lock cycle: a thread may wait on a collective whose peer is gone, on I/O, or "
        "inside a C++ call. The evidence lists where each thread's stack ends."
    ),
    fix="Read the threads' stacks in the JSON report; raise --hang-after if the work was only slow.",
    example_format="live-facts",
    bad=_facts(_process(4242, rank=0, hang=_hang(
        HangCycle.NO_CYCLE, FailureKind.OTHER_ERROR, ["MainThread"],
        ["no progress for 120.0 s and no lock cycle in the stacks", "MainThread at train.py:88 in wait_for_peer"]))),
    good=_GOOD,
))


RUN_PATCHER_RACE = register(Rule(
    code="DFD905",
    name="run-fx-patcher-race",
    severity=Severity.ERROR,
    summary="a thread of your run died of the FX patcher race: another thread's torch.fx trace patched nn.Module "
            "for every thread",
    rationale=(
        "torch.fx's Tracer.trace replaces nn.Module.__call__ and __getattr__ on the classes while it traces, for "
        "every thread, and keeps its patcher in the module global CURRENT_PATCHER (docs/races.md, 'The FX "
        "patcher race'). A module call in another thread then raises 'NameError: module is not installed as a "
        "submodule' (inside a compile: Dynamo's 'RuntimeError when making fake tensor call ... got "
        "NameError(...)'), and two overlapping traces end in 'AssertionError: CURRENT_PATCHER is None in finally "
        "block'. `run` watches every thread's end around its `run()` (a trainer's own threading.excepthook "
        "does not hide it) and, at that moment, names the threads that were inside an FX trace, with the "
        "first one's stack: the profiler or graph inspection whose patches the dead thread met."
    ),
    fix=fix_text(Hazard.PATCHER_RACE) + " Prove it in your own trainer: the same command under "
        "`dflash-doctor run --fix isolate-fx-patches -- ...`.",
    example_format="live-facts",
    bad=_facts(_process(4242, deaths=[_death(
        "worker-0", "NameError", "module is not installed as a submodule",
        [_frame("train.py", 52, "worker", "loss = step_fn(x).pow(2).mean()")], ["monitor"],
        [_frame("train.py", 74, "monitor", "graph = torch.fx.symbolic_trace(model)")])])),
    good=_GOOD,
))

RUN_THREAD_DIED = register(Rule(
    code="DFD906",
    name="run-thread-died",
    severity=Severity.ERROR,
    summary="a thread of your run died with an exception no other rule explains",
    rationale=(
        "A thread whose target raised is gone, and whatever it fed (a GPU, a queue) is starved, while the "
        "process may still end with exit code 0: many trainers only log a thread's death. `run` watches every "
        "thread's end around its `run()`, so a trainer's own threading.excepthook does not hide it; the "
        "evidence keeps the traceback. The FX-tracing error (DFD901) and the FX patcher race (DFD905) are "
        "reported as such instead."
    ),
    fix="Read the exception and its traceback in the evidence; `dflash-doctor logs` on the run's output joins "
        "it with the worker's last step.",
    example_format="live-facts",
    bad=_facts(_process(4242, deaths=[_death(
        "loader", "KeyError", "'input_ids'", [_frame("train.py", 31, "collate", "ids = batch['input_ids']")])])),
    good=_GOOD,
))


RUN_DATAPARALLEL_COMPILED = register(Rule(
    code="DFD911",
    name="run-dataparallel-compiled-module",
    severity=Severity.ERROR,
    summary="nn.DataParallel ran replicas of a torch.compile'd module, and they failed",
    rationale=(
        "nn.DataParallel(torch.compile(model)) copies the compiled wrapper for each replica; the copy's "
        "assignments of its empty parameters and submodules go through the wrapper to your own model, which is "
        "left without its layers, and each replica thread then fails (an AttributeError, or a RecursionError in "
        "Dynamo's guard building: both seen on an H100 with torch 2.11). It is not a thread race and no thread "
        "fix helps. `run` sees the replica threads parallel_apply starts and the module each one runs, so it "
        "names this even when your trainer catches DataParallel's re-raised error."
    ),
    fix=dataparallel_fix_text(),
    example_format="live-facts",
    bad=_facts(_process(4242, deaths=[{**_death(
        "replica 0 on device 0 (Thread-1 (_worker))", "AttributeError", "'MLP' object has no attribute 'blocks'",
        [_frame("train.py", 44, "train_step", "loss = model(batch).pow(2).mean()")]), "replicated_compiled": True}])),
    good=_GOOD,
))


_PASSED = ("0/{n}: Unexpected recompilation: runtime guards failed even though they passed during "
           "recompilation-reason analysis.")


def _compile(thread: str, t: float, attempt: int) -> dict:
    return {"t": t, "thread": thread, "tid": 100 + attempt, "kind": RecorderEventKind.COMPILE, "phase": "B",
            "detail": {"trigger": "dynamo", "compile_id": f"0/{attempt}", "caller": ["train.py", 41]}}


def _storm() -> list:
    events = []
    for attempt, thread in enumerate(["worker-3", "worker-0", "worker-7"]):
        events.append(_compile(thread, 2.0 + attempt, attempt))
        if attempt:
            events.append({"t": 2.0 + attempt, "thread": thread, "tid": 100 + attempt,
                           "kind": RecorderEventKind.RECOMPILE, "phase": "I",
                           "detail": {"reason": _PASSED.format(n=attempt - 1)}})
    events.append({"t": 5.5, "thread": "worker-12", "tid": 112, "kind": RecorderEventKind.RECOMPILE_LIMIT,
                   "phase": "I", "detail": {"limit": "recompile_limit", "compile_id": "0/8"}})
    return events


RUN_RECOMPILE_RACE = register(Rule(
    code="DFD908",
    name="run-recompile-race",
    severity=Severity.WARNING,
    summary="threads of your run raced to compile the same function: recompiles whose guards 'passed', or the "
            "recompile limit hit in a worker thread",
    rationale=(
        "When several threads make the first call of one compiled function at once, each may compile the same "
        "frame: Dynamo's per-frame cache is filled while the others check it, and it logs 'Unexpected "
        "recompilation: runtime guards failed even though they passed' for each extra compile until the "
        "recompile limit is hit, after which that function runs uncompiled in every thread, silently (measured "
        "on the CPU with torch 2.13: 32 threads, one compiled model, the limit of 8 hit; docs/races.md, 'Races "
        "that show as recompiles'). `run` records every compile with its thread and the line that called it, "
        "the recompile reasons, and each recompile-limit hit, and names the threads."
    ),
    fix="Make the first call of each compiled function in one thread before starting the others (a warm-up "
        "step), or hold one lock around the first call (`first-call-lock`); on torch 2.12 and later a raised "
        "recompile limit must be set in each thread that compiles (the compile settings are per thread there).",
    example_format="live-facts",
    bad=_facts(_process(4242, events=_storm())),
    good=_GOOD,
))


def _setting_gap(thread: str, key: str, reads: str, starter_reads: str) -> dict:
    return {"t": 2.4, "thread": thread, "tid": 140000000000001, "kind": RecorderEventKind.COMPILE_SETTING,
            "phase": "I",
            "detail": {"key": key, "thread": thread, "reads": reads, "starter": "MainThread",
                       "starter_reads": starter_reads}}


_WORKER_AT_DEFAULT = _process(4242, events=[_setting_gap(
    "drafter-0", "torch._functorch.config.force_non_lazy_backward_lowering", "False", "True")])

RUN_SETTING_NOT_IN_THREAD = register(Rule(
    code="DFD910",
    name="run-compile-setting-not-in-thread",
    severity=Severity.WARNING,
    summary="a worker thread compiled with another value of a compile setting than the thread that started it "
            "had set: the setting did not reach it (torch 2.12+ keeps compile settings per thread)",
    rationale=(
        "From torch 2.12 a value assigned to torch._dynamo.config, torch._inductor.config or "
        "torch._functorch.config lives in the assigning thread's ContextVar, and a thread started later reads "
        "the default. `run` remembers, when a thread is started, what its starter read for each setting that "
        "matters to the thread races (force_non_lazy_backward_lowering, error_on_nested_fx_trace, "
        "force_compile_during_fx_trace, the recompile limits), and compares it with what the thread reads at its "
        "first compile. A difference means a fix or a limit set once in main does nothing in that worker: the "
        "deadlock fix leaves its backward compiled lazily on the autograd thread, a raised recompile limit is "
        "the default again."
    ),
    fix=("Set it in every thread that compiles: for the deadlock fix `dflash_doctor.runtime."
         "enable_non_lazy_backward()` before the workers start (it sets the switch in every thread started "
         "later) or `with dflash_doctor.runtime.non_lazy_backward_in_thread():` in each worker, or `dflash-doctor "
         "run --fix non-lazy-backward` for an unmodified trainer; any other compile setting: assign it at the top "
         "of each worker's target."),
    example_format="live-facts",
    bad=_facts(_WORKER_AT_DEFAULT),
    good=_GOOD,
))
