"""The hazards dflash-doctor knows, the stresses repro applies, and what a torch release is known to do.

Plain data (no torch): `guards` decides each hazard per release, `repro` names the one it reproduced, the
mitigation registry says which hazards each fix stops. docs/races.md describes each hazard and how it was measured.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Optional


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

    @property
    def condition(self) -> Optional[str]:
        """What a trainer must do for the hazard to bite at all, for a conditional hazard (None: any threaded
        trainer that compiles can hit it).

        A conditional hazard is advised on only when the caller says the trainer meets the condition
        (`Release.hazards(including=...)`, `mitigations.recommend`/`fix_text` given the hazard), so advice for
        a trainer without it does not drown in it; every fix that leaves it open still names it in its caveats
        (`mitigations.caveats_for`), and `guards` still decides it per release."""
        return _CONDITIONS.get(self)

    @property
    def conditional(self) -> bool:
        return self in _CONDITIONS

    @property
    def symptom(self) -> str:
        """What a user sees when it bites, for caveats that name it."""
        return _SYMPTOMS[self]


_TITLES = {
    Hazard.FX_FLAG_LEAK: "FX-flag leak across threads",
    Hazard.STUCK_FLAG: "stuck FX flag",
    Hazard.IS_COMPILING_LEAK: "is-compiling leak across threads",
    Hazard.DEADLOCK: "compile-lock / autograd-device-thread deadlock",
    Hazard.PATCHER_RACE: "FX patcher race across threads",
}
# docs/races.md, "The FX patcher race": the patches are installed only inside Tracer.trace; a compile's make_fx
# tracer runs other threads' module calls through and compiles do not overlap (compile_lock), so a trainer whose
# threads never run a torch.fx trace of their own is not exposed, while a profiler or graph-inspection thread
# calling symbolic_trace next to the workers is.
_CONDITIONS = {
    Hazard.PATCHER_RACE: "a thread runs its own torch.fx trace (symbolic_trace, a Tracer subclass) while other "
                         "threads run modules",
}
_SYMPTOMS = {
    Hazard.FX_FLAG_LEAK: "a compiled call raises 'Detected that you are using FX to symbolically trace a "
                         "dynamo-optimized function'",
    Hazard.STUCK_FLAG: "every later compiled call in the process raises the FX error",
    Hazard.IS_COMPILING_LEAK: "torch.compiler.is_compiling() is True in threads that are not compiling",
    Hazard.DEADLOCK: "the workers hang with no error",
    Hazard.PATCHER_RACE: "other threads' eager module calls raise NameError ('module is not installed as a "
                         "submodule') and overlapping traces end in 'AssertionError: CURRENT_PATCHER is None in "
                         "finally block'",
}


class Stress(str, enum.Enum):
    """How hard repro pushes, in the order the ladder climbs."""

    NATURAL = "natural"  # the workers as they are
    AMPLIFIED = "amplified"  # FX proxy creation sleeps while the flag is set: the race window widened
    FORCED = "forced"  # a thread holds the FX flag inside a real trace while the workers call compiled code
    STUCK = "stuck"  # two traces exit out of order before the workers start
    # A thread loops torch.fx.symbolic_trace (the default tracer, as a profiler would) next to the workers.
    FOREIGN_TRACE = "foreign-trace"


STRESS_ORDER = (Stress.NATURAL, Stress.AMPLIFIED, Stress.FORCED, Stress.STUCK, Stress.FOREIGN_TRACE)


@dataclass(frozen=True)
class Release:
    """What the advice needs to know about the torch in question; None means "not known"."""

    version: Optional[str] = None
    fx_flag_thread_local: Optional[bool] = None  # torch 2.14 made it thread-local
    non_lazy_backward_available: Optional[bool] = None  # torch._functorch.config.force_non_lazy_backward_lowering
    backward_compile_takes_compile_lock: Optional[bool] = None  # the lazy backward compile waits for compile_lock
    # Tracer.trace's nn.Module patches apply to the tracing thread only and its patcher is per thread (False in
    # every release read, 2.4-2.15: the patches go on the classes and CURRENT_PATCHER is a module global).
    fx_patches_isolated: Optional[bool] = None
    # A value assigned to torch._dynamo/_inductor/_functorch.config lives in the assigning thread's ContextVar
    # (2.12+): threads started later read the default, so a config-based fix must reach each worker itself.
    compile_settings_per_thread: Optional[bool] = None

    def hazards(self, including: Iterable[Hazard] = ()) -> frozenset:
        """The hazards this release can show (unknown counts as possible: advice errs on the safe side).

        Conditional hazards (Hazard.condition) are left out unless named in `including`: the caller knows the
        trainer meets the condition (a scan found a thread running its own FX trace)."""
        wanted = frozenset(including)
        found = set()
        if Hazard.PATCHER_RACE in wanted and self.fx_patches_isolated is not True:
            found.add(Hazard.PATCHER_RACE)
        if self.fx_flag_thread_local is not True:
            found |= {Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG}
        if self.backward_compile_takes_compile_lock is not False:
            found.add(Hazard.DEADLOCK)
        return frozenset(found)
