"""DFD203: an FX trace while other threads run: in a thread's target, or in the code that started threads before
it joins them."""
from __future__ import annotations

import os
from typing import List, Optional, Sequence, Set

from dflash_doctor.findings import Finding
from dflash_doctor.rules.scan import FX_TRACE_IN_THREAD
from dflash_doctor.scan.callgraph import ModuleGraph
from dflash_doctor.scan.programs import Reach
from dflash_doctor.scan.thread_reach import WORKER_THREADS, InThreadCheck, ThreadReach, in_thread


@in_thread
class FxTraceInThread(InThreadCheck):
    rule = FX_TRACE_IN_THREAD

    def check(self, thread: ThreadReach) -> List[Finding]:
        hit = thread.first_call(thread.linker.fx_trace)
        if hit is None:
            return []
        chain, traced = hit
        spawn = thread.spawn
        return [FX_TRACE_IN_THREAD.finding(
            f"{spawn.kind} runs {spawn.target}, which FX-traces with {traced} in "
            f"{thread.describe(chain[-1]) if chain else spawn.target}: while it traces, nn.Module calls in every "
            "other thread go through its patcher",
            path=thread.path, line=spawn.line, column=spawn.column,
            evidence={"spawn": spawn.kind, "target": spawn.target, "trace": traced,
                      "chain": [thread.describe(ref) for ref in chain]},
        )]

    def after_spawns(self, graph: ModuleGraph, threads: Sequence[ThreadReach], used_noqa: Optional[Set]
                     ) -> List[Finding]:
        """An FX trace that the code which started threads runs after starting them, with no `.join()` between:
        the workers run while it traces."""
        findings = []
        started_here = [t.spawn for t in threads if t.spawn.thread_class is None and t.spawn.source in WORKER_THREADS]
        for site in graph.traces:
            started = [s for s in started_here if s.scope == site.scope and s.line < site.line]
            if not started:
                continue
            traced = threads[0].linker.fx_trace(site.callee)
            first = started[0]
            if traced is None or graph.joins_between(site.scope, first.line, site.line):
                continue
            if self.suppressed_at(site.line, site.noqa, used_noqa):
                continue
            findings.append(FX_TRACE_IN_THREAD.finding(
                f"{traced} runs in the code that started threads at line {first.line}, before any join: while it "
                "traces, their nn.Module calls go through its patcher",
                path=graph.path, line=site.line, column=site.column,
                evidence={"spawn": first.kind, "target": first.target, "trace": traced, "spawned_at": first.line,
                          "scope": site.scope},
            ))
        return findings

    def reach_of(self, graph: ModuleGraph, finding: Finding) -> Optional[Reach]:
        # the code that traces is the function holding the trace (a lock it takes there counts)
        return frozenset({(os.path.abspath(graph.path), str(finding.evidence.get("scope", "")))})
