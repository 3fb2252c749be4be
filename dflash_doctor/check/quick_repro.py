"""The `--repro` part of check: the bundled drafter step in forced mode on the CPU, two threads, one step,
bounded by the check's timeout. Forced mode makes a thread hold the FX flag while another calls compiled code,
so the verdict says whether this torch lets one thread's trace break another's compiled call, in seconds and
without depending on timing luck."""
from __future__ import annotations

from typing import TYPE_CHECKING

from dflash_doctor.findings import Report
from dflash_doctor.progress import Reporter, silent

if TYPE_CHECKING:
    from dflash_doctor.repro.facts import ReproFacts

QUICK_THREADS = 2
QUICK_STEPS = 1


def quick_forced_repro(timeout: float = 120.0, runner=None, progress: Reporter = silent) -> "Report[ReproFacts]":
    """`repro --mode forced --device cpu --no-backward --threads 2 --steps 1 --cache warm` as a Report.

    Each of the two phases (single-thread control, then two threads) is killed after `timeout` seconds and
    called hung after 80% of it. The warm compile cache is fine here: forced mode tests the guard every compiled
    call runs, which a cache hit does not skip, and it saves the cold C++ compile on every CI run after the first.
    """
    from dflash_doctor.repro.harness import run_repro
    from dflash_doctor.repro.spec import ReproSpec

    spec = ReproSpec(
        threads=QUICK_THREADS, devices=("cpu",), backward=False, steps=QUICK_STEPS, mode="forced", cache="warm",
        timeout_s=timeout, hang_after_s=timeout * 0.8,
    )
    return run_repro(spec, runner=runner, progress=progress)
