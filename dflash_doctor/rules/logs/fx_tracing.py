"""FX and Dynamo tracing errors between threads: torch.jit.trace over compiled code (DFD509, deterministic), the
FX-tracing race (DFD501) and the FX patcher race (DFD518)."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.hazards import Hazard
from dflash_doctor.mitigations import fix_text
from dflash_doctor.rules.logs.model import declare
from dflash_doctor.rules.logs.shared import fix_line, fix_step, gpu_details
from dflash_doctor.rules.registry import Rule


LOG_JIT_TRACE_COMPILED = declare(Rule(
    code="DFD509",
    name="log-jit-trace-compiled",
    severity=Severity.ERROR,
    summary="torch.jit.trace reached a torch.compile'd function (not a thread race)",
    rationale=(
        "torch.compile's wrapper refuses to run under torch.jit.trace: 'Detected that you are using FX to "
        "torch.jit.trace a dynamo-optimized function'. The message starts like the FX-tracing race (DFD501) but "
        "the cause is deterministic: the model being jit-traced calls compiled code. It fails on every run, in one "
        "thread as in many, and no lock or warm-up changes that."
    ),
    fix=(
        "Trace or export the uncompiled module (keep the nn.Module before torch.compile and trace that), or use "
        "torch.export / torch.compile alone instead of torch.jit.trace on compiled code."
    ),
    example_format="log",
    bad=(
        "Traceback (most recent call last):\n"
        '  File "/workspace/export.py", line 41, in <module>\n'
        "    traced = torch.jit.trace(model, example)\n"
        '  File "/usr/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", line 1129, in compile_wrapper\n'
        "    raise RuntimeError(\n"
        "RuntimeError: Detected that you are using FX to torch.jit.trace a dynamo-optimized function. This is not "
        "supported at the moment.\n"
    ),
    good=(
        "INFO export: traced the eager module, wrote drafter.pt\n"
    ),
), triggers=("FX to torch.jit.trace",), fatal=True,
    pattern=re.compile(r"using FX to torch\.jit\.trace a dynamo-optimized function"),
    describe=lambda d: "torch.jit.trace called a torch.compile'd function (deterministic, not a thread race)")

LOG_FX_TRACE_RACE = declare(Rule(
    code="DFD501",
    name="log-fx-trace-race",
    severity=Severity.ERROR,
    summary="a worker died of the FX-tracing race: 'Detected that you are using FX to symbolically trace a "
    "dynamo-optimized function'",
    rationale=(
        "torch.compile'd functions check a process-global FX-tracing flag on every call. While one thread "
        "compiles (make_fx sets the flag), another thread calling compiled code raises this RuntimeError, and "
        "with the thread's loop gone its GPU keeps its memory at 0 % utilization. It is a race, not a bug in the "
        "traced function: a warm compile cache hides it, deleting the cache brings it back."
    ),
    fix=(
        "Warm every shape in one thread before starting workers, or serialise compiled steps; `dflash-doctor "
        "guards` shows the installed torch's guard, `dflash-doctor repro --matrix` which mitigation works here."
    ),
    example_format="log",
    bad=(
        "Exception in thread drafter-0:\n"
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 640, in run\n'
        "    out = flex(q, k, v, block_mask=mask)\n"
        '  File "/usr/lib/python3.12/site-packages/torch/_dynamo/eval_frame.py", line 843, in compile_wrapper\n'
        "    raise RuntimeError(\n"
        "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function. "
        "This is not supported at the moment.\n"
    ),
    good=(
        "[drafter-0] step=120 loss=2.41 7.2 Ktok/s\n"
        "[drafter-1] step=120 loss=2.43 7.1 Ktok/s\n"
    ),
), triggers=("FX to symbolically",), fatal=True,
    next_steps=lambda found, threads, count: [
        "dflash-doctor guards: does the installed torch check a process-global FX-tracing flag on every compiled "
        "call?",
        f"dflash-doctor repro --threads {count} --matrix: which mitigation removes the race on this machine",
        "dflash-doctor scan <trainer dir>: the compiled calls reached from threads (DFD201)"]
    + fix_line((Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG, Hazard.DEADLOCK)),
    pattern=re.compile(r"using FX to symbolically trace a dynamo-optimized function"),
    details=gpu_details,
    describe=lambda d: "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized "
    "function (the FX-tracing race between threads)")

# the NameError as raised, or inside the error that wraps it: Dynamo's fake-tensor run of a compiled call that met
# the patches ("TorchRuntimeError: RuntimeError when making fake tensor call ... got NameError('module is not
# installed as a submodule')", seen on the H200, docs/gpu-results.md)
_PATCHER_RACE = re.compile(r"(?P<submodule>NameError(?:: |\(['\"])module is not installed as a submodule)"
                           r"|(?P<patcher>CURRENT_PATCHER (?:is None in finally block|was changed during a "
                           r"revert_all_patches))")
_TRACING = ("trace", "symbolic_trace")  # Tracer.trace and torch.fx.symbolic_trace's frames


def _patcher_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    return {"symptom": "a module call went through another thread's tracer" if match.group("submodule")
            else "two traces overlapped"}


def _patcher_explains(match: "re.Match[str]", thread: bool, functions: Tuple[str, ...]) -> bool:
    # The NameError is also what one thread gets for tracing a module kept outside its parent (in a plain list):
    # a main-thread traceback that traced for itself is that mistake, unless it is the patcher's own assertion.
    return bool(match.group("patcher")) or thread or not any(f in _TRACING for f in functions)


def _patcher_steps(found: Sequence[Finding], threads: Dict[str, dict], count: int) -> Optional[List[str]]:
    return ["dflash-doctor scan <trainer dir>: the torch.fx.symbolic_trace / Tracer().trace calls that run next to "
            "the worker threads", fix_step(LOG_FX_PATCHER_RACE)]


LOG_FX_PATCHER_RACE = declare(Rule(
    code="DFD518",
    name="log-fx-patcher-race",
    severity=Severity.ERROR,
    summary="a worker died of the FX patcher race: another thread's torch.fx trace patched nn.Module for every "
    "thread",
    rationale=(
        "torch.fx.symbolic_trace (Tracer.trace) installs a patcher that replaces torch.nn.Module.__call__ and "
        "__getattr__ on the classes, so for every thread of the process, and keeps it in the module global "
        "CURRENT_PATCHER (torch/fx/_symbolic_trace.py of torch 2.13.0: _new_patcher, path_of_module; docs/races.md, "
        "'The FX patcher race'). While one thread traces, "
        "another thread's plain eager module call goes through the tracer's wrapper and raises 'NameError: module "
        "is not installed as a submodule'; two traces that overlap restore each other's patches and one ends in "
        "'AssertionError: CURRENT_PATCHER is None in finally block' (or 'CURRENT_PATCHER was changed during a "
        "revert_all_patches'). A compiled call that meets the patches while Dynamo traces it fails inside Dynamo, "
        "'TorchRuntimeError: RuntimeError when making fake tensor call ... got NameError('module is not installed "
        "as a submodule')' (seen on the H200, docs/gpu-results.md): the same race. It hits eager code as well as "
        "compiled code, without the FX RuntimeError of "
        "DFD501, and the fixes for that race (the thread-local FX flag, non-lazy backward, warm-up, a first-call lock) "
        "do not touch it: they concern torch.compile, not torch.fx's patcher. A threaded trainer with three eager "
        "drafters and two threads looping symbolic_trace lost threads to it in each of 4 runs on torch 2.13 "
        "(fixtures/logs/README.md). "
        "A traceback of the main thread that traced for itself and got the NameError is a module kept outside "
        "its parent (a plain list), not this race, and is reported as DFD513."
    ),
    fix=(
        "Run torch.fx tracing (graph inspection, profiling) before the worker threads start or in another process, "
        "or serialise it with the workers' steps under one lock. " + fix_text(Hazard.PATCHER_RACE)
    ),
    example_format="log",
    bad=(
        "Exception in thread drafter-1:\n"
        "Traceback (most recent call last):\n"
        '  File "/srv/job/train.py", line 58, in run\n'
        "    out = self.model(batch)\n"
        '  File "/usr/lib/python3.11/site-packages/torch/fx/_symbolic_trace.py", line 888, in module_call_wrapper\n'
        "    return self.call_module(mod, forward, args, kwargs)\n"
        '  File "/usr/lib/python3.11/site-packages/torch/fx/_symbolic_trace.py", line 516, in path_of_module\n'
        '    raise NameError("module is not installed as a submodule")\n'
        "NameError: module is not installed as a submodule\n"
    ),
    good=(
        "[drafter-1] step=30 loss=0.41 6.8 Ktok/s\n"
        "[profiler] traced 412 graphs\n"
    ),
), triggers=("NameError", "CURRENT_PATCHER"), fatal=True, pattern=_PATCHER_RACE,
    details=_patcher_details, explains_block=_patcher_explains,
    describe=lambda d: f"the FX patcher race: {d['symptom']} (torch.fx patches nn.Module for every thread "
    "while one traces)",
    next_steps=_patcher_steps)
