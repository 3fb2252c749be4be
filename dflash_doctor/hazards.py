"""The hazards dflash-doctor knows, the stresses repro applies, and what a torch release is known to do.

Plain data (no torch): `guards` decides each hazard per release, `repro` names the one it reproduced, the
mitigation registry says which hazards each fix stops. docs/races.md describes each hazard and how it was measured.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional


class Hazard(str, enum.Enum):
    # Another thread's FX trace (make_fx inside its compile, or any torch.fx trace) makes a compiled call raise.
    FX_FLAG_LEAK = "fx-flag-leak"
    # Two traces exit out of order and the module-global FX flag stays True: every later compiled call raises.
    STUCK_FLAG = "stuck-flag"
    # torch.compiler.is_compiling() is process-global: one thread's compile changes code paths in every thread.
    IS_COMPILING_LEAK = "is-compiling-leak"
    # Dynamo's compile_lock held while waiting for the autograd device thread, which waits for compile_lock in the
    # lazy backward compile: no progress, no error.
    DEADLOCK = "deadlock"
    # torch.fx's Tracer.trace patches nn.Module.__call__/__getattr__ on the classes (every thread) and keeps its
    # patcher in the module global CURRENT_PATCHER: another thread's eager module call during a trace raises
    # NameError, and overlapping traces end in an AssertionError. Only where a thread runs its own FX trace.
    PATCHER_RACE = "fx-patcher-race"

    @property
    def label(self) -> str:
        """The hazard in words, for docs and reports (`title` is str's own method)."""
        return _TITLES[self]

    @property
    def minor(self) -> bool:
        """Changes code paths in other threads, but neither raises nor hangs: advice never trades a severe
        hazard for it."""
        return self is Hazard.IS_COMPILING_LEAK


_TITLES = {
    Hazard.FX_FLAG_LEAK: "FX-flag leak across threads",
    Hazard.STUCK_FLAG: "stuck FX flag",
    Hazard.IS_COMPILING_LEAK: "is-compiling leak across threads",
    Hazard.DEADLOCK: "compile-lock / autograd-device-thread deadlock",
    Hazard.PATCHER_RACE: "FX patcher race across threads",
}


class Stress(str, enum.Enum):
    """How hard repro pushes, in the order the ladder climbs."""

    NATURAL = "natural"  # the workers as they are
    AMPLIFIED = "amplified"  # FX proxy creation sleeps while the flag is set: the race window widened
    FORCED = "forced"  # a thread holds the FX flag inside a real trace while the workers call compiled code
    STUCK = "stuck"  # two traces exit out of order before the workers start


STRESS_ORDER = (Stress.NATURAL, Stress.AMPLIFIED, Stress.FORCED, Stress.STUCK)


@dataclass(frozen=True)
class Release:
    """What the advice needs to know about the torch in question; None means "not known"."""

    version: Optional[str] = None
    fx_flag_thread_local: Optional[bool] = None  # torch 2.14 made it thread-local
    non_lazy_backward_available: Optional[bool] = None  # torch._functorch.config.force_non_lazy_backward_lowering
    backward_compile_takes_compile_lock: Optional[bool] = None  # the lazy backward compile waits for compile_lock

    def hazards(self) -> frozenset:
        """The hazards this release can show (unknown counts as possible: advice errs on the safe side)."""
        found = set()
        if self.fx_flag_thread_local is not True:
            found |= {Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG}
        if self.backward_compile_takes_compile_lock is not False:
            found.add(Hazard.DEADLOCK)
        return frozenset(found)
