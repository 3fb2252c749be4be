"""The typed model of `pipeline` facts (`facts` in the JSON envelope): what results.py's `PipelineResult.facts()`
fills and reference/findings.py, render/pipeline_view.py and the command read. TypedDicts, so the facts stay
plain dicts and the JSON is unchanged; tests/test_facts_shapes.py holds the JSON keys to these models.

Every key is there in every run (None where a run has nothing to say), so each model is total. The stall's
diagnosis, the stacks and the flight recorder's blame are the runtime's own shapes (runtime/deadlock.py,
runtime/stacks.py, runtime/recorder.py): repro and run reports carry them too.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict

from dflash_doctor.runtime.deadlock import HangFacts
from dflash_doctor.runtime.recorder import BlameFacts
from dflash_doctor.runtime.stacks import ThreadStackFacts

__all__ = ["BlameFacts", "HangFacts", "PipelineFacts", "PipelineWorkerFacts", "StepTimeFacts", "ThreadStackFacts",
           "WrittenCorpusFacts"]


class PipelineWorkerFacts(TypedDict):
    """One worker (results.py WorkerOutcome.to_dict); a set-up that failed before any worker started is one too,
    role "set-up", --tracing-thread's tracer is role "tracer", and a processes run's parent is role "parent" when
    it received a message it could not read from a sender it cannot name (workers_processes.py)."""

    name: str
    role: str  # target | drafter | tracer | set-up | parent
    device: str
    outcome: str  # results.Outcome: ok | error | killed | stopped | hung
    error: Optional[str]
    steps: int
    traceback: Optional[str]
    phase: str  # what it was doing last (a set-up phase, then training / serving batches)
    wait_s: float  # blocked on its peers: a drafter waiting for batches, a target for queue room
    # Read inside the worker thread under the mitigations' per-thread switches; None where it was not read
    # (processes, set-up).
    autograd_multithreading: Optional[bool]
    switches: Dict[str, str]  # each applied mitigation's declared switch, as the worker thread read it
    save_error: Optional[str]  # --save: why the trained drafter could not be written


class StepTimeFacts(TypedDict):
    """Nearest-rank percentiles of the interval between consecutive steps, in seconds."""

    p50: float
    p90: float
    p99: float
    max: float


class WrittenCorpusFacts(TypedDict):
    """How the shared corpus was written (corpus.py CorpusFacts.to_dict)."""

    sequences: int
    prompt_len: int
    seq_len: int
    seconds: float
    decode: str  # cuda-graph | eager
    eager_reason: Optional[str]  # why the decode step was not replayed from a CUDA graph


class PipelineFacts(TypedDict):
    preset: str
    workers_mode: str  # threads | processes
    device_type: str  # cpu | cuda
    steps: int  # steps every drafter replica completed in this run
    start_step: int  # where a resumed run's numbering continues from
    losses: List[float]  # mean over replicas, per completed step
    tokens: int  # sequence tokens trained on (all replicas), first step excluded
    tokens_per_s: Optional[float]  # None: fewer than two steps, so no steady-state window
    startup_s: Optional[float]  # process start to the run's start
    warmup_s: Optional[float]  # run start to the first completed step (set-up and its compile)
    setup_s: Optional[float]  # None: the set-up never finished
    setup: Dict[str, float]  # seconds per set-up phase (threads mode; processes set up in each rank)
    step_time_s: Optional[StepTimeFacts]
    wall_s: float
    workers: List[PipelineWorkerFacts]
    failed_worker: Optional[str]  # the first worker that died or hung: the run's root cause
    mitigation: str  # the mitigations' label, "none" without any
    mitigation_facts: Dict[str, Dict[str, Any]]  # mitigation -> what its set-up reported (each its own shape)
    hang: Optional[HangFacts]  # the classified stall, when the run hung
    stacks: List[ThreadStackFacts]  # every thread's stack when the stall was declared
    blame: List[BlameFacts]  # the flight recorder's blame for FX errors
    interrupted: Optional[str]  # SIGINT | SIGTERM when a signal stopped the run
    corpus: Optional[WrittenCorpusFacts]  # None: the set-up ended before the corpus was written
    target_forward: Optional[str]  # cuda-graph | eager (with the reason), "compiled, " first when fused
    compile_dense: bool  # the dense stretches compiled whole (reference/dense_compile.py; the small preset)
    flops_per_token: Optional[float]  # on a GPU only, as mfu
    mfu: Optional[float]
    saved_to: Optional[str]
    transport: Optional[str]  # how batches went from target to drafter: queue (threads), ipc/p2p/gloo routes
    loss_first: Optional[float]
    loss_last: Optional[float]
    ok: bool  # no worker failed and no signal stopped the run
