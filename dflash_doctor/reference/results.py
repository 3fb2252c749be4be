"""The plan a pipeline runs and what it returns: plain dataclasses, no torch."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional

from dflash_doctor.reference.config import PipelineConfig

# Worker outcomes. ok: did all its work; error: raised; killed: ended by --fail-worker (a test hook);
# stopped: ended early and cleanly because another worker died; hung: did not stop within the join timeout.
OUTCOMES = ("ok", "error", "killed", "stopped", "hung")


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
    resume_state: Optional[dict] = None
    save_dir: Optional[str] = None
    fail_worker: Optional[str] = None
    fail_at_step: int = 0
    hf_checkpoint: Optional[str] = None
    join_timeout_s: float = 60.0
    stall_timeout_s: float = 600.0  # no drafter step for this long (first one: compile included) = hung
    poll_s: float = 0.2

    def target_names(self) -> List[str]:
        return [f"target-{i}" for i in range(len(self.target_devices))]

    def drafter_names(self) -> List[str]:
        return [f"drafter-{i}" for i in range(len(self.drafter_devices))]


@dataclass
class WorkerOutcome:
    name: str
    role: str  # target | drafter
    device: str
    outcome: str = "ok"
    error: Optional[str] = None
    steps: int = 0
    traceback: Optional[str] = None


@dataclass(frozen=True)
class StepRecord:
    """One drafter replica's step, as it reports it."""

    step: int
    worker: str
    loss: float
    tokens: int
    seconds: float  # wall time of this step (batch wait excluded)
    finished_at: float  # clock() when the step ended


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
    warmup_s: Optional[float] = None  # start to the first completed step (model build, corpus, compile)
    wall_s: float = 0.0
    workers: List[WorkerOutcome] = field(default_factory=list)
    failed_worker: Optional[str] = None
    flops_per_token: Optional[float] = None
    mfu: Optional[float] = None
    saved_to: Optional[str] = None
    transport: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.failed_worker is None

    def facts(self) -> dict:
        doc = asdict(self)
        doc["loss_first"] = self.losses[0] if self.losses else None
        doc["loss_last"] = self.losses[-1] if self.losses else None
        doc["ok"] = self.ok
        return doc


Progress = Callable[[int, int, float, Optional[float]], None]  # (steps done, total, loss, tok/s)


def no_progress(done: int, total: int, loss: float, tokens_per_s: Optional[float]) -> None:
    """The default progress callback: the pipeline itself never prints."""


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
            self.progress(len(self.losses), self.total, self.losses[-1], self.tokens_per_s())

    def _next_step(self) -> int:
        return self.first_step + len(self.losses)

    def steady_tokens(self) -> int:
        return sum(self.step_tokens[1:])

    def tokens_per_s(self) -> Optional[float]:
        # The first step includes compile and warm-up: measure from its end, as the seeds' log did.
        if len(self.step_ends) < 2 or self.step_ends[-1] <= self.step_ends[0]:
            return None
        return self.steady_tokens() / (self.step_ends[-1] - self.step_ends[0])
