"""A process or thread that stopped moving: an all-thread stack dump of a stuck process (DFD515: py-spy,
faulthandler, gdb, pystack; the compile-lock / autograd deadlock named when the dump shows it) and a thread that
stopped making step progress while the others went on (DFD507)."""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.hazards import Hazard
from dflash_doctor.outcomes import HangCycle
from dflash_doctor.rules.logs.model import UNNAMED, HeldLine, RuleLine, RuleScanner, declare
from dflash_doctor.rules.logs.shared import fix_line
from dflash_doctor.rules.registry import Rule


def _workers(findings: Sequence[Finding]) -> List[str]:
    return sorted({str(f.evidence.get("thread")) for f in findings if f.evidence.get("thread")})


def _stack_dump_line(scanner: RuleScanner, line: RuleLine) -> None:
    if line.match.group("pyspy_pid"):
        # 'Process 12: ...' is py-spy's header only under its command; its threads may not have been pasted
        if "py-spy" in (scanner.line_before() or "") and scanner.memory.pyspy_header is None:
            scanner.memory.pyspy_header = HeldLine(line.stream or UNNAMED, line.lineno)
        return
    scanner.memory.pyspy_header = None
    scanner.start_dump(line.lineno, line.stream, line.body[line.match.start():])  # glued to prose: '... stack:Thread 5'


def _dump_steps(found: Sequence[Finding], threads: Dict[str, dict], count: int) -> Optional[List[str]]:
    if any(f.evidence.get("cycle") == HangCycle.COMPILE_LOCK_AUTOGRAD for f in found):
        return [f"dflash-doctor repro --threads {count} --shapes per-thread: reproduce the deadlock here"] + fix_line(
            (Hazard.DEADLOCK, Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG))
    return ["py-spy dump --pid PID a second time: threads that have not moved are stuck where the dump shows"]


LOG_STACK_DUMP_HANG = declare(Rule(
    code="DFD515",
    name="log-stack-dump-hang",
    severity=Severity.WARNING,
    summary="an all-thread stack dump of a stuck process (py-spy dump, faulthandler timeout)",
    rationale=(
        "Someone dumped the stacks of a process that stopped making progress (`py-spy dump --pid`, "
        "faulthandler.dump_traceback_later's 'Timeout (0:10:00)!', pystack, or gdb's 'thread apply all bt' and "
        "'(gdb) bt' taken by hand). The dump shows where each thread waits. When "
        "one thread compiles under Dynamo's compile_lock while waiting for the autograd engine, and another waits "
        "for compile_lock in the backward compiler (compile_fx_backward), it is the compile-lock / autograd "
        "device-thread deadlock: the finding is then an error and names it. A dump printed by a crash ('Fatal "
        "Python error') is the crash's stack, reported as DFD514 instead."
    ),
    fix=(
        "For the compile-lock cycle: compile the backward with the forward (dflash_doctor.runtime."
        "enable_non_lazy_backward()) or warm every shape in one thread first; `dflash-doctor repro --threads N` "
        "shows which mitigation holds here. Otherwise read which lock or queue the waiting threads block on."
    ),
    example_format="log",
    bad=(
        "Process 4242: python train.py\n"
        "Python v3.11.7 (/usr/bin/python3.11)\n"
        "\n"
        'Thread 0x7F31C36BF740 (idle): "drafter-0"\n'
        "    _engine_run_backward (torch/autograd/graph.py:825)\n"
        "    grad (torch/autograd/__init__.py:496)\n"
        "    _compile (torch/_dynamo/convert_frame.py:1020)\n"
        "    run (train.py:640)\n"
        'Thread 0x7F31B0FFD640 (idle): "Thread-3"\n'
        "    compile_fx_backward (torch/_inductor/compile_fx.py:1340)\n"
        "    backward (torch/_functorch/_aot_autograd/runtime_wrappers.py:2000)\n"
    ),
    good=(
        "[drafter-0] step=12 loss=2.61 7.1 Ktok/s\n"
    ),
), triggers=("Thread ", "thread 0x", "Process ", "Traceback for thread"),
    # (a header may follow a colon of the paster's prose on the same line: '... call stack:  Thread 59633 (active)')
    pattern=re.compile(r"(?:^|(?<=[:\uff1a]))\s*(?:Current thread|Thread) (?:0x[0-9a-fA-F]+|\d+) \((?:most recent call first|"
                       r"(?:idle|active)(?:\+gil)?)\)(?:: \"(?P<name>[^\"]*)\")?"
                       r"|^\s*Thread \((?:idle|active)(?:\+gil)?\): \"(?P<unnamed>[^\"]*)\""
                       # py-spy's own header ('Process 4242: python train.py'), read only right after 'py-spy dump'
                       r"|^\s*Process (?P<pyspy_pid>\d+): \S"
                       # gdb's 'thread apply all bt' and pystack's dumps (logs/stackdump.py)
                       r"|^(?:Thread \d+|\[Switching to thread \d+) \(Thread 0x[0-9a-fA-F]+ \(LWP \d+\)"
                       r"|^Traceback for thread \d+ \("),
    on_match=_stack_dump_line, next_steps=_dump_steps)


LOG_THREAD_STALLED = declare(Rule(
    code="DFD507",
    name="log-thread-stalled",
    severity=Severity.WARNING,
    summary="a thread stopped making step progress while the others kept going",
    rationale=(
        "A worker that logs step=N and then nothing while its peers advance is hung (a deadlock on Dynamo's "
        "compile lock against the autograd device thread is the known one) or died without a traceback in this "
        "log. It fires when another thread advanced by --stall-steps steps (at least three of the stalled "
        "thread's own step increments) since the stalled thread's last progress line. Workers whose death "
        "is reported are not repeated here."
    ),
    fix="Dump all thread stacks of the live process (py-spy dump --pid PID) to see where it waits.",
    example_format="log",
    bad=(
        "[drafter-0] step=1 7.1 Ktok/s\n[drafter-1] step=1 7.2 Ktok/s\n"
        "[drafter-0] step=2 7.1 Ktok/s\n[drafter-1] step=2 7.2 Ktok/s\n"
        + "".join(f"[drafter-1] step={n} 7.2 Ktok/s\n" for n in range(3, 60))
    ),
    good=(
        "".join(f"[drafter-0] step={n} 7.1 Ktok/s\n[drafter-1] step={n} 7.2 Ktok/s\n" for n in range(1, 60))
    ),
), next_steps=lambda found, threads, count: [
    f"py-spy dump --pid PID: where {', '.join(_workers(found))} wait (a compile-lock deadlock shows "
    "compile_fx_backward on one thread and autograd on another)"])
