"""nn.DataParallel over a compiled model: the forms trainers write and the fixes that hold, declared once.

repro --mode dataparallel builds and runs each form (repro/dataparallel.py), DFD707 takes its fix text from here,
and a scan or log rule about DataParallel can cite the same words. Plain data: importing it never imports torch.
Why the baseline form fails, and what each fix does, is in docs/races.md ("nn.DataParallel over a compiled model").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from dflash_doctor.outcomes import WireEnum


class DataParallelForm(WireEnum):
    """Who compiles what, and who runs the replicas."""

    COMPILED_INSIDE = "compiled-inside"  # nn.DataParallel(torch.compile(model)): the form that fails
    COMPILED_OUTSIDE = "compiled-outside"  # torch.compile(nn.DataParallel(model))
    PER_REPLICA = "per-replica"  # parallel_apply over one separately compiled module per replica
    COMPILED_FUNCTION = "compiled-function"  # nn.DataParallel(model) whose forward calls a compiled function
    PROCESSES = "processes"  # one process per replica: DistributedDataParallel over gloo, compiled in each

    @property
    def code(self) -> str:
        return _CODE[self]


_CODE = {
    DataParallelForm.COMPILED_INSIDE: "nn.DataParallel(torch.compile(model), device_ids=[0] * N)",
    DataParallelForm.COMPILED_OUTSIDE: "torch.compile(nn.DataParallel(model, device_ids=[0] * N))",
    DataParallelForm.PER_REPLICA: "parallel_apply([torch.compile(copy) for each replica], chunks)",
    DataParallelForm.COMPILED_FUNCTION: "nn.DataParallel(model) with attend = torch.compile(flex_attention) inside",
    DataParallelForm.PROCESSES: "torch.compile(DistributedDataParallel(model)), one process per replica",
}
BASELINE = DataParallelForm.COMPILED_INSIDE


@dataclass(frozen=True)
class Measured:
    torch: str  # the release (major.minor)
    machine: str
    showed: str


@dataclass(frozen=True)
class DataParallelFix:
    """Advice for a DataParallel trainer that repro applies (the form it builds) and checks (the form's steps)."""

    name: str  # `repro --mode dataparallel --mitigation NAME`
    form: DataParallelForm
    api: str
    caveat: str
    registry_entry: Optional[str]  # the mitigation registry's entry it is an instance of, if any
    measured: Tuple[Measured, ...]


# Best first: one process per GPU keeps the compile and gives each replica its own Dynamo state; compiling outside
# avoids the corruption but, as measured, compiles nothing in the replicas.
FIXES: Tuple[DataParallelFix, ...] = (
    DataParallelFix(
        name="processes",
        form=DataParallelForm.PROCESSES,
        api="torchrun --nproc-per-node N train.py with DistributedDataParallel (one process per GPU), or "
            "`accelerate launch`; the Hugging Face Trainer uses DDP when started by a launcher",
        caveat="one CUDA context and one compile per process; several processes on one GPU (as replayed here) "
               "share its memory",
        registry_entry="processes",
        measured=(Measured("2.11", "H100", "3 processes on GPU 0 (DistributedDataParallel over gloo, compiled in "
                                            "each), 3 steps each, 3 graphs, no error"),
                  Measured("2.13", "2-core CPU", "3 processes (DistributedDataParallel over gloo, compiled in "
                                                  "each), 3 steps each, no error")),
    ),
    DataParallelFix(
        name="compile-outside-dataparallel",
        form=DataParallelForm.COMPILED_OUTSIDE,
        api="model = torch.compile(nn.DataParallel(model))  # not nn.DataParallel(torch.compile(model))",
        caveat="Dynamo skips DataParallel's own frames (torch's files) and the replica threads start without "
               "Dynamo's per-thread frame hook, so the replicas can run uncompiled: `graphs` in the facts says "
               "how many graphs the run compiled",
        registry_entry=None,
        measured=(Measured("2.11", "H100", "3 steps, no error, 0 graphs compiled: the replicas ran uncompiled"),
                  Measured("2.13", "2-core CPU, repro's stand-in", "3 steps, no error, 0 graphs compiled: the "
                                                                    "replicas ran uncompiled")),
    ),
)
FIX_BY_NAME: Dict[str, DataParallelFix] = {fix.name: fix for fix in FIXES}


def fix_text() -> str:
    """DFD707's fix, in the table's words, best first, each with its caveat."""
    return "One of, best first: " + "; ".join(f"{fix.name}: {fix.api} ({fix.caveat})" for fix in FIXES) + \
        ". `dflash-doctor repro --mode dataparallel` runs each form on your machine."
