"""CUDA graphs for the work whose shapes never change: a greedy decode step and the target's forward.

Eager, each of those is hundreds of small kernel launches from Python; a CUDA graph replays them with one. Capture
runs in set-up, before any worker thread exists: a capture on one stream while another thread launches on the
legacy default stream fails that other thread's launch. Anything that goes wrong while capturing makes the caller
fall back to eager, with the reason kept for the report: a graph is a speed-up, never a condition to run.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional, Tuple

import torch

from dflash_doctor.reference.target import TargetOutput

WARMUP_CALLS = 2  # eager calls on a side stream before capture, as torch's CUDA-graph notes ask (lazy inits)


class CapturedCall:
    """`fn` (no arguments; it reads and writes tensors it closes over) recorded once and replayed."""

    def __init__(self, graph) -> None:
        self._graph = graph

    def __call__(self) -> None:
        self._graph.replay()


def capture(fn: Callable[[], object], device: torch.device, warmup_calls: int = WARMUP_CALLS) -> CapturedCall:
    """Run `fn` `warmup_calls` times on a side stream, then record it. Raises whatever capture raises."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup_calls):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        fn()
    return CapturedCall(graph)


def try_capture(fn: Callable[[], object], device: torch.device,
                warmup_calls: int = WARMUP_CALLS) -> Tuple[Optional[CapturedCall], Optional[str]]:
    """(captured call, None), or (None, why not): CPU, or a capture that failed."""
    if device.type != "cuda":
        return None, "not a CUDA device"
    try:
        return capture(fn, device, warmup_calls), None
    except Exception as exc:  # noqa: BLE001 - any capture failure means "decode eagerly", and the reason is reported
        torch.cuda.synchronize(device)
        return None, f"{exc.__class__.__name__}: {exc}"[:300]


class GraphedForward:
    """The target's forward for one static (batch, seq_len), replayed from a CUDA graph; one per device, shared by
    that device's target workers (the lock orders them: the graph's input and output buffers are shared)."""

    def __init__(self, target, batch: int, seq_len: int, device: torch.device) -> None:
        self.target = target
        self.lock = threading.Lock()
        self.tokens = torch.zeros((batch, seq_len), dtype=torch.long, device=device)
        self.out: Optional[TargetOutput] = None
        self.call, self.fallback_reason = try_capture(self._forward, device)
        if self.call is not None:
            self.fallback_reason = self._check_against_eager(device)
            if self.fallback_reason is not None:
                self.call = None

    def _forward(self) -> None:
        self.out = self.target(self.tokens)

    def _check_against_eager(self, device: torch.device) -> Optional[str]:
        """One replay against the eager forward on a random batch: (almost) the same labels, close features. Not
        bit-equal: the graph may use other matmul algorithms, which can flip a near-tie argmax."""
        generator = torch.Generator(device=device).manual_seed(0)
        tokens = torch.randint(1, self.target.spec.vocab_size, tuple(self.tokens.shape), device=device,
                               generator=generator)
        graphed = self(tokens)
        self.call, call = None, self.call
        eager = self(tokens)
        self.call = call
        disagree = (graphed.greedy != eager.greedy).float().mean().item()
        if disagree > 1e-3 or not torch.allclose(graphed.features.float(), eager.features.float(), atol=5e-2,
                                                 rtol=5e-2):
            return f"the graphed forward disagreed with the eager one ({disagree:.2%} of the labels)"
        return None

    @property
    def mode(self) -> str:
        return "cuda-graph" if self.call is not None else "eager"

    def __call__(self, tokens: torch.Tensor) -> TargetOutput:
        if self.call is None:
            return self.target(tokens)
        with self.lock:
            self.tokens.copy_(tokens)
            self.call()
            assert self.out is not None
            # The graph overwrites its outputs on the next replay: the consumer gets its own copy.
            return TargetOutput(self.out.features.clone(), self.out.greedy.clone())
