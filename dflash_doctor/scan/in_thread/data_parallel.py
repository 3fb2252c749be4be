"""DFD204: nn.DataParallel (or parallel_apply) runs a compiled module, or a module that calls compiled code, in a
thread per replica. Severity follows what was measured (docs/races.md, "nn.DataParallel over a compiled model"):
replicating a torch.compile'd module failed at its first step; a compiled call inside a replicated module, and
parallel_apply over modules compiled one per replica, ran. What holds comes from dflash_doctor/dataparallel.py."""
from __future__ import annotations

from typing import List

from dflash_doctor.dataparallel import FIXES
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.rules.scan import COMPILED_MODULE_IN_DATA_PARALLEL
from dflash_doctor.scan.summary import SpawnSource
from dflash_doctor.scan.thread_reach import REPLICA_THREADS, InThreadCheck, ThreadReach, in_thread

# what holds, best first, in the words of the DataParallel fixes' table (dflash_doctor/dataparallel.py)
WHAT_HOLDS = "what holds, best first: " + "; ".join(f"{fix.name} ({fix.api})" for fix in FIXES)


@in_thread
class CompiledModuleInDataParallel(InThreadCheck):
    rule = COMPILED_MODULE_IN_DATA_PARALLEL
    sources = REPLICA_THREADS

    def check(self, thread: ThreadReach) -> List[Finding]:
        hit = thread.compiled()
        if hit is None:
            return []
        spawn = thread.spawn
        compiled = hit.compiled
        where = f"{compiled.path}:{compiled.line}"
        chain = [thread.describe(ref) for ref in hit.chain] + [f"{compiled.name} ({where})"]
        evidence = {"wrapper": spawn.kind, "module": spawn.target, "chain": chain,
                    "compiled": {"name": compiled.name, "path": compiled.path, "line": compiled.line}}
        if spawn.source is SpawnSource.PARALLEL_APPLY:
            runs = (f"torch.compile'd modules (compiled at {where})" if not hit.chain
                    else f"modules whose forward calls torch.compile'd {compiled.name} (compiled at {where})")
            return [self.rule.finding(
                f"parallel_apply runs {spawn.target}, {runs}, in a thread per module: the thread races of DFD201 "
                f"apply (modules compiled one per replica ran in one measured run); {WHAT_HOLDS}",
                path=thread.path, line=spawn.line, column=spawn.column, evidence=evidence,
                severity=Severity.WARNING)]
        if not hit.chain:
            return [self.rule.finding(
                f"{spawn.kind} replicates {spawn.target}, a torch.compile'd module (compiled at {where}), and runs each "
                "replica's forward in a thread of its own: replicating the compiled wrapper empties your model "
                "(OptimizedModule.__setattr__ forwards the replica's _parameters and _modules to it), so the first "
                "step fails (torch 2.11 on an H100: InternalTorchDynamoError in replica 0); "
                f"{WHAT_HOLDS}",
                path=thread.path, line=spawn.line, column=spawn.column, evidence=evidence)]
        return [self.rule.finding(
            f"{spawn.kind} runs {spawn.target} in a thread per replica, and its forward calls torch.compile'd "
            f"{compiled.name} (compiled at {where}): the compiled call runs in the replica threads, where the "
            "FX-tracing RuntimeError was reported (AnswerDotAI/ModernBERT#147; one measured run passed); "
            f"{WHAT_HOLDS}",
            path=thread.path, line=spawn.line, column=spawn.column, evidence=evidence, severity=Severity.WARNING)]
