"""What a repro run is asked to do (parsed, validated options) and what one phase child is told (JSON-able)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import List, Optional, Tuple

from dflash_doctor.errors import UsageError

MODES = ("natural", "amplified", "forced", "stuck")
MITIGATIONS = ("none", "first-call-lock", "global-lock", "warmup", "threadlocal-flag", "non-lazy-backward",
               "processes")
# The rows of --matrix: every mitigation alone, then the combination that worked on the H200 (FACTS section 3).
MATRIX = (("none",), ("first-call-lock",), ("global-lock",), ("warmup",), ("threadlocal-flag",),
          ("non-lazy-backward",), ("processes",), ("threadlocal-flag", "non-lazy-backward"))
CHECKPOINTS = ("none", "reentrant", "non-reentrant")
SHAPES = ("same", "per-thread")
CACHES = ("cold", "warm")
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
_MODEL = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def parse_mitigation(text: str) -> Tuple[str, ...]:
    """`threadlocal-flag,non-lazy-backward` -> ('threadlocal-flag', 'non-lazy-backward'); 'none' -> ()."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in MITIGATIONS]
    if unknown or not names:
        raise UsageError(f"unknown mitigation {', '.join(unknown) or repr(text)}; choose from {', '.join(MITIGATIONS)} "
                         "(combine with commas)")
    if "none" in names and len(names) > 1:
        raise UsageError("mitigation 'none' cannot be combined with others")
    ordered = tuple(name for name in MITIGATIONS if name in names and name != "none")
    if "processes" in ordered and len(ordered) > 1:
        raise UsageError("'processes' replaces threads; it does not combine with thread mitigations")
    return ordered


def mitigation_label(mitigations: Tuple[str, ...]) -> str:
    return ",".join(mitigations) if mitigations else "none"


def parse_devices(text: str) -> Tuple[str, ...]:
    devices = tuple(part.strip() for part in text.split(",") if part.strip())
    if not devices or any(not _DEVICE.match(d) for d in devices):
        raise UsageError(f"--device must be cpu, cuda or a list like cuda:0,cuda:1; got {text!r}")
    if "cpu" in devices and len(devices) > 1:
        raise UsageError("--device cpu cannot be mixed with CUDA devices")
    return devices


@dataclass(frozen=True)
class ReproSpec:
    threads: int = 3
    devices: Tuple[str, ...] = ("cpu",)
    backward: Optional[bool] = None  # None: on for CUDA, off for CPU
    checkpoint: str = "none"
    shapes: str = "same"
    cache: str = "cold"
    steps: int = 3
    trials: int = 1
    timeout_s: float = 300.0  # per phase child, enforced by the parent (kills the process group)
    hang_after_s: float = 60.0  # no progress this long in a child -> stacks dumped, outcome hung
    mode: str = "natural"
    mitigation: Tuple[str, ...] = ()
    amplify_ms: float = 2.0
    preset: str = "tiny"
    model: Optional[str] = None  # "pkg.module:factory" (runs user code)

    def validate(self) -> "ReproSpec":
        if self.threads < 2:
            raise UsageError("--threads must be at least 2 (the single-thread phase always runs first)")
        if self.steps < 1 or self.trials < 1:
            raise UsageError("--steps and --trials must be at least 1")
        if self.hang_after_s <= 0 or self.timeout_s <= self.hang_after_s:
            raise UsageError("--timeout must be longer than --hang-after (the child reports a hang before it is "
                             "killed)")
        if self.mode not in MODES:
            raise UsageError(f"--mode must be one of {', '.join(MODES)}")
        if self.checkpoint not in CHECKPOINTS or self.shapes not in SHAPES or self.cache not in CACHES:
            raise UsageError("bad --checkpoint, --shapes or --cache value")
        if self.model is not None and not _MODEL.match(self.model):
            raise UsageError(f"--model must look like pkg.module:factory, got {self.model!r}")
        if self.on_cpu and self.backward and self.model is None:
            raise UsageError("flex_attention has no CPU backward (NotImplementedError in torch, eager or compiled): "
                             "use --no-backward on CPU, a CUDA --device, or --model with a CPU-trainable model")
        if self.amplify_ms < 0:
            raise UsageError("--amplify-ms must be >= 0")
        return self

    @property
    def on_cpu(self) -> bool:
        return self.devices == ("cpu",)

    @property
    def effective_backward(self) -> bool:
        return (not self.on_cpu) if self.backward is None else self.backward

    def with_mitigation(self, mitigation: Tuple[str, ...]) -> "ReproSpec":
        return replace(self, mitigation=mitigation)


@dataclass
class PhaseSpec:
    """Everything one child needs; travels as JSON."""

    phase: str  # single | multi | disturb
    threads: int
    devices: List[str]
    backward: bool
    checkpoint: str
    shape_indices: List[int]  # one per thread
    steps: int
    hang_after_s: float
    mode: str  # the disturbance applies only to the multi phase; single is the control
    mitigation: List[str]
    amplify_ms: float
    preset: str
    model: Optional[str]
    thread_names: List[str] = field(default_factory=list)
    disturb_hold_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "PhaseSpec":
        return cls(**data)
