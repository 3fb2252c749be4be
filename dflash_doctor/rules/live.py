"""Live-run rules (DFD9xx): what `dflash-doctor run` saw inside the user's own processes, and what `attach` read
from a running process's stacks.

Examples are live facts documents (`{"processes": [record, ...]}`, one per-process record each, trimmed to what
the rules read); dflash_doctor.supervise.findings turns them into findings, and the tests run every example.
"""
import json
from typing import List, Optional

from dflash_doctor.findings import Severity
from dflash_doctor.hazards import Hazard
from dflash_doctor.mitigations import fix_text
from dflash_doctor.rules.registry import Rule, register

_FX_ERROR = ("Detected that you are using FX to symbolically trace a dynamo-optimized function. "
             "This is not supported at the moment.")


def _frame(file: str, line: int, function: str, source: str = "", withs: Optional[list] = None) -> dict:
    return {"file": file, "line": line, "function": function, "source": source, "enclosing_with": withs or []}


def _process(pid: int, rank: Optional[int] = None, blames: Optional[list] = None, hang: Optional[dict] = None,
             fixes: Optional[List[str]] = None) -> dict:
    return {"pid": pid, "ppid": 1, "argv": ["train.py"], "rank": rank, "local_rank": rank,
            "torch_version": "2.13.0+cpu", "fx_flag_thread_local": False, "fixes": fixes or [], "problems": [],
            "events": [], "blames": blames or [], "hang": hang, "ended": None if hang else "exit",
            "started_at": 1764620000.0}


def _hang(cycle: str, kind: str, threads: List[str], chain: List[str], stacks: Optional[list] = None) -> dict:
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
        "compile-lock-autograd", "deadlock", ["worker-1", "thread-7781"],
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
        "lock-cycle", "deadlock", ["loader", "trainer"],
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
        "no-cycle", "other-error", ["MainThread"],
        ["no progress for 120.0 s and no lock cycle in the stacks", "MainThread at train.py:88 in wait_for_peer"]))),
    good=_GOOD,
))
