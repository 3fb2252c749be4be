"""The option vocabularies the CLI offers, one enum each, declared once.

Plain enums and nothing else, because every command module imports its choices when the CLI starts (typer needs
the types to build the options), and start-up time is a target (benchmarks/results/run.md). The domain modules
re-export the ones they own: repro/spec.py (Mode, Shapes, Cache, Expect), reference/config.py (Checkpoint),
reference/results.py (Transport, FailHow).
"""
from __future__ import annotations

import enum

# repro --jobs: trials side by side (repro/spec.py default_jobs), and the words --help and the README use for
# its default (a test holds the README to them). Here, not in repro/spec.py, which --help does not need to load.
MAX_JOBS = 8
JOBS_DEFAULT_TEXT = f"one a core on a CPU, half the cores with a GPU, up to {MAX_JOBS}"


class Mode(str, enum.Enum):
    """repro --mode: climb the ladder, or one stress (the names of dflash_doctor.hazards.Stress)."""

    AUTO = "auto"  # climb the ladder: natural, then amplified, then forced, until one reproduces
    NATURAL = "natural"
    AMPLIFIED = "amplified"
    FORCED = "forced"
    STUCK = "stuck"
    FOREIGN_TRACE = "foreign-trace"  # a thread loops torch.fx.symbolic_trace next to the workers (the patcher race)
    # Not a stress: nn.DataParallel's replica threads over a compiled model, each form in a child of its own
    # (repro/dataparallel.py); --threads is the replica count
    DATAPARALLEL = "dataparallel"


class Shapes(str, enum.Enum):
    SAME = "same"  # every thread one shape (the incident's three drafters)
    PER_THREAD = "per-thread"  # each thread its own shape: more compiles, each a new race window


class Cache(str, enum.Enum):
    COLD = "cold"  # a fresh TORCHINDUCTOR_CACHE_DIR per trial: the incident's state after the cache was deleted
    WARM = "warm"


class Expect(str, enum.Enum):
    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not-reproduced"
    # A --step/--model replay reproduced only under a stress that injects the tool's own FX trace (forced, stuck,
    # foreign-trace): the step fails if a thread of the trainer traces with FX while it runs (repro exit 5).
    REPRODUCED_IF_TRACED = "reproduced-if-traced"


class Checkpoint(str, enum.Enum):
    """How the loss chunks are checkpointed: the variants the incident toggled (repro and pipeline --checkpoint)."""

    NONE = "none"
    REENTRANT = "reentrant"  # torch.utils.checkpoint(..., use_reentrant=True)
    NON_REENTRANT = "non-reentrant"  # use_reentrant=False


class FailHow(str, enum.Enum):
    """What `pipeline --fail-worker` does to the worker it names (test hooks for the shutdown and the findings)."""

    KILL = "kill"  # a thread raises InjectedFailure; a process kills itself with SIGKILL
    RAISE = "raise"  # a RuntimeError, like any bug in a step
    HANG = "hang"  # blocks in a two-lock cycle with a helper thread it starts: a real deadlock, for the watchdog


class Transport(str, enum.Enum):
    """How a target process hands batches to a drafter process (`pipeline --workers processes`)."""

    AUTO = "auto"  # IPC between workers that share a device, torch.distributed between devices
    IPC = "ipc"  # a torch.multiprocessing queue: CUDA IPC on one GPU, shared memory on a CPU
    P2P = "p2p"  # torch.distributed send/recv: NCCL between GPUs, gloo on a CPU (and host-staged on one GPU)


class ModelCompile(str, enum.Enum):
    """`repro --model`: who compiles the user's module."""

    WHOLE = "whole"  # the harness wraps the whole module in torch.compile (a trainer that compiles its model)
    YOURS = "yours"  # no wrapper: the module compiles what it compiles itself (a trainer that compiles an inner fn)


class OnHang(str, enum.Enum):
    """run --on-hang: what happens once the watchdog names a hang in the user's run."""

    REPORT = "report"  # say it at once on stderr and keep the run alive (the user decides)
    KILL = "kill"  # kill the command's whole process tree, then report


class RunExpect(str, enum.Enum):
    """run --expect: a CI assertion on the run's findings."""

    CLEAN = "clean"  # any finding makes the exit code fail (1 when the command itself exited 0)


class Amplifier(str, enum.Enum):
    """run --amplify: what makes a rare race likely in the user's unmodified run without changing what it
    computes (supervise/amplifiers.py applies them inside every Python process the run starts)."""

    # sys.setswitchinterval(0.0002) before the user's code: the interpreter hands the GIL over 25 times as
    # often, so a thread inside a trace is preempted inside it far more often (one thread's trace, another's call).
    SWITCH_INTERVAL = "switch-interval"
    # A thread of the tool's own loops torch.fx.symbolic_trace over a small module beside the user's threads: what
    # a profiler or graph-inspection thread does. A race it shows is one the run has IF a thread traces with FX.
    FOREIGN_TRACE = "foreign-trace"
