"""The mitigation registry: every fix dflash-doctor knows, declared once.

An entry says what the fix is (its CLI name and the call a trainer makes), which hazards it stops and what it
leaves open, what it costs, on which releases it applies, how repro and the reference pipeline apply it, and
which stresses repro must put it through before calling it holding. `repro --mitigation/--matrix`, `pipeline
--mitigation`, `guards`, `explain`, scan's mitigation-aware DFD201 and docs/mitigations.md all read it from here,
so they cannot disagree. Adding a fix is one entry below plus its runtime function (dflash_doctor/runtime).

What each fix did on an H200 (torch 2.11, three threads, cold cache) is in docs/races.md, "What held".
Importing this module never imports torch: the apply hooks import the runtime lazily.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, FrozenSet, Iterable, List, Optional, Tuple

from dflash_doctor.errors import UsageError
from dflash_doctor.hazards import STRESS_ORDER, Hazard, Release, Stress

NONE = "none"


def _setup_threadlocal_flag() -> dict:
    from dflash_doctor import runtime

    status = runtime.install_threadlocal_fx_flag()
    facts = {"shim": status.to_dict()}
    if status.state != "unknown-layout":
        ok, detail = runtime.verify_threadlocal_fx_flag()
        facts["shim_check"] = {"ok": ok, "detail": detail}
        if not ok:
            raise MitigationFailed("the thread-local FX-flag shim is installed but not effective: " + detail)
    else:
        raise MitigationFailed("this torch's FX module is not a layout the shim knows: " + status.detail)
    return facts


_NON_LAZY = "torch._functorch.config.force_non_lazy_backward_lowering"


def _setup_non_lazy_backward() -> dict:
    from dflash_doctor import runtime

    try:
        previous = runtime.enable_non_lazy_backward()
    except runtime.MitigationUnavailable as exc:
        raise MitigationFailed(str(exc)) from exc
    return {"non_lazy_backward_was": previous}


def _setup_isolate_fx_patches() -> dict:
    from dflash_doctor import runtime

    status = runtime.isolate_fx_patches()
    facts = {"fx_patches": status.to_dict()}
    if status.state == "unknown-layout":
        raise MitigationFailed("this torch's FX patcher is not a layout isolate-fx-patches knows: " + status.detail)
    ok, detail = runtime.verify_isolated_fx_patches()
    facts["fx_patches_check"] = {"ok": ok, "detail": detail}
    if not ok:
        raise MitigationFailed("isolate-fx-patches is installed but not effective: " + detail)
    return facts


def _single_thread_autograd() -> ContextManager[object]:
    from dflash_doctor import runtime

    return runtime.single_thread_autograd()


def _fx_trace_lock() -> ContextManager[object]:
    from dflash_doctor import runtime

    return runtime.fx_trace_lock()


def _wrap_first_call_lock(step: Callable) -> Callable:
    from dflash_doctor import runtime

    return runtime.first_call_lock(step)


def _wrap_global_lock(step: Callable) -> Callable:
    from dflash_doctor import runtime

    return runtime.global_lock(step)


def _read_setting(dotted: str) -> Callable[[], object]:
    def read() -> object:
        from dflash_doctor.runtime import thread_config

        return thread_config.read(dotted)

    return read


def _autograd_multithreading() -> object:
    import torch

    return torch.autograd.is_multithreading_enabled()


class Reach(str, enum.Enum):
    """Which threads a switch reaches once the fix is applied by its hook, on every release (the generated
    registry tests start real threads to prove it)."""

    LATER_THREADS = "every thread started after the set-up"  # setup: the calling thread and threads started later
    ENTERING_THREAD = "each thread that enters it"  # in_each_thread: that thread only, for as long as it is inside


class Serialises(str, enum.Enum):
    """What a step wrapper keeps from overlapping across threads (the generated tests measure the overlap)."""

    NOTHING = "nothing"
    FIRST_STEPS = "each thread's first step"
    EVERY_STEP = "every step"


@dataclass(frozen=True)
class Switch:
    """A value a fix switches: what it is, the value it takes, how the calling thread reads it, and which threads
    it reaches. `setting` is a dotted name; a compile setting (compile_settings.SETTINGS) is kept per thread from
    torch 2.12 on, so its fix must reach the workers through the thread-start hook or the per-thread form."""

    setting: str
    value: object
    read: Callable[[], object]
    reach: Reach


class MitigationFailed(RuntimeError):
    """A mitigation could not be applied here (no hook in this torch, a shim that did not take)."""


def _needs_global_flag(release: Release) -> Optional[str]:
    if release.fx_flag_thread_local:
        return "this release's FX flag is already thread-local (torch >= 2.14)"
    return None


def _needs_shared_patches(release: Release) -> Optional[str]:
    if release.fx_patches_isolated:
        return "this release already keeps torch.fx's patches to the tracing thread"
    if release_series(release.version) == "2.4":
        return "torch 2.4's _Patcher writes its patches itself, with nothing to redirect per thread (2.5 and later)"
    return None


def _needs_non_lazy_flag(release: Release) -> Optional[str]:
    if release.non_lazy_backward_available is False:
        return "this release has no torch._functorch.config.force_non_lazy_backward_lowering (added in 2.10)"
    return None


@dataclass(frozen=True)
class Mitigation:
    """One fix. Tuples of text are checked at import (a bare string would pass for a tuple of characters)."""

    name: str  # the CLI name: `--mitigation NAME`
    summary: str  # one line for --help, tables and docs
    api: str  # what a trainer writes to apply it
    covers: FrozenSet[Hazard]  # what it stops while it holds
    caveats: Tuple[str, ...]  # what it leaves open
    cost: str
    # The stresses repro must apply before the fix may be called holding: natural and amplified always; a fix that
    # claims to stop the FX-flag leak also faces the forced leak and the stuck flag.
    claims_flag_safety: bool = False
    recommended: bool = True  # False: measured, and documented as not a fix
    unavailable: Callable[[Release], Optional[str]] = lambda release: None  # why it cannot apply on a release
    # How repro's child and the reference pipeline apply it (exactly one kind each). `setup` and `in_each_thread`
    # need nothing of the user's code, so `run --fix` can apply them to an unmodified trainer; the others cannot.
    setup: Optional[Callable[[], dict]] = None  # process-wide, before any compile wrapper exists; returns facts
    wrap_step: Optional[Callable[[Callable], Callable]] = None  # wraps each worker's step
    # Entered by each worker thread around all of its steps (a thread-local switch such as single-threaded
    # autograd): repro's child and the pipeline enter it in every worker, `run --fix` through a thread-start hook.
    in_each_thread: Optional[Callable[[], ContextManager[object]]] = None
    # Entered by a thread that runs its own FX trace (a profiler's symbolic_trace) around each trace, for a fix
    # that needs the tracing thread's help (a lock it shares with the workers): repro's foreign-trace stress and
    # the pipeline's --tracing-thread enter it. Not an apply kind: the fix is applied by its own hook.
    around_foreign_trace: Optional[Callable[[], ContextManager[object]]] = None
    warm_up: bool = False  # every worker's step runs once, serially, before the workers start
    separate_processes: bool = False  # one process per worker instead of threads
    # Names a trainer's source contains once it applies the fix (scan's mitigation-aware DFD201 reads them).
    source_markers: Tuple[str, ...] = ()
    solo: bool = False  # combines with nothing else
    # The fix that completes this one (and why), stated as data so advice can tell when the pairing is met or moot.
    pair_with: Optional[str] = None
    pair_reason: str = ""
    # What it claims, proved by tests generated from this registry (tests/test_mitigation_registry.py): the values
    # it switches and which threads they reach, and what its step wrapper serialises.
    switches: Tuple[Switch, ...] = ()
    serialises: Serialises = Serialises.NOTHING

    def __post_init__(self) -> None:
        for field_name in ("caveats", "source_markers", "switches"):
            if not isinstance(getattr(self, field_name), tuple):
                raise TypeError(f"mitigation {self.name}: {field_name} must be a tuple of strings")

    def pairing_caveat(self) -> str:
        """"" when the fix needs no partner."""
        return f"{self.pair_reason}: pair it with {self.pair_with}" if self.pair_with else ""

    @property
    def applies_without_code_change(self) -> bool:
        """`run --fix` can apply it to an unmodified command: a process-wide set-up or a per-thread switch."""
        return self.setup is not None or self.in_each_thread is not None

    @property
    def ladder(self) -> Tuple[Stress, ...]:
        """Natural and amplified always; forced and stuck for a fix claiming flag safety; the foreign trace for
        one that claims to stop the patcher race."""
        extra = (Stress.FORCED, Stress.STUCK) if self.claims_flag_safety else ()
        foreign = (Stress.FOREIGN_TRACE,) if Hazard.PATCHER_RACE in self.covers else ()
        return (Stress.NATURAL, Stress.AMPLIFIED) + extra + foreign

    @property
    def leaves_open(self) -> FrozenSet[Hazard]:
        return frozenset(Hazard) - self.covers


REGISTRY: Tuple[Mitigation, ...] = (
    Mitigation(
        name="first-call-lock",
        summary="serialise each thread's first step (the seeds' _exec_lock); NOT a fix",
        api="step = dflash_doctor.runtime.first_call_lock(step)",
        covers=frozenset(),
        caveats=("a warm thread keeps calling compiled code while another thread compiles, so the FX flag still "
                 "leaks into it",
                 "a new shape or a recompile after the first step compiles outside the lock"),
        cost="the first steps run one after another",
        recommended=False,
        wrap_step=_wrap_first_call_lock,
        source_markers=("first_call_lock",),
        serialises=Serialises.FIRST_STEPS,
    ),
    Mitigation(
        name="global-lock",
        summary="hold one process-wide lock around every step (and around your own FX traces: fx_trace_lock)",
        api="step = dflash_doctor.runtime.global_lock(step); a thread tracing with torch.fx: "
            "`with dflash_doctor.runtime.fx_trace_lock(): torch.fx.symbolic_trace(m)`",
        covers=frozenset({Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG, Hazard.DEADLOCK, Hazard.IS_COMPILING_LEAK,
                          Hazard.PATCHER_RACE}),
        caveats=("the workers stop overlapping: throughput of one worker",
                 "an FX trace outside the locked step (your own symbolic_trace, another library's Tracer) still "
                 "leaks the FX flag and patches nn.Module for every thread unless that thread holds "
                 "dflash_doctor.runtime.fx_trace_lock() (the same lock) around it"),
        cost="60 steps of 3 threads took 15.8 s under the lock against 0.27 s after a warm-up (H200, torch 2.11); "
             "a tracing thread waits for the steps too",
        wrap_step=_wrap_global_lock,
        serialises=Serialises.EVERY_STEP,
        around_foreign_trace=_fx_trace_lock,
        source_markers=("global_lock", "fx_trace_lock"),
    ),
    Mitigation(
        name="warmup",
        summary="run every shape's forward and backward in one thread before the workers start",
        api="dflash_doctor.runtime.warmup([step_for_shape_and_device, ...])",
        covers=frozenset({Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG, Hazard.DEADLOCK, Hazard.IS_COMPILING_LEAK}),
        caveats=("a shape, device or dtype not warmed up, a recompile (guard failure, dynamic shapes) or a "
                 "cleared compile cache reopens the race",
                 "every shape must be known before the workers start",
                 "an FX trace outside the compiles (your own symbolic_trace, another library) still leaks"),
        cost="a serial warm-up per process (15.6 s for 3 GPUs of compiled flex_attention, H200, torch 2.11)",
        warm_up=True,
        source_markers=("warmup",),
    ),
    Mitigation(
        name="threadlocal-flag",
        summary="make the FX-tracing flag thread-local (stops the leak and the stuck flag, not the deadlock)",
        api="dflash_doctor.runtime.install_threadlocal_fx_flag()",
        covers=frozenset({Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG}),
        caveats=("call it before any torch.compile wrapper exists: wrappers created earlier keep reading the global "
                 "flag",),
        cost="none measurable: one thread-local read per compiled call",
        claims_flag_safety=True,
        pair_with="non-lazy-backward",
        pair_reason="alone it leaves the compile-lock / autograd deadlock",
        unavailable=_needs_global_flag,
        setup=_setup_threadlocal_flag,
        source_markers=("install_threadlocal_fx_flag",),
    ),
    Mitigation(
        name="non-lazy-backward",
        summary="compile the backward with the forward: torch._functorch.config.force_non_lazy_backward_lowering "
                "in every thread that compiles (stops the deadlock, not the leak)",
        api="dflash_doctor.runtime.enable_non_lazy_backward()  # before the workers start: this thread and every "
            "thread started later; a thread already running: `with "
            "dflash_doctor.runtime.non_lazy_backward_in_thread(): ...`",
        covers=frozenset({Hazard.DEADLOCK}),
        caveats=("torch 2.12 and later keep compile settings per thread: a plain `torch._functorch.config."
                 "force_non_lazy_backward_lowering = True` in the main thread leaves every worker compiling its "
                 "backward lazily; enable_non_lazy_backward() also sets it in threads started after it, "
                 "non_lazy_backward_in_thread() in a thread already running",),
        pair_with="threadlocal-flag",
        pair_reason="alone it turns the deadlock into the FX RuntimeError where the flag is a module global "
                    "(torch < 2.14): the longer compile leaks the flag into warm threads",
        cost="a longer first step: the backward compiles before it is needed",
        unavailable=_needs_non_lazy_flag,
        setup=_setup_non_lazy_backward,
        source_markers=("enable_non_lazy_backward", "non_lazy_backward_in_thread",
                        "force_non_lazy_backward_lowering"),
        switches=(Switch(_NON_LAZY, True, _read_setting(_NON_LAZY), Reach.LATER_THREADS),),
    ),
    Mitigation(
        name="single-thread-autograd",
        summary="run each worker's backward on the worker itself: torch.autograd.set_multithreading_enabled(False) "
                "entered in every worker thread (stops the deadlock, not the leak; any torch >= 2.0)",
        api="with dflash_doctor.runtime.single_thread_autograd(): ...  # in each worker thread, around its steps",
        covers=frozenset({Hazard.DEADLOCK}),
        caveats=("the switch is thread-local: enter it in every thread that calls backward; a call in the main "
                 "thread covers no worker",
                 "a backward whose graph spans several devices runs them one after another on the calling "
                 "thread instead of on each device's autograd thread"),
        cost="none measurable in the plain loop: 146 / 138 / 275 steps/s per thread against 233 / 138 / 136 for "
             "threadlocal-flag,non-lazy-backward and 78 / 79 / 88 under one global lock (H200, torch 2.11, one "
             "run each)",
        pair_with="threadlocal-flag",
        pair_reason="alone it leaves the FX-flag leak where the flag is a module global (torch < 2.14): a warm "
                    "thread still raised the FX error while another thread compiled (H200, torch 2.11, 2 of 2)",
        in_each_thread=_single_thread_autograd,
        source_markers=("set_multithreading_enabled", "single_thread_autograd"),
        switches=(Switch("torch.autograd.is_multithreading_enabled()", False, _autograd_multithreading,
                         Reach.ENTERING_THREAD),),
    ),
    Mitigation(
        name="isolate-fx-patches",
        summary="keep torch.fx's nn.Module patches and CURRENT_PATCHER to the tracing thread (stops the patcher "
                "race only)",
        api="dflash_doctor.runtime.isolate_fx_patches()",
        covers=frozenset({Hazard.PATCHER_RACE}),
        caveats=("call it before any thread starts tracing: a trace already running keeps its process-wide "
                 "patches until it ends",
                 "two threads tracing at once each get their own patcher, but torch.fx keeps other state per "
                 "process (the FX flag: threadlocal-flag)",
                 "math's functions are left unpatched (a module's globals are shared by every thread, and another "
                 "thread's compile reading math.sqrt broke on a patch there): in the tracing thread math.f(proxy) "
                 "raises instead of being recorded",
                 "nn.Module.__call__ and __getattr__ hold the dispatcher from install on, for the whole run (a "
                 "compile in another thread broke when they came and went with each trace): every compile sees it "
                 "as nn.Module.__call__"),
        cost="every eager module call and module attribute lookup goes through a dispatcher from install on "
             "(+1.7 us per nn.Linear(8, 8) call and +0.2 us per attribute lookup with no trace running, +5.5 us and "
             "+1.0 us while another thread traces, on the 2-core box: benchmarks/results/fx_patches.md)",
        unavailable=_needs_shared_patches,
        setup=_setup_isolate_fx_patches,
        source_markers=("isolate_fx_patches",),
    ),
    Mitigation(
        name="processes",
        summary="run each worker in a process of its own (own Dynamo and FX state)",
        api="torch.multiprocessing workers instead of threads (dflash-doctor pipeline --workers processes)",
        covers=frozenset({Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG, Hazard.DEADLOCK, Hazard.IS_COMPILING_LEAK,
                          Hazard.PATCHER_RACE}),
        caveats=("the hand-off between workers needs IPC (CUDA IPC on one GPU, NCCL across GPUs)",
                 "a tracing thread inside a worker's process still races with that worker: run your own FX "
                 "tracing in a process of its own"),
        cost="one CUDA context and one compile per worker, more host memory",
        claims_flag_safety=True,
        separate_processes=True,
        solo=True,
        source_markers=(),
    ),
)

BY_NAME: Dict[str, Mitigation] = {m.name: m for m in REGISTRY}
NAMES: Tuple[str, ...] = tuple(m.name for m in REGISTRY)


@dataclass(frozen=True)
class Combination:
    """A ranked choice of fixes for the unconditional hazards, in the order advice prefers them, with where it
    was measured. `recommend` keeps only the parts a release needs and adds the fix for any conditional hazard
    the caller names, so one entry serves every release."""

    names: Tuple[str, ...]
    measured_on: Tuple[str, ...] = ()  # the releases (major.minor) whose runs showed exactly these parts holding
    measured_where: str = ""  # the machine and the run, for the evidence line
    why: str = ""


# Preference when several fixes cover what a release needs: keep the workers concurrent first, then the cheap
# warm-up (breaks on a new shape), then serialising, then a rewrite into processes. What each measurement was:
# docs/races.md ("What held", "Single-threaded autograd").
COMBINATIONS: Tuple[Combination, ...] = (
    Combination(("threadlocal-flag", "non-lazy-backward"), ("2.11",), "H200",
                "the only configuration in which three threads compiled flex_attention concurrently in repro's "
                "replay with no error and no hang"),
    Combination(("threadlocal-flag", "single-thread-autograd"), ("2.11",), "H200",
                "held every case of the plain loop tried (same and different shapes, amplified, a warm thread "
                "beside a compiling one); the only concurrent deadlock fix where non-lazy backward does not exist "
                "(2.6-2.9)"),
    Combination(("warmup",), ("2.11",), "H200", "held in repro's matrix"),
    Combination(("global-lock",), ("2.11",), "H200", "held in repro's matrix"),
    Combination(("processes",), ("2.11",), "H200", "held in repro's matrix"),
)
# The --matrix rows: the baseline, every fix alone, then every ranked combination of several fixes.
MATRIX: Tuple[Tuple[str, ...], ...] = ((),) + tuple((name,) for name in NAMES) + tuple(
    c.names for c in COMBINATIONS if len(c.names) > 1)


# The advice that is not a mitigation (no hook, nothing repro applies): guards ranks it first when a live state
# calls for it (guards/ranking.py), and the DFD6xx rules take their fix texts from it.
class FixKind(str, enum.Enum):
    """What a ranked fix is, as `guards` lists them (facts.fixes[].kind): the words its JSON has always had."""

    MITIGATION = "mitigation"  # one or more registry entries (guards/ranking.py)
    UPGRADE = "upgrade"  # a torch release without the hazard
    RESTART = "restart"  # the flag is stuck: only a new process clears it
    RESTORE_CONFIG = "restore-config"  # a changed Dynamo setting put back


@dataclass(frozen=True)
class Advice:
    kind: FixKind
    fix: str
    cost: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "fix": self.fix, "cost": self.cost}


RESTART = Advice(
    FixKind.RESTART,
    "Restart the process: its FX-tracing flag is stuck True and never clears, so every compiled call raises.",
    "the process's in-memory state (resume from the last checkpoint)",
)
RESTORE_CONFIG = Advice(
    FixKind.RESTORE_CONFIG,
    "Set torch._dynamo.config.error_on_nested_fx_trace = True and force_compile_during_fx_trace = False (the "
    "defaults) by removing the assignments that changed them, in every thread that made one (from torch 2.12 each "
    "thread keeps its own value: resetting them in main leaves a worker's own change in place), then remove the "
    "race with one of the fixes below.",
    "none; the race raises again instead of silently running uncompiled code (for flex_attention: the dense path "
    "that materialises QK^T and can run out of memory)",
)
def get(name: str) -> Mitigation:
    return BY_NAME[name]


def label(names: Iterable[str]) -> str:
    names = tuple(names)
    return ",".join(names) if names else NONE


def parse(text: str) -> Tuple[str, ...]:
    """`threadlocal-flag,non-lazy-backward` -> ('threadlocal-flag', 'non-lazy-backward'); 'none' -> ()."""
    names = [part.strip().lower() for part in str(text).split(",") if part.strip()]
    unknown = [name for name in names if name != NONE and name not in BY_NAME]
    if unknown or not names:
        raise UsageError(f"unknown mitigation {', '.join(unknown) or repr(text)}; choose from "
                         f"{', '.join((NONE,) + NAMES)} (combine with commas)")
    if NONE in names:
        if len(names) > 1:
            raise UsageError("mitigation 'none' cannot be combined with others")
        return ()
    ordered = tuple(name for name in NAMES if name in names)
    solo = [name for name in ordered if BY_NAME[name].solo]
    if solo and len(ordered) > 1:
        raise UsageError(f"'{solo[0]}' replaces threads; it does not combine with thread mitigations")
    return ordered


def ladder(names: Iterable[str]) -> Tuple[Stress, ...]:
    """The stresses a combination must survive: the union of its parts' ladders (the baseline gets them all)."""
    names = tuple(names)
    if not names:
        return STRESS_ORDER
    wanted = {stress for name in names for stress in BY_NAME[name].ladder}
    return tuple(stress for stress in STRESS_ORDER if stress in wanted)


def covers(names: Iterable[str]) -> FrozenSet[Hazard]:
    return frozenset(h for name in names for h in BY_NAME[name].covers)


def help_text() -> str:
    """The --mitigation option's help, for every command that takes one."""
    return ("none, " + ", ".join(NAMES) + "; combine with commas (threadlocal-flag,non-lazy-backward). "
            "`dflash-doctor explain mitigations` says what each stops and leaves open.")


MEASURED, INFERRED = "measured", "inferred"


@dataclass(frozen=True)
class Recommendation:
    mitigations: Tuple[str, ...]
    covers: FrozenSet[Hazard]
    gaps: FrozenSet[Hazard]  # hazards of the release this one leaves open
    caveats: Tuple[str, ...]
    api: Tuple[str, ...]
    cost: str
    evidence: str = INFERRED  # MEASURED: these exact parts were run on this release; INFERRED otherwise
    evidence_detail: str = ""

    @property
    def label(self) -> str:
        return label(self.mitigations)

    @property
    def complete(self) -> bool:
        """Leaves no severe hazard open (a minor one, the is-compiling leak, is named in `gaps` but does not
        count against it)."""
        return not any(not hazard.minor for hazard in self.gaps)

    @property
    def evidence_label(self) -> str:
        """`measured (2.11, H200)` or `inferred`, as guards and the docs show it."""
        return self.evidence_detail if self.evidence == MEASURED else INFERRED

    def to_dict(self) -> dict:
        return {"mitigation": self.label, "covers": sorted(h.value for h in self.covers),
                "gaps": sorted(h.value for h in self.gaps), "caveats": list(self.caveats), "api": list(self.api),
                "cost": self.cost, "complete": self.complete, "evidence": self.evidence,
                "evidence_label": self.evidence_label, "evidence_detail": self.evidence_detail}


def _ordered(names: Iterable[str]) -> Tuple[str, ...]:
    wanted = set(names)
    return tuple(name for name in NAMES if name in wanted)


def _fix_for(hazard: Hazard, release: Release) -> Optional[str]:
    """The narrowest recommended fix for a conditional hazard that applies on `release` (isolate-fx-patches for
    the patcher race): what a combination gains when the caller says the trainer meets the condition."""
    usable = [m for m in REGISTRY if m.recommended and hazard in m.covers and not m.solo
              and m.unavailable(release) is None]
    return min(usable, key=lambda m: len(m.covers)).name if usable else None


def recommend(hazards: Iterable[Hazard], release: Release = Release()) -> List[Recommendation]:
    """Fixes for `hazards` on `release`, complete ones first, each with what it leaves open.

    A combination keeps only the parts the release needs (no shim where the flag is already thread-local, no
    deadlock fix where the backward compile takes no lock) and drops parts the release lacks. A conditional
    hazard (Hazard.condition) in `hazards` adds its narrowest fix to every combination that leaves it open:
    pass Hazard.PATCHER_RACE when the trainer has a thread running its own FX trace. `first-call-lock` is never
    recommended.
    """
    needed = frozenset(hazards)
    if not needed:
        return []
    recommendations: List[Recommendation] = []
    seen = set()
    for combination in COMBINATIONS:
        parts = combination.names
        usable = tuple(name for name in parts if BY_NAME[name].unavailable(release) is None
                       and (len(parts) == 1 or BY_NAME[name].covers & needed))
        if not usable:
            continue
        for hazard in sorted(needed - covers(usable), key=list(Hazard).index):
            extra = _fix_for(hazard, release) if hazard.conditional else None
            if extra is not None and not any(BY_NAME[name].solo for name in usable):
                usable += (extra,)
        usable = _ordered(usable)
        if usable in seen:
            continue
        seen.add(usable)
        recommendations.append(_recommendation(usable, needed, release, combination))
    recommendations.sort(key=lambda r: (not r.complete, sum(not h.minor for h in r.gaps)))
    return recommendations


def covering(hazards: Iterable[Hazard], release: Release = Release()) -> Optional[Recommendation]:
    """The best complete recommendation that stops every hazard in `hazards` (those a baseline reproduced, plus
    whatever else the release needs, as the caller passes them). A ranked combination that covers them all wins;
    where none does (a hazard no combination was built for), the best one is completed with the narrowest
    recommended fix for each hazard it leaves open, and reads inferred. None when nothing in the registry covers
    them (no fix applies on this release)."""
    needed = frozenset(hazards)
    if not needed:
        return None
    ranked = recommend(needed, release)
    whole = [r for r in ranked if r.complete and needed <= r.covers | frozenset(h for h in needed if h.minor)]
    if whole:
        return whole[0]
    for base in ranked:
        names = base.mitigations
        if any(BY_NAME[name].solo for name in names):
            continue
        for hazard in sorted(needed - covers(names), key=list(Hazard).index):
            usable = [m for m in REGISTRY if m.recommended and hazard in m.covers and not m.solo
                      and m.unavailable(release) is None]
            if usable:
                names += (min(usable, key=lambda m: len(m.covers)).name,)
        names = _ordered(names)
        if not needed - covers(names) - frozenset(h for h in needed if h.minor):
            return _recommendation(names, needed, release, Combination(names))
    return None


def _recommendation(names: Tuple[str, ...], needed: FrozenSet[Hazard], release: Release,
                    combination: Combination) -> Recommendation:
    entries = [BY_NAME[name] for name in names]
    covered = covers(names)
    caveats = tuple(c for entry in entries for c in entry.caveats) + tuple(
        entry.pairing_caveat() for entry in entries if _pairing_needed(entry, names, needed)) + open_conditions(
        names, release)
    evidence, detail = _evidence(names, release, combination, needed)
    return Recommendation(names, covered & needed, needed - covered, caveats, tuple(e.api for e in entries),
                          "; ".join(e.cost for e in entries), evidence, detail)


def _evidence(names: Tuple[str, ...], release: Release, combination: Combination,
              needed: FrozenSet[Hazard]) -> Tuple[str, str]:
    """Measured only where these exact parts ran on this release against these hazards (the measurements had no
    thread running its own FX trace, so a conditional hazard makes it inferred); otherwise inferred from the
    measurement of the combination it derives from and this release's traits."""
    from_release = release_series(release.version)
    if names == combination.names and from_release in combination.measured_on and not any(
            h.conditional for h in needed):
        return MEASURED, f"measured ({from_release}, {combination.measured_where})"
    ran = "; ".join(f"{r}, {combination.measured_where}" for r in combination.measured_on)
    source = f"{label(combination.names)} measured ({ran})" if ran else "not measured"
    return INFERRED, f"inferred from {source} and this release's traits"


def release_series(version: Optional[str]) -> Optional[str]:
    """'2.11.0+cu130' -> '2.11'."""
    parts = (version or "").split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and all(p.isdigit() for p in parts[:1]) else None


def _pairing_needed(entry: Mitigation, names: Tuple[str, ...], needed: FrozenSet[Hazard]) -> bool:
    """Met when the partner is in the recommendation; moot where the partner stops nothing this release needs
    (torch 2.4 and 2.5 have no compile-lock deadlock for non-lazy-backward to stop)."""
    partner = BY_NAME.get(entry.pair_with or "")
    return partner is not None and partner.name not in names and bool(partner.covers & needed)


def open_conditions(names: Iterable[str], release: Release = Release()) -> Tuple[str, ...]:
    """A caveat for each conditional hazard a fix (or combination) leaves open on `release`, naming when it
    bites, what it looks like and the fixes in the registry that stop it, so no fix is read as covering it."""
    names = tuple(names)
    covered = covers(names)
    lines = []
    for hazard in Hazard:
        if not hazard.conditional or hazard in covered or hazard not in release.hazards(including=(hazard,)):
            continue
        fixes = [m.name for m in REGISTRY if m.recommended and hazard in m.covers]
        lines.append(f"it leaves the {hazard.label} open: where {hazard.condition}, {hazard.symptom}"
                     + (f" (stopped by {', '.join(fixes)})" if fixes else ""))
    return tuple(lines)


def fix_text(*hazards: Hazard, release: Release = Release()) -> str:
    """A rule's fix, in the registry's words: the complete recommendations for `hazards`, best first. A severe
    hazard brings every other severe hazard the release can have along, because a fix for one that opens another
    (non-lazy backward alone turning the deadlock into the FX error) is no fix. A conditional hazard is advised on
    only when named (Hazard.PATCHER_RACE for a trainer with a thread running its own FX trace); every fix listed
    names the hazards it leaves open."""
    needed = set(hazards)
    if any(not h.minor for h in needed):
        needed |= {h for h in release.hazards(including=needed) if not h.minor}
    ranked = [r for r in recommend(needed, release) if r.complete]
    listed = "; ".join(f"{r.label} ({'; '.join(BY_NAME[n].summary for n in r.mitigations)}"
                       + (f"; leaves open: {_open_titles(r.mitigations, release)}"
                          if _open_titles(r.mitigations, release) else "") + ")" for r in ranked)
    return f"One of, best first: {listed}. `dflash-doctor guards` ranks them for the installed release."


def _open_titles(names: Tuple[str, ...], release: Release) -> str:
    """The severe hazards a combination leaves open that it was not asked about: conditional ones, by name."""
    covered = covers(names)
    # The condition's first clause is enough here ("a thread runs its own torch.fx trace"); the caveats say more.
    return ", ".join(f"the {h.label} (where {(h.condition or '').split(' (')[0]})" for h in Hazard
                     if h.conditional and h not in covered and h in release.hazards(including=(h,)))


def caveats_for(names: Iterable[str], release: Release = Release()) -> Tuple[str, ...]:
    """What a fix, or a combination, leaves open as applied: a pairing unless the partner is part of it, every
    conditional hazard it does not stop, then each part's caveats. The races it leaves open come first: they say
    why a failing fix failed; how to apply it right (per thread from 2.12, say) follows."""
    names = tuple(names)
    entries = [BY_NAME[name] for name in names]
    return tuple(entry.pairing_caveat() for entry in entries if entry.pair_with and entry.pair_with not in names) + \
        open_conditions(names, release) + tuple(c for entry in entries for c in entry.caveats)


def in_each_thread(names: Iterable[str]) -> Callable[[], ContextManager[object]]:
    """One context manager factory entering every per-thread switch of `names` (each worker enters it around
    all of its steps; nothing when none of them has one)."""
    factories = [BY_NAME[name].in_each_thread for name in names if BY_NAME[name].in_each_thread is not None]
    return _entering(factories)


def around_foreign_trace(names: Iterable[str]) -> Callable[[], ContextManager[object]]:
    """What a thread running its own FX trace enters around each trace under `names` (the shared lock of
    global-lock; nothing for the other fixes)."""
    factories = [BY_NAME[name].around_foreign_trace for name in names
                 if BY_NAME[name].around_foreign_trace is not None]
    return _entering(factories)


def _entering(factories) -> Callable[[], ContextManager[object]]:
    import contextlib

    def enter_all() -> ContextManager[object]:
        stack = contextlib.ExitStack()
        for factory in factories:
            stack.enter_context(factory())
        return stack

    return enter_all


__all__ = ["BY_NAME", "COMBINATIONS", "MATRIX", "Combination", "INFERRED", "MEASURED", "NAMES", "NONE", "REGISTRY",
           "RESTART", "RESTORE_CONFIG", "Advice", "Mitigation", "MitigationFailed", "Reach", "Serialises", "Switch",
           "Recommendation", "around_foreign_trace", "caveats_for", "covering", "covers",
           "fix_text", "get", "help_text", "in_each_thread", "label", "ladder", "open_conditions", "parse",
           "recommend", "release_series"]
