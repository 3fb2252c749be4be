"""`pipeline --tracing-thread`: a thread that loops `torch.fx.symbolic_trace` next to the workers, as trainers
that profile or inspect their graphs do, so the FX patcher race (docs/races.md) can be seen and fixed here.

It traces a stack of drafter-sized SwiGLU blocks of its own (on the CPU: a trace runs no kernels), each trace
inside what the mitigations ask of a tracing thread (`mitigations.around_foreign_trace`: global-lock's shared
lock), until the run stops. Its death is a worker's death: the run stops and a finding names it.
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


def traced_module(plan: RunPlan):
    import torch

    from dflash_doctor.reference.layers import SwiGLU

    spec = plan.cfg.target
    blocks = [SwiGLU(spec.hidden_size, spec.intermediate_size) for _ in range(max(1, plan.cfg.drafter_layers))]
    return torch.nn.Sequential(*blocks)


class TracingLoop:
    def __init__(self, plan: RunPlan, outcome: WorkerOutcome, stop: threading.Event,
                 around: Callable[[], ContextManager[object]]) -> None:
        self.plan, self.outcome, self.stop, self.around = plan, outcome, stop, around

    def run(self) -> None:
        import torch.fx

        module = traced_module(self.plan)
        self.outcome.phase = "tracing with torch.fx.symbolic_trace"
        while not self.stop.is_set():
            with self.around():
                torch.fx.symbolic_trace(module)
            self.outcome.steps += 1
            self.stop.wait(BETWEEN_TRACES_S)
