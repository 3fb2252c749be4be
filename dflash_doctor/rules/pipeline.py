"""Pipeline rules (DFD8xx): dead, killed and hung workers of `dflash-doctor pipeline`, and the races behind them.

Examples are pipeline facts documents (the JSON `facts` of a run, trimmed to what the rules read); the classifier
in dflash_doctor.reference.findings turns them into findings, and the tests run every example through it. A run
with a dead or hung worker always yields at least one of these findings.
"""
from dflash_doctor import mitigations
from dflash_doctor.findings import Severity
from dflash_doctor.hazards import Hazard
from dflash_doctor.rules.registry import Rule, register

_FX_ERROR = ("RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function. "
             "This is not supported at the moment.")


def _concurrent_fix() -> str:
    """The registry's first complete fix for the thread races, as a pipeline option and as trainer code."""
    best = mitigations.recommend({Hazard.DEADLOCK, Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG})[0]
    return (f"Run with --mitigation {best.label} (in your trainer: {'; '.join(best.api)}). "
            "`dflash-doctor explain mitigations` lists the others and what each leaves open.")


def _worker(name: str, outcome: str, steps: int = 0, error: str = "null", role: str = "drafter",
            phase: str = "") -> str:
    phase = phase or ("serving batches" if role == "target" else "training")
    return (f'{{"name": "{name}", "role": "{role}", "device": "cuda:0", "outcome": "{outcome}", "steps": {steps}, '
            f'"error": {error}, "phase": "{phase}"}}')


def _facts(workers: str, failed: str = "null", hang: str = "null", blame: str = "[]",
           mitigation: str = "none", steps: int = 0) -> str:
    return (
        "{\n"
        f'  "preset": "seeds", "workers_mode": "threads", "device_type": "cuda", "steps": {steps},\n'
        f'  "mitigation": "{mitigation}", "failed_worker": {failed}, "interrupted": null,\n'
        f'  "workers": [{workers}],\n'
        f'  "hang": {hang}, "blame": {blame}\n'
        "}\n"
    )


_GOOD = _facts(", ".join([_worker("target-0", "ok", 40, role="target"), _worker("drafter-0", "ok", 20),
                          _worker("drafter-1", "ok", 20)]), mitigation="threadlocal-flag,non-lazy-backward",
               steps=20)

WORKER_ERROR = register(Rule(
    code="DFD801",
    name="pipeline-worker-error",
    severity=Severity.ERROR,
    summary="a pipeline worker died with an error; the other workers were stopped",
    rationale=(
        "A target or drafter worker raised (or its process exited with an error) and the run stopped, the other "
        "workers shut down cleanly. Not one of the known torch.compile races (those have their own codes): read "
        "the worker's error and traceback in the evidence."
    ),
    fix="Fix the error the worker raised; its traceback is in the JSON report (`--format json`).",
    example_format="pipeline-facts",
    bad=_facts(", ".join([_worker("target-0", "stopped", 3, role="target"),
                          _worker("drafter-0", "error", 2, '"CUDA out of memory. Tried to allocate 2.00 GiB"'),
                          _worker("drafter-1", "stopped", 2)]), failed='"drafter-0"'),
    good=_GOOD,
))

WORKER_KILLED = register(Rule(
    code="DFD802",
    name="pipeline-worker-killed",
    severity=Severity.ERROR,
    summary="a pipeline worker was killed (a signal, the OOM killer, or --fail-worker); the others were stopped",
    rationale=(
        "A worker ended without a Python error: a worker process was killed by a signal (the kernel's OOM killer "
        "sends SIGKILL), or --fail-worker ended it to test the shutdown. The run stopped the other workers and "
        "reports the one that went."
    ),
    fix="Look for the kill in the system log (`dmesg` for the OOM killer); --fail-worker kills are deliberate.",
    example_format="pipeline-facts",
    bad=_facts(", ".join([_worker("target-0", "stopped", 4, role="target"),
                          _worker("drafter-0", "stopped", 2),
                          _worker("drafter-1", "killed", 2, '"killed by signal SIGKILL"')]), failed='"drafter-1"'),
    good=_GOOD,
))

FX_FLAG_ERROR = register(Rule(
    code="DFD803",
    name="pipeline-fx-flag-error",
    severity=Severity.ERROR,
    summary="a drafter raised the FX-tracing RuntimeError: another thread's trace set the global FX flag",
    rationale=(
        "Every torch.compile'd call checks a process-global FX-tracing flag, and make_fx inside any thread's "
        "compile sets it. A drafter calling compiled flex_attention while another thread compiles raises "
        "'Detected that you are using FX to symbolically trace a dynamo-optimized function' (the seeds' crash). "
        "The flight recorder names the thread that held the flag, or the one whose trace left it stuck."
    ),
    fix=_concurrent_fix(),
    example_format="pipeline-facts",
    bad=_facts(", ".join([_worker("target-0", "stopped", 6, role="target"),
                          _worker("drafter-0", "stopped", 0),
                          _worker("drafter-1", "error", 0, f'"{_FX_ERROR}"', phase="first step (compiling)")]),
               failed='"drafter-1"', blame='[{"victim": "drafter-1", "holder": "drafter-2", "at_s": 31.2, '
                                           '"kind": "fx-flag-leak"}]', mitigation="non-lazy-backward"),
    good=_GOOD,
))

COMPILE_DEADLOCK = register(Rule(
    code="DFD804",
    name="pipeline-compile-deadlock",
    severity=Severity.ERROR,
    summary="drafters deadlocked on Dynamo's compile_lock and the autograd device thread",
    rationale=(
        "One drafter thread holds compile_lock while AOTAutograd's joint trace waits in torch.autograd.grad for "
        "the autograd engine's device thread; that thread runs another drafter's backward and waits for "
        "compile_lock in the lazy backward compile. Nothing progresses and nothing raises: the run's stall "
        "watchdog dumps every thread's stack and names the cycle. On one GPU, threads sharing the device's "
        "autograd thread is what closes the cycle."
    ),
    fix=_concurrent_fix(),
    example_format="pipeline-facts",
    bad=_facts(", ".join([_worker("target-0", "stopped", 6, role="target"),
                          _worker("drafter-0", "hung", 0, phase="first step (compiling)"),
                          _worker("drafter-1", "hung", 0, phase="first step (compiling)")]), failed='"drafter-1"',
               hang='{"kind": "deadlock", "cycle": "compile-lock-autograd", "threads": ["drafter-1", '
                    '"thread-140233"], "chain": ["drafter-1 holds compile_lock and waits in torch.autograd.grad", '
                    '"thread-140233 waits for compile_lock in compile_fx_backward"], "stalled_s": 30.2}'),
    good=_GOOD,
))

LOCK_DEADLOCK = register(Rule(
    code="DFD805",
    name="pipeline-lock-deadlock",
    severity=Severity.ERROR,
    summary="pipeline workers hung waiting on each other's locks",
    rationale=(
        "No drafter step, compile event or CPU use for --stall-timeout seconds, and the stacks show threads "
        "blocked acquiring locks others hold, but not the compile_lock / autograd cycle. The chain in the "
        "evidence says who holds what and waits for what."
    ),
    fix="Take the locks in one global order; the stacks in the JSON report show where each thread waits.",
    example_format="pipeline-facts",
    bad=_facts(", ".join([_worker("target-0", "stopped", 6, role="target"),
                          _worker("drafter-0", "hung", 3)]), failed='"drafter-0"',
               hang='{"kind": "deadlock", "cycle": "lock-cycle", "threads": ["drafter-0", "drafter-0-helper"], '
                    '"chain": ["drafter-0 holds mine and waits for theirs", '
                    '"drafter-0-helper holds theirs and waits for mine"], "stalled_s": 30.0}'),
    good=_GOOD,
))

WORKERS_HUNG = register(Rule(
    code="DFD806",
    name="pipeline-workers-hung",
    severity=Severity.ERROR,
    summary="pipeline workers made no progress and did not stop, with no lock cycle in their stacks",
    rationale=(
        "The stall watchdog saw no drafter step, compile event or CPU use for --stall-timeout seconds (set-up "
        "excluded), and the stacks show no lock cycle: a worker may wait on a collective whose peer is gone, on "
        "I/O, or inside a C++ call. The evidence lists where each worker's stack ends."
    ),
    fix="Read the hung workers' stacks in the JSON report; raise --stall-timeout if the work was just slow.",
    example_format="pipeline-facts",
    bad=_facts(", ".join([_worker("target-0", "stopped", 6, role="target"),
                          _worker("drafter-0", "hung", 3)]), failed='"drafter-0"',
               hang='{"kind": "other-error", "cycle": "no-cycle", "threads": ["drafter-0"], '
                    '"chain": ["no progress for 30.0 s and no lock cycle in the stacks"], "stalled_s": 30.0}'),
    good=_GOOD,
))

_NAME_ERROR = "NameError: module is not installed as a submodule"


def _patcher_fix() -> str:
    """The registry's first complete fix for a pipeline with a tracing thread (the patcher race named)."""
    best = mitigations.recommend({Hazard.DEADLOCK, Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG, Hazard.PATCHER_RACE})[0]
    return (f"Run with --mitigation {best.label} (in your trainer: {'; '.join(best.api)}), or hold "
            "dflash_doctor.runtime.fx_trace_lock() around the tracing thread's traces under --mitigation "
            "global-lock. `dflash-doctor explain isolate-fx-patches` says what it leaves open.")


FX_PATCHER_RACE = register(Rule(
    code="DFD807",
    name="pipeline-fx-patcher-race",
    severity=Severity.ERROR,
    summary="a worker met another thread's torch.fx patches (NameError / CURRENT_PATCHER): the FX patcher race",
    rationale=(
        "A thread ran its own torch.fx trace (the pipeline's --tracing-thread, a profiler's symbolic_trace) while "
        "the workers ran modules. Tracer.trace replaces nn.Module.__call__ and __getattr__ on the classes for the "
        "whole trace, for every thread, and keeps its patcher in the module global CURRENT_PATCHER: a worker's "
        "eager module call raises 'NameError: module is not installed as a submodule', and a trace overlapping "
        "another (a compile's make_fx) ends in 'AssertionError: CURRENT_PATCHER is None in finally block'. The "
        "thread-local FX flag does not touch it."
    ),
    fix=_patcher_fix(),
    example_format="pipeline-facts",
    bad=_facts(", ".join([_worker("target-0", "error", 0, f'"{_NAME_ERROR}"', role="target"),
                          _worker("drafter-0", "stopped", 0), _worker("fx-tracer", "ok", 12, role="tracer")]),
               failed='"target-0"', mitigation="threadlocal-flag,non-lazy-backward"),
    good=_GOOD,
))
