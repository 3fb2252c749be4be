"""DFD201: a thread runs a torch.compile'd callable, reached through its target's calls or handed to the target as
an argument. Its severity follows the compile's backend: one that does not trace with FX is not the FX-flag source."""
from __future__ import annotations

from typing import List, Optional

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.rules.scan import COMPILED_CALL_IN_THREAD
from dflash_doctor.scan.thread_reach import CompiledHit, InThreadCheck, ThreadReach, in_thread

# Backends that hand Dynamo's graph back to be run as it is, with no make_fx, no AOTAutograd and no lazily compiled
# backward (read in torch 2.13's torch/_dynamo/backends/debugging.py: `eager` returns gm.forward, `eager_noexcept`
# calls gm, `eager_debug` runs it in an fx.Interpreter). Every other backend is treated as tracing with FX:
# inductor (compile_fx), aot_eager and its variants, cudagraphs (aot_autograd), pre_dispatch_eager (make_fx) and
# any backend this table does not know. docs/races.md, "Backends that do not trace with FX".
FX_FREE_BACKENDS = frozenset({"eager", "eager_noexcept", "eager_debug"})


def _fx_free_note(backend: str) -> str:
    return (f"; backend={backend!r} does not trace with FX (no make_fx, no AOTAutograd, no lazily compiled "
            "backward), so this compile neither sets the FX flag nor takes part in the compile-lock deadlock, but "
            "its calls still check the process-wide FX flag: another thread's FX trace (a compile with an FX "
            "backend, symbolic_trace) makes them raise, and a flex_attention inside traces its backward with "
            "make_fx on every call that needs a gradient")


@in_thread
class CompiledCallInThread(InThreadCheck):
    rule = COMPILED_CALL_IN_THREAD

    def check(self, thread: ThreadReach) -> List[Finding]:
        hit = thread.compiled()
        if hit is None:
            return []
        spawn = thread.spawn
        compiled = hit.compiled
        where = f"{compiled.path}:{compiled.line}"
        backend = thread.backend(compiled)
        fx_free = backend in FX_FREE_BACKENDS
        calls = (f"calls its argument {hit.called}, torch.compile'd {compiled.name}" if hit.through
                 else f"calls torch.compile'd {compiled.name}")
        evidence = {
            "spawn": spawn.kind,
            "target": spawn.target,
            "chain": _chain(thread, hit) + [f"{compiled.name} ({where})"],
            "compiled": {"name": compiled.name, "path": compiled.path, "line": compiled.line},
        }
        if hit.through is not None:
            evidence["argument"] = hit.called
        if backend is not None and backend != "inductor":
            evidence["backend"] = backend
        return [COMPILED_CALL_IN_THREAD.finding(
            f"{spawn.kind} runs {spawn.target}, which {calls} (compiled at {where}) from a worker thread"
            + (_fx_free_note(backend or "") if fx_free else ""),
            path=thread.path, line=spawn.line, column=spawn.column, evidence=evidence,
            severity=Severity.WARNING if fx_free else None,
        )]


def _chain(thread: ThreadReach, hit: CompiledHit) -> List[str]:
    chain = [thread.describe(ref) for ref in hit.chain]
    if hit.through is not None:
        chain.append(f"argument {hit.called}")
        chain.extend(thread.describe(ref) for ref in hit.inside)
    return chain
