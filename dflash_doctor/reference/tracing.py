"""`pipeline --tracing-thread`: a thread that loops `torch.fx.symbolic_trace` next to the workers, as trainers
that profile or inspect their graphs do, so the FX patcher race (docs/races.md) can be seen and fixed here.

It traces a model-deep stack of target-sized SwiGLU blocks of its own (TRACED_BLOCKS, on the meta device: a trace
runs no kernels and the stack holds no memory), each trace inside what the mitigations ask of a tracing thread
(`mitigations.around_foreign_trace`: global-lock's shared lock), until the run stops. Its death is a worker's
death: the run stops and a finding names it.

Why model-deep: the race needs a worker to run Python while the patches are installed, and a thread holding the
GIL gives it up only every `sys.getswitchinterval()` (5 ms). A trace of two blocks lasts about 1 ms on a fast host
CPU, so on the H200 2,361 such traces next to three drafters never overlapped one of their module calls; a
profiler or graph inspector traces a whole model, tens of milliseconds, and the workers run inside it.
"""
from __future__ import annotations

import threading
from typing import Callable, ContextManager

from dflash_doctor.reference.results import RunPlan, WorkerOutcome

NAME = "fx-tracer"
ROLE = "tracer"
# A profiler's pace, not a busy loop: it lets a worker waiting on a lock the tracer shares (global-lock) in, and
# leaves the workers the GIL for their compiles.
BETWEEN_TRACES_S = 0.01
TRACED_BLOCKS = 32  # the depth of a 7B-class model: what a profiler inspecting the trained model traces


def traced_module(plan: RunPlan):
    import torch

    from dflash_doctor.reference.layers import SwiGLU

    spec = plan.cfg.target
    with torch.device("meta"):
        return torch.nn.Sequential(*(SwiGLU(spec.hidden_size, spec.intermediate_size) for _ in range(TRACED_BLOCKS)))


class TracingLoop:
    def __init__(self, plan: RunPlan, outcome: WorkerOutcome, stop: threading.Event,
                 around: Callable[[], ContextManager[object]]) -> None:
        self.plan, self.outcome, self.stop, self.around = plan, outcome, stop, around

    def run(self) -> None:
        import statistics
        import time

        import torch.fx

        module = traced_module(self.plan)
        self.outcome.phase = f"tracing a {TRACED_BLOCKS}-block module with torch.fx.symbolic_trace"
        seconds = []
        while not self.stop.is_set():
            with self.around():
                began = time.perf_counter()
                torch.fx.symbolic_trace(module)
                seconds.append(time.perf_counter() - began)
            self.outcome.steps += 1
            self.stop.wait(BETWEEN_TRACES_S)
        if seconds:  # the report says how long the window was in which the workers met the patches
            self.outcome.phase += f" (median {statistics.median(seconds) * 1000:.1f} ms a trace)"
