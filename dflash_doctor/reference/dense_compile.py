"""The drafter's dense stretches compiled whole, for the throughput presets.

Eager, one drafter layer outside its attention is about two dozen memory-bound kernels (RMSNorms, RoPE's
cat/neg/mul/add, the K/V concatenation, SiLU, residual adds, their backward), and the loss chunk a norm, a
float cast and a softmax over the vocabulary: the H200 profile of the small preset spent 85 % of each step busy
but only 40 % of it in matmuls (docs/gpu-results.md). Compiled, each stretch becomes a few fused kernels.

flex_attention stays a compiled call of its own between the stretches, exactly as the seeds' drafter called it,
so the compile the races are about keeps its boundaries; the presets that reproduce the incident (seeds, replay,
tiny) leave this off (`PipelineConfig.compile_dense`). Like flex_attention's, each wrapper is created on first use,
after the mitigations are installed (a wrapper binds Dynamo's FX-tracing predicate when it is created).
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, TypeVar

F = TypeVar("F", bound=Callable)

_wrappers: Dict[Callable, Callable] = {}
_lock = threading.Lock()


def compiled(fn: F) -> F:
    """The process-wide `torch.compile(fn, dynamic=False)` of `fn`, created on first use. Static shapes: every
    drafter step of a run has the same shapes, and a dynamic graph would give up fusions for nothing."""
    with _lock:
        wrapper = _wrappers.get(fn)
        if wrapper is None:
            import torch

            wrapper = _wrappers[fn] = torch.compile(fn, dynamic=False)
        return wrapper  # type: ignore[return-value]
