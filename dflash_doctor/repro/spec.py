"""What a repro run is asked to do (parsed, validated options) and what one phase child is told (JSON-able).

The option vocabularies are declared here once, as enums; the CLI's choices and help are built from them.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Tuple

from dflash_doctor.errors import UsageError, finite
from dflash_doctor.hazards import Stress
from dflash_doctor.vocabularies import MAX_JOBS, Cache, Checkpoint, Mode, ModelCompile, Shapes
from dflash_doctor.wire import exact_fields


# The reference drafter the replay builds by default: big enough that compiled flex_attention takes the kernel
# training uses (>= 128 query rows; below that it switches to its decoding kernel, whose slow first call let the
# other threads' compiles finish before the first backward began, so the deadlock never formed: docs/races.md).
DEFAULT_PRESET = "replay"

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
_MODEL = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def parse_devices(text: str) -> Tuple[str, ...]:
    devices = tuple(part.strip() for part in text.split(",") if part.strip())
    if not devices or any(not _DEVICE.match(d) for d in devices):
        raise UsageError(f"--device must be cpu, cuda or a list like cuda:0,cuda:1; got {text!r}")
    if "cpu" in devices and len(devices) > 1:
        raise UsageError("--device cpu cannot be mixed with CUDA devices")
    return devices


def default_jobs(devices: Tuple[str, ...], cpu_count: Optional[int] = None) -> int:
    """Trials side by side. A CPU trial is about one core's work (its threads share one interpreter; forced and
    stuck trials compile into a shared cache): one a core (the 2-core matrix, back to back on a busy box: 209 s
    with 2, 253 s with 1; benchmarks/results/repro_matrix_cpu/2026-12-02-jobs*-cpu.json). A GPU trial also keeps
    triton's compile workers busy: half the cores."""
    cores = cpu_count or os.cpu_count() or 1
    share = cores if devices == ("cpu",) else cores // 2
    return max(1, min(MAX_JOBS, share))


FLAG_HELD_STRESSES = (Stress.FORCED, Stress.STUCK)


@dataclass(frozen=True)
class ReproSpec:
    threads: int = 3
    devices: Tuple[str, ...] = ("cpu",)
    backward: Optional[bool] = None  # None: on for CUDA, off for CPU
    checkpoint: str = Checkpoint.NONE.value
    shapes: str = Shapes.SAME.value
    cache: str = Cache.COLD.value
    steps: int = 3
    trials: int = 3  # natural trials; the ladder derives the other stresses' counts (repro/ladder.py)
    timeout_s: float = 300.0  # per phase child, enforced by the parent (kills the process group)
    hang_after_s: float = 60.0  # no progress this long in a child -> stacks dumped, outcome hung
    mode: str = Mode.AUTO.value
    mitigation: Tuple[str, ...] = ()
    amplify_ms: float = 2.0
    preset: str = DEFAULT_PRESET
    model: Optional[str] = None  # "pkg.module:factory" (runs user code)
    model_compile: str = ModelCompile.WHOLE.value  # who compiles the --model module
    step: Optional[str] = None  # "pkg.module:make_step": the user's whole training step (runs user code)
    jobs: Optional[int] = None  # trials run side by side; None: default_jobs()
    max_time_s: Optional[float] = None  # the whole run's wall-clock limit (--max-time); None: none

    def validate(self) -> "ReproSpec":
        """One UsageError line for the first option that is wrong, in the order the groups below are checked."""
        self._check_counts()
        self._check_vocabularies()
        self._check_user_code()
        self._check_reference()
        return self

    def _check_counts(self) -> None:
        if self.threads < 2:
            raise UsageError("--threads must be at least 2 (the single-thread phase always runs first)")
        if self.threads > 64:
            raise UsageError("--threads must be at most 64")
        if not 1 <= self.steps <= 10_000 or not 1 <= self.trials <= 100:
            raise UsageError("--steps must be 1..10000 and --trials 1..100")
        if self.jobs is not None and not 1 <= self.jobs <= 64:
            raise UsageError("--jobs must be 1..64")
        for name, value in (("--timeout", self.timeout_s), ("--hang-after", self.hang_after_s),
                            ("--amplify-ms", self.amplify_ms)):
            finite(value, name)
        if self.max_time_s is not None:
            finite(self.max_time_s, "--max-time")
            if self.max_time_s <= 0:
                raise UsageError("--max-time must be a positive number of seconds")
        if self.hang_after_s <= 0 or self.timeout_s <= self.hang_after_s:
            raise UsageError("--timeout must be longer than --hang-after (the child reports a hang before it is "
                             "killed)")

    def _check_vocabularies(self) -> None:
        if self.mode not in {m.value for m in Mode}:
            raise UsageError(f"--mode must be one of {', '.join(m.value for m in Mode)}")
        if self.mode == Mode.DATAPARALLEL.value:  # its own replay (repro/dataparallel.py), not the stress ladder
            raise UsageError("--mode dataparallel replays nn.DataParallel's replicas, not the drafter ladder")
        if (self.checkpoint not in {c.value for c in Checkpoint} or self.shapes not in {s.value for s in Shapes}
                or self.cache not in {c.value for c in Cache}):
            raise UsageError("bad --checkpoint, --shapes or --cache value")

    def _check_user_code(self) -> None:
        if self.model is not None and not _MODEL.match(self.model):
            raise UsageError(f"--model must look like pkg.module:factory, got {self.model!r}")
        if self.step is not None and not _MODEL.match(self.step):
            raise UsageError(f"--step must look like pkg.module:make_step, got {self.step!r}")
        if self.step is not None and self.model is not None:
            raise UsageError("--step and --model are two ways to name your code: give one")
        if self.model_compile not in {m.value for m in ModelCompile}:
            raise UsageError(f"--model-compile must be one of {', '.join(m.value for m in ModelCompile)}")
        if self.model_compile != ModelCompile.WHOLE.value and self.model is None:
            raise UsageError("--model-compile applies to --model (a --step compiles what it compiles itself)")

    def _check_reference(self) -> None:
        if self.on_cpu and self.backward and not self.user_code:
            raise UsageError("flex_attention has no CPU backward (NotImplementedError in torch, eager or compiled): "
                             "use --no-backward on CPU, a CUDA --device, or --model with a CPU-trainable model")
        if self.amplify_ms < 0:
            raise UsageError("--amplify-ms must be >= 0")
        if not self.user_code:
            from dflash_doctor.reference.config import PRESETS

            if self.preset not in PRESETS:
                raise UsageError(f"unknown --preset {self.preset!r}; choose one of: {', '.join(PRESETS)}")

    @property
    def user_code(self) -> bool:
        """The trials import and run the user's code (--model or --step): their environment, their path."""
        return self.model is not None or self.step is not None

    @property
    def on_cpu(self) -> bool:
        return self.devices == ("cpu",)

    @property
    def effective_backward(self) -> bool:
        return (not self.on_cpu) if self.backward is None else self.backward

    @property
    def effective_jobs(self) -> int:
        return self.jobs or default_jobs(self.devices)

    @property
    def shared_cache_stresses(self) -> Tuple[Stress, ...]:
        """The stresses whose trials compile into one cache the run shares instead of a cold one each.

        Under forced and stuck the FX flag is up from before the workers start until after they end (held by a
        trace, or stuck), so how long their compile takes cannot change what they meet; without a backward the
        compile-lock / autograd deadlock, the one race a compile's length decides, cannot form (docs/races.md).
        There they are the same trials on a fraction of the CPU. Everywhere else each trial compiles cold."""
        if self.cache != Cache.COLD.value or self.effective_backward:
            return ()
        return FLAG_HELD_STRESSES

    def shares_cache(self, stress: Stress, row: Tuple[str, ...]) -> bool:
        """Whether a trial of `row` under `stress` compiles into the run's one shared cache instead of a cold one.

        The flag-held stresses above; and every trial of a fix that runs each worker alone in a process of its
        own (`processes`) under a cold cache: the FX flag's leak, the stuck flag and the compile-lock / autograd
        deadlock all need a second thread in the worker's process, and that row's disturbances run in a process
        of their own, so nothing a trial of it meets depends on how long a compile takes (docs/races.md)."""
        if stress in self.shared_cache_stresses:
            return True
        from dflash_doctor import mitigations as registry

        return self.cache == Cache.COLD.value and any(registry.get(name).separate_processes for name in row)

    @property
    def pinned_stress(self) -> Optional[Stress]:
        mode = Mode(self.mode)
        return None if mode is Mode.AUTO else Stress(mode.value)


PHASE_SPEC_VERSION = 1  # spec.json, parent to child (repro/runner.py write_spec, repro/child.py main)


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
    mode: str  # the stress; its disturbance applies only to the multi phase (single is the control)
    mitigation: List[str]
    amplify_ms: float
    preset: str
    model: Optional[str]
    thread_names: List[str] = field(default_factory=list)
    disturb_hold_s: float = 0.0
    model_compile: str = ModelCompile.WHOLE.value
    step: Optional[str] = None
    # Nothing this child meets depends on how long its compiles take (ReproSpec.shares_cache): a child forked from
    # the warm-start server may keep the server's frozen objects out of its collections (warm_start.py).
    timing_free: bool = False

    def to_dict(self) -> dict:
        return {"version": PHASE_SPEC_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "PhaseSpec":
        """What to_dict wrote, this version, every field and no other: a field the parent renamed or dropped
        fails in the child (its log says which), never reads as a default."""
        return cls(**exact_fields(cls, data, PHASE_SPEC_VERSION, "phase spec"))
