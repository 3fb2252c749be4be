"""The plan a pipeline runs and what it returns: plain dataclasses and enums, no torch."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from dflash_doctor.reference.checkpoint_files import DrafterCheckpoint
from dflash_doctor.reference.config import PipelineConfig
from dflash_doctor.reference.facts import (
    BlameFacts,
    HangFacts,
    PipelineFacts,
    PipelineWorkerFacts,
    StepTimeFacts,
    ThreadStackFacts,
    WrittenCorpusFacts,
)
from dflash_doctor.vocabularies import FailHow, Transport


class Outcome(str, enum.Enum):
    """How a worker ended."""

    OK = "ok"  # did all its work
    ERROR = "error"  # raised
    KILLED = "killed"  # ended by --fail-worker, or (a process) by a signal
    STOPPED = "stopped"  # ended early and cleanly: another worker failed, or the run was interrupted
    HUNG = "hung"  # made no progress, and did not stop when asked


FAILED = (Outcome.ERROR, Outcome.KILLED, Outcome.HUNG)


@dataclass(frozen=True)
class RunPlan:
    cfg: PipelineConfig
    device_type: str  # cpu | cuda
    target_devices: List[str]  # one per target worker
    drafter_devices: List[str]  # one per drafter worker
    steps: int  # steps to run now (a resumed run continues its numbering)
    checkpoint: str
    attention_path: str
    seed: int = 0
    start_step: int = 0
    resume_state: Optional[DrafterCheckpoint] = None
    save_dir: Optional[str] = None
    fail_worker: Optional[str] = None
    fail_at_step: int = 1
    fail_how: FailHow = FailHow.KILL
    hf_checkpoint: Optional[str] = None
    mitigations: Tuple[str, ...] = ()  # names from dflash_doctor.mitigations, applied in set-up
    tracing_thread: bool = False  # a thread loops torch.fx.symbolic_trace next to the workers (reference/tracing.py)
    transport: Transport = Transport.AUTO
    join_timeout_s: float = 30.0  # after the last step or a failure: workers inside a cold compile need a while
    stall_timeout_s: float = 600.0  # no drafter step for this long after set-up (first step: compile) = hung
    # After SIGINT/SIGTERM, how long workers (or the set-up) get before they are left or killed: the command's
    # bound is 5 s (docs/robustness.md), and the report still has to be written and the interpreter to exit.
    stop_grace_s: float = 3.0
    poll_s: float = 0.2

    def target_names(self) -> List[str]:
        return [f"target-{i}" for i in range(len(self.target_devices))]

    def drafter_names(self) -> List[str]:
        return [f"drafter-{i}" for i in range(len(self.drafter_devices))]

    def drafter_cfg(self, index: int) -> PipelineConfig:
        """Drafter `index`'s sizes: one more block per sequence than each earlier drafter on its device when the
        preset asks for distinct shapes (so each compiles its own graph, as on GPUs of their own)."""
        if not self.cfg.distinct_drafter_shapes:
            return self.cfg
        device = self.drafter_devices[index]
        return self.cfg.with_extra_blocks(self.drafter_devices[:index].count(device))


@dataclass
class WorkerOutcome:
    name: str
    role: str  # target | drafter
    device: str
    outcome: Outcome = Outcome.OK
    error: Optional[str] = None
    steps: int = 0
    traceback: Optional[str] = None
    phase: str = "starting"  # what it was doing last (set-up phases, then training)
    wait_s: float = 0.0  # time blocked on its peers: a drafter waiting for batches, a target for queue room
    # torch.autograd.is_multithreading_enabled() read inside the worker thread, under the mitigations' per-thread
    # switches (single-thread-autograd turns it off there); None where it was not read (processes, set-up)
    autograd_multithreading: Optional[bool] = None
    # Every switch the applied mitigations declare (mitigations.Switch), read inside the worker thread: compile
    # settings are per thread from torch 2.12, so this shows the set-up reached the worker. Empty where not read.
    switches: Dict[str, str] = field(default_factory=dict)
    save_error: Optional[str] = None  # --save: why the trained drafter could not be written (disk full...)

    def to_dict(self) -> PipelineWorkerFacts:
        return {"name": self.name, "role": self.role, "device": self.device, "outcome": self.outcome.value,
                "error": self.error, "steps": self.steps, "traceback": self.traceback, "phase": self.phase,
                "wait_s": round(self.wait_s, 3), "autograd_multithreading": self.autograd_multithreading,
                "switches": dict(self.switches), "save_error": self.save_error}


@dataclass(frozen=True)
class StepRecord:
    """One drafter replica's step, as it reports it."""

    step: int
    worker: str
    loss: float
    tokens: int
    seconds: float  # wall time from launching this step to knowing its loss (batch wait excluded)
    finished_at: float  # clock() when the step was known to be done


def percentiles(values: List[float], points=(50, 90, 99)) -> Optional[Dict[str, float]]:
    """Nearest-rank percentiles (and the max) of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    out = {f"p{p}": ordered[min(len(ordered) - 1, max(0, -(-p * len(ordered) // 100) - 1))] for p in points}
    out["max"] = ordered[-1]
    return {key: round(value, 6) for key, value in out.items()}


@dataclass
class PipelineResult:
    preset: str
    workers_mode: str
    device_type: str
    steps: int  # steps every drafter replica completed in this run
    start_step: int
    losses: List[float] = field(default_factory=list)  # mean over replicas, per completed step
    tokens: int = 0  # sequence tokens trained on (all replicas), steady-state window
    tokens_per_s: Optional[float] = None
    startup_s: Optional[float] = None  # process start to the run's start (interpreter, imports, the plan)
    warmup_s: Optional[float] = None  # run start to the first completed step (set-up and the first step's compile)
    setup_s: Optional[float] = None  # start to the end of set-up (models, corpus, CUDA graphs, warm-up)
    setup: Dict[str, float] = field(default_factory=dict)  # seconds per set-up phase
    step_time_s: Optional[StepTimeFacts] = None  # percentiles of the interval between consecutive steps
    wall_s: float = 0.0
    workers: List[WorkerOutcome] = field(default_factory=list)
    failed_worker: Optional[str] = None
    mitigation: str = "none"
    mitigation_facts: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # what each one's set-up reported
    hang: Optional[HangFacts] = None  # the classified stall: kind, cycle, chain, threads
    stacks: List[ThreadStackFacts] = field(default_factory=list)  # every thread's stack when the stall was declared
    blame: List[BlameFacts] = field(default_factory=list)  # the flight recorder's blame for FX errors
    interrupted: Optional[str] = None  # SIGINT | SIGTERM when the run was stopped by a signal
    corpus: Optional[WrittenCorpusFacts] = None
    target_forward: Optional[str] = None  # cuda-graph | eager (with the reason), "compiled, " first when fused
    compile_dense: bool = False  # the drafter's (and target's) dense stretches compiled whole (dense_compile.py)
    flops_per_token: Optional[float] = None
    mfu: Optional[float] = None
    saved_to: Optional[str] = None
    transport: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.failed_worker is None and self.interrupted is None

    def facts(self) -> PipelineFacts:
        """The JSON facts: every field in declaration order, then the first and last loss and `ok`. Containers
        are copied, so a caller changing the facts leaves the result as it was."""
        return {
            "preset": self.preset, "workers_mode": self.workers_mode, "device_type": self.device_type,
            "steps": self.steps, "start_step": self.start_step, "losses": list(self.losses), "tokens": self.tokens,
            "tokens_per_s": self.tokens_per_s, "startup_s": self.startup_s, "warmup_s": self.warmup_s,
            "setup_s": self.setup_s, "setup": dict(self.setup), "step_time_s": self.step_time_s,
            "wall_s": self.wall_s, "workers": [w.to_dict() for w in self.workers], "failed_worker": self.failed_worker,
            "mitigation": self.mitigation, "mitigation_facts": dict(self.mitigation_facts), "hang": self.hang,
            "stacks": list(self.stacks), "blame": list(self.blame), "interrupted": self.interrupted,
            "corpus": self.corpus, "target_forward": self.target_forward,
            "compile_dense": self.compile_dense, "flops_per_token": self.flops_per_token,
            "mfu": self.mfu, "saved_to": self.saved_to, "transport": self.transport,
            "loss_first": self.losses[0] if self.losses else None,
            "loss_last": self.losses[-1] if self.losses else None,
            "ok": self.ok,
        }


class Progress:
    """What a run tells its caller while it goes: a worker's phase, and each completed step. Never prints."""

    def phase(self, worker: str, text: str) -> None:
        """`worker` is now doing `text` (building the target, writing the corpus, compiling, training)."""

    def step(self, done: int, total: int, loss: float, tokens_per_s: Optional[float]) -> None:
        """Step `done` of `total` completed on every replica."""


class StepAggregator:
    """Joins replica step records into per-step losses and a steady-state throughput, calling `progress`."""

    def __init__(self, replicas: int, total: int, progress: Progress, first_step: int = 1):
        self.replicas, self.total, self.progress, self.first_step = replicas, total, progress, first_step
        self.pending: dict = {}
        self.losses: List[float] = []
        self.step_ends: List[float] = []
        self.step_tokens: List[int] = []

    def add(self, record: StepRecord) -> None:
        self.pending.setdefault(record.step, []).append(record)
        while True:
            nxt = self.pending.get(self._next_step())
            if nxt is None or len(nxt) < self.replicas:
                return
            del self.pending[self._next_step()]
            self.losses.append(sum(r.loss for r in nxt) / len(nxt))
            self.step_ends.append(max(r.finished_at for r in nxt))
            self.step_tokens.append(sum(r.tokens for r in nxt))
            self.progress.step(len(self.losses), self.total, self.losses[-1], self.tokens_per_s())

    def _next_step(self) -> int:
        return self.first_step + len(self.losses)

    def steady_tokens(self) -> int:
        return sum(self.step_tokens[1:])

    def tokens_per_s(self) -> Optional[float]:
        # The first step includes compile and warm-up: measure from its end, as the seeds' log did.
        if len(self.step_ends) < 2 or self.step_ends[-1] <= self.step_ends[0]:
            return None
        return self.steady_tokens() / (self.step_ends[-1] - self.step_ends[0])

    def step_times(self) -> Optional[StepTimeFacts]:
        spread = percentiles([b - a for a, b in zip(self.step_ends, self.step_ends[1:])])
        if spread is None:
            return None
        return {"p50": spread["p50"], "p90": spread["p90"], "p99": spread["p99"], "max": spread["max"]}
