"""Repro rules (DFD7xx): what a reproduced thread race was. Examples are repro facts documents (JSON); the
classifier in dflash_doctor.repro.findings turns them into findings, and the tests run them."""
from dflash_doctor.dataparallel import fix_text as dataparallel_fix_text
from dflash_doctor.findings import Severity
from dflash_doctor.hazards import Hazard
from dflash_doctor.mitigations import fix_text
from dflash_doctor.rules.registry import Rule, register

_FX_ERROR = ("RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function. "
             "This is not supported at the moment.")


def _facts(mitigation: str, verdict: str, kind, outcome: str, threads: str, blame: str = "[]",
           hang: str = "null", mode: str = "forced") -> str:
    return (
        "{\n"
        f'  "torch_version": "2.13.0+cpu", "device": "cpu", "threads": 3, "mode": "{mode}",\n'
        f'  "mitigation": "{mitigation}", "cache": "cold",\n'
        '  "single_thread": {"outcome": "ok", "seconds": 9.1,\n'
        '                    "threads": [{"name": "drafter-0", "outcome": "ok", "error": null, "steps": 3}]},\n'
        f'  "multi_thread": {{"outcome": "{outcome}", "seconds": 0.4, "hang": {hang},\n'
        f'                   "threads": [{threads}]}},\n'
        f'  "verdict": "{verdict}", "kind": {kind}, "blame": {blame}, "time_to_verdict_s": 11.2\n'
        "}\n"
    )


_OK_THREADS = '{"name": "drafter-0", "outcome": "ok", "error": null, "steps": 3}'
_GOOD = _facts("threadlocal-flag", "not-reproduced", "null", "ok", _OK_THREADS)

FX_FLAG_LEAK = register(Rule(
    code="DFD701",
    name="fx-flag-leak-reproduced",
    severity=Severity.ERROR,
    summary="another thread's FX trace made this thread's compiled call raise (FX-flag leak reproduced)",
    rationale=(
        "torch.fx's Tracer.trace sets a process-global flag that every torch.compile'd call checks, and make_fx "
        "inside any thread's compile goes through Tracer.trace. While one thread traces, another thread calling "
        "compiled code raises 'Detected that you are using FX to symbolically trace a dynamo-optimized "
        "function'. The repro ran the step alone (fine) and in threads (this error), and the flight recorder "
        "names the thread that held the flag at that moment."
    ),
    fix=fix_text(Hazard.FX_FLAG_LEAK) + " `dflash-doctor repro --matrix` shows which holds on your install.",
    example_format="repro-facts",
    bad=_facts("none", "reproduced", '"fx-flag-leak"', "error",
               '{"name": "drafter-0", "outcome": "error", "steps": 0, "error": "' + _FX_ERROR + '"}',
               blame='[{"victim": "drafter-0", "holder": "fx-holder", "at_s": 10.9}]'),
    good=_GOOD,
))

FX_FLAG_STUCK = register(Rule(
    code="DFD702",
    name="fx-flag-stuck",
    severity=Severity.ERROR,
    summary="two FX traces exited out of order and left the global FX flag stuck: every compiled call now fails",
    rationale=(
        "Tracer.trace saves the flag on entry and restores it on exit. If A enters, B enters, A leaves and then "
        "B leaves, B restores the True it saw: the flag stays True with no trace running, and every later call "
        "of any compiled function in any thread raises. This is the 'Dynamo state globally corrupted' symptom; "
        "only a new process clears it."
    ),
    fix="A process in that state must restart: only a new process clears the flag. Then: " + fix_text(
        Hazard.STUCK_FLAG),
    example_format="repro-facts",
    bad=_facts("none", "reproduced", '"stuck-flag"', "error",
               '{"name": "drafter-1", "outcome": "error", "steps": 0, "error": "' + _FX_ERROR + '"}',
               blame='[{"victim": "drafter-1", "holder": "fx-trace-b", "at_s": 10.2}]'),
    good=_GOOD,
))

COMPILE_LOCK_DEADLOCK = register(Rule(
    code="DFD703",
    name="compile-lock-deadlock",
    severity=Severity.ERROR,
    summary="threads deadlocked on Dynamo's compile_lock and the autograd device thread",
    rationale=(
        "One thread holds compile_lock inside Dynamo's _compile while AOTAutograd's joint trace calls "
        "torch.autograd.grad, which waits for the autograd engine's device thread; that thread is running "
        "another thread's backward and waits for compile_lock in the lazy backward compile "
        "(compile_fx_backward). A lock-order cycle: nothing progresses and no error is raised."
    ),
    fix=fix_text(Hazard.DEADLOCK) + " `dflash-doctor repro --matrix` shows which holds on your install.",
    example_format="repro-facts",
    bad=_facts("none", "reproduced", '"deadlock"', "hung",
               '{"name": "drafter-0", "outcome": "hung", "steps": 0, "error": null}',
               hang='{"kind": "deadlock", "cycle": "compile-lock-autograd", "threads": ["drafter-1", "thread-77"], '
                    '"chain": ["drafter-1 holds compile_lock and waits in torch.autograd.grad", '
                    '"thread-77 waits for compile_lock in compile_fx_backward"]}', mode="natural"),
    good=_GOOD,
))

THREAD_DEADLOCK = register(Rule(
    code="DFD704",
    name="thread-deadlock",
    severity=Severity.ERROR,
    summary="the threaded run hung: threads wait on each other's locks",
    rationale=(
        "No thread made progress for --hang-after seconds and the stacks show threads blocked acquiring locks, "
        "but not the known compile_lock/autograd cycle. The chain lists who waits for what."
    ),
    fix="Take the locks in one global order, or serialise the steps; the stack dump in the JSON facts shows where.",
    example_format="repro-facts",
    bad=_facts("none", "reproduced", '"deadlock"', "hung",
               '{"name": "drafter-0", "outcome": "hung", "steps": 1, "error": null}',
               hang='{"kind": "deadlock", "cycle": "lock-cycle", "threads": ["drafter-0", "drafter-1"], '
                    '"chain": ["drafter-0 holds lock_a and waits for lock_b", '
                    '"drafter-1 holds lock_b and waits for lock_a"]}', mode="natural"),
    good=_GOOD,
))

THREADED_STEP_FAILED = register(Rule(
    code="DFD705",
    name="threaded-step-failed",
    severity=Severity.WARNING,
    summary="the step works in one thread but fails in several, with an error that is not the FX-flag one",
    rationale=(
        "The single-thread control passed, so the step itself is sound; run concurrently it failed (or hung "
        "without a lock cycle in the stacks). Not one of the known torch.compile races, but a thread-safety "
        "problem all the same."
    ),
    fix="Read the thread's error and traceback in the JSON facts; `--trace out.json` shows the timeline.",
    example_format="repro-facts",
    bad=_facts("none", "reproduced", '"other-error"', "error",
               '{"name": "drafter-2", "outcome": "error", "steps": 1, "error": "KeyError: \'cache\'"}', mode="natural"),
    good=_GOOD,
))

_NAME_ERROR = "NameError: module is not installed as a submodule"

FX_PATCHER_RACE = register(Rule(
    code="DFD706",
    name="fx-patcher-race-reproduced",
    severity=Severity.ERROR,
    summary="another thread's torch.fx trace patched nn.Module under this thread's eager module call (FX patcher "
            "race reproduced)",
    rationale=(
        "torch.fx's Tracer.trace replaces torch.nn.Module.__call__ and __getattr__ on the classes for the whole "
        "trace and keeps its patcher in the module global CURRENT_PATCHER. While one thread traces (a profiler's "
        "symbolic_trace, a Tracer subclass), every other thread's eager module call goes through the tracer and "
        "raises 'NameError: module is not installed as a submodule'; two traces that overlap end in "
        "'AssertionError: CURRENT_PATCHER is None in finally block'. It breaks eager code as well as compiled "
        "code, and the thread-local FX flag (threadlocal-flag, torch 2.14) does not touch it."
    ),
    fix=fix_text(Hazard.PATCHER_RACE) + " `dflash-doctor repro --mode foreign-trace --mitigation NAME` shows which "
        "holds on your install.",
    example_format="repro-facts",
    bad=_facts("threadlocal-flag", "reproduced", '"fx-patcher-race"', "error",
               '{"name": "drafter-0", "outcome": "error", "steps": 0, "error": "' + _NAME_ERROR + '"}',
               mode="foreign-trace"),
    good=_GOOD,
))

DATAPARALLEL_COMPILED_MODULE = register(Rule(
    code="DFD707",
    name="dataparallel-over-compiled-module",
    severity=Severity.ERROR,
    summary="nn.DataParallel around a torch.compile'd module broke the user's model at its first step",
    rationale=(
        "nn.DataParallel replicates its module on every forward with `_replicate_for_data_parallel()`, which "
        "assigns the replica's `_parameters` and `_modules`. On a torch.compile'd module (OptimizedModule) those "
        "assignments go through its `__setattr__`, which forwards them to the wrapped model: the user's own model "
        "loses its parameters and submodules and becomes its own `_orig_mod` (torch 2.11 to 2.15, read). A replica "
        "thread then raises, and DataParallel re-raises it as 'Caught <Error> in replica 0 on device 0' "
        "(AttributeError on torch 2.13 CPU, a RecursionError in Dynamo's guard building on torch 2.11 H100). "
        "No race is needed: it happens in the calling thread before any replica thread starts."
    ),
    fix=dataparallel_fix_text(),
    example_format="repro-facts",
    bad=_facts("none", "reproduced", '"dataparallel-compiled-module"', "error",
               '{"name": "replica-0", "outcome": "error", "steps": 0, "error": "AttributeError: Caught '
               'AttributeError in replica 0 on device cpu."}', mode="dataparallel"),
    good=_GOOD,
))
