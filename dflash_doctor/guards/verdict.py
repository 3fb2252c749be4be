"""A verdict per hazard, each decided from the source that was read (file:line) and, where probes ran, from them;
then the headline, which is the worst of them.

A hazard is `present`, `absent` or `unknown` (the source did not say and no probe settled it: reported, never
guessed). The headline is `vulnerable` when any hazard is present, `unknown` when none is present but one is
unknown, and `safe` only when every hazard is absent. A conditional hazard (Hazard.condition: the FX patcher
race needs a thread running its own FX trace) is decided and reported like the others, but the headline is
about the hazards every threaded trainer meets, so it is left out of it. docs/guards-releases.md shows what each
release decides.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from dflash_doctor.guards.backward import BackwardCompile
from dflash_doctor.guards.layout import MODULE_GLOBAL, THREAD_LOCAL, Layout
from dflash_doctor.guards.probes import PROBES
from dflash_doctor.outcomes import ProbeOutcome
from dflash_doctor.guards.releases import ReleaseRow
from dflash_doctor.hazards import Hazard, Release

PRESENT, ABSENT, UNKNOWN = "present", "absent", "unknown"
VULNERABLE, SAFE = "vulnerable", "safe"
# The headline names the worst present hazard: a silent hang first, then a process that can never run compiled
# code again, then the error, then the changed code path.
WORST_FIRST = (Hazard.DEADLOCK, Hazard.STUCK_FLAG, Hazard.FX_FLAG_LEAK, Hazard.PATCHER_RACE,
               Hazard.IS_COMPILING_LEAK)


@dataclass(frozen=True)
class Citation:
    file: str
    line: int
    what: str  # the name that line holds (the flag, `compile_lock`, the raise...)

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "what": self.what}


@dataclass(frozen=True)
class HazardVerdict:
    hazard: Hazard
    state: str  # present | absent | unknown
    reason: str
    cited: Tuple[Citation, ...] = ()
    probe: Optional[str] = None  # the outcome of the probe that tests this hazard, when one ran

    def to_dict(self) -> dict:
        return {"hazard": self.hazard.value, "title": self.hazard.label, "state": self.state, "reason": self.reason,
                "cited": [c.to_dict() for c in self.cited], "probe": self.probe,
                "condition": self.hazard.condition}


@dataclass(frozen=True)
class Evidence:
    """What the hazard decisions read; the same rules decide a layout read now and a row of the release table."""

    fx_flag_storage: str
    fx_flag_restores: Optional[bool]
    compiling_flag_storage: Optional[str]
    compile_sets_compiling_flag: Optional[bool]
    backward_takes_lock: Optional[bool]
    lazy_backward: Optional[bool]
    lock_holder: Optional[bool]  # a Dynamo compile holds the same lock
    fx_patches_isolated: Optional[bool] = None  # torch.fx's patches kept to the tracing thread (patcher.py)


def evidence_of(layout: Layout) -> Evidence:
    backward = layout.backward
    return Evidence(
        fx_flag_storage=layout.fx_flag_storage,
        fx_flag_restores=layout.fx_flag.restores_saved_value if layout.fx_flag else None,
        compiling_flag_storage=layout.compiling_flag.storage if layout.compiling_flag else None,
        compile_sets_compiling_flag=layout.compile_sets_compiling_flag,
        backward_takes_lock=backward.takes_lock, lazy_backward=backward.lazy_backward,
        lock_holder=True if backward.holder is not None else None,
        fx_patches_isolated=layout.fx_patches.isolated,
    )


def evidence_of_row(row: ReleaseRow) -> Evidence:
    """A release table row as evidence (every row's Dynamo compile holds compile_lock)."""
    return Evidence(fx_flag_storage=row.fx_flag_storage, fx_flag_restores=row.fx_flag_restores_saved_value,
                    compiling_flag_storage=row.compiling_flag_storage,
                    compile_sets_compiling_flag=row.compile_sets_compiling_flag,
                    backward_takes_lock=row.backward_compile_takes_compile_lock, lazy_backward=row.lazy_backward,
                    lock_holder=True, fx_patches_isolated=row.fx_patches_isolated)


def source_states(evidence: Evidence) -> Dict[Hazard, str]:
    """Each hazard's state from the source alone."""
    return {
        Hazard.FX_FLAG_LEAK: _by_storage(evidence.fx_flag_storage, PRESENT),
        Hazard.STUCK_FLAG: _by_storage(evidence.fx_flag_storage,
                                       _known(evidence.fx_flag_restores, PRESENT, ABSENT)),
        Hazard.IS_COMPILING_LEAK: _by_storage(evidence.compiling_flag_storage or "",
                                              _known(evidence.compile_sets_compiling_flag, PRESENT, ABSENT)),
        Hazard.DEADLOCK: _deadlock(evidence),
        Hazard.PATCHER_RACE: _known(evidence.fx_patches_isolated, ABSENT, PRESENT),
    }


def _by_storage(storage: str, if_global: str) -> str:
    return {MODULE_GLOBAL: if_global, THREAD_LOCAL: ABSENT}.get(storage, UNKNOWN)


def _known(value: Optional[bool], if_true: str, if_false: str) -> str:
    return UNKNOWN if value is None else if_true if value else if_false


def _deadlock(evidence: Evidence) -> str:
    if evidence.backward_takes_lock is False or evidence.lazy_backward is False:
        return ABSENT  # either half of the cycle missing breaks it
    if evidence.backward_takes_lock and evidence.lazy_backward and evidence.lock_holder:
        return PRESENT
    return UNKNOWN


def present_hazards(evidence: Evidence) -> frozenset:
    return frozenset(h for h, state in source_states(evidence).items() if state == PRESENT)


def advised_hazards(verdicts: Sequence["HazardVerdict"]) -> frozenset:
    """The hazards the ranked fixes are for: every one not absent, but no conditional one (the patcher race is in
    each fix's caveats and its own hazard entry's fixes, not in every combination)."""
    return frozenset(v.hazard for v in verdicts if v.state != ABSENT and not v.hazard.conditional)


def advised_present(evidence: Evidence) -> frozenset:
    """`present_hazards` without the conditional ones: what the upgrade advice compares between releases."""
    return frozenset(h for h in present_hazards(evidence) if not h.conditional)


def release_of(layout: Layout) -> Release:
    """The release traits the mitigation registry's advice reads, from the source alone."""
    storage = layout.fx_flag_storage
    return Release(version=layout.torch_version,
                   fx_flag_thread_local={MODULE_GLOBAL: False, THREAD_LOCAL: True}.get(storage),
                   non_lazy_backward_available=layout.backward.non_lazy_available,
                   backward_compile_takes_compile_lock=layout.backward.takes_lock,
                   fx_patches_isolated=layout.fx_patches.isolated,
                   compile_settings_per_thread=layout.compile_settings.per_thread)


def decide_hazards(layout: Layout, probes: Mapping[str, Optional[str]],
                   fx_flag_now: Optional[bool]) -> Tuple[HazardVerdict, ...]:
    """One verdict per hazard (in the Hazard enum's order): the source decides, a probe or the live flag can add."""
    states = source_states(evidence_of(layout))
    probe_of = {probe.hazard: probe.name for probe in PROBES}
    verdicts = []
    for hazard in Hazard:
        state, reason, cited = states[hazard], *_source_reason(hazard, states[hazard], layout)
        probe_name = probe_of.get(hazard)
        outcome = probes.get(probe_name) if probe_name else None
        if outcome == ProbeOutcome.REPRODUCED:
            if state != PRESENT:
                reason = f"the source says {state} ({reason}), but the live probe reproduced it: a patched build?"
            else:
                reason += f"; the probe {probe_name} reproduced it"
            state = PRESENT
        elif outcome == ProbeOutcome.NOT_REPRODUCED:
            if state == UNKNOWN:
                state, reason = ABSENT, f"the probe {probe_name} did not reproduce it ({reason})"
            elif state == PRESENT:
                reason += f"; the probe {probe_name} did not reproduce it"
        if hazard is Hazard.STUCK_FLAG and fx_flag_now:
            state, reason = PRESENT, "the FX-tracing flag is True right now, outside any trace: this process is " \
                                     "already stuck; " + reason
        verdicts.append(HazardVerdict(hazard, state, reason, cited, outcome))
    return tuple(verdicts)


def _source_reason(hazard: Hazard, state: str, layout: Layout) -> Tuple[str, Tuple[Citation, ...]]:
    if hazard is Hazard.PATCHER_RACE:
        return _patcher_reason(state, layout)
    if hazard is Hazard.DEADLOCK:
        return _deadlock_reason(state, layout.backward)
    if hazard is Hazard.IS_COMPILING_LEAK:
        return _compiling_reason(state, layout)
    flag, guard = layout.fx_flag, layout.guard
    if flag is None or guard is None:
        return f"the source does not say where the FX-tracing flag lives: {layout.unknown_reason}", ()
    cited: Tuple[Citation, ...] = (Citation(guard.file, guard.line, "raise"), Citation(flag.file, flag.line, flag.name))
    shown = f"{flag.name}.{flag.attribute}" if flag.attribute else flag.name
    if flag.storage == THREAD_LOCAL:
        return f"the FX-tracing flag {shown} ({flag.file}:{flag.line}) is thread-local", cited[1:]
    if hazard is Hazard.FX_FLAG_LEAK:
        return (f"`{guard.predicate}()` in {guard.function} ({guard.file}:{guard.line}) reads {flag.name} "
                f"({flag.file}:{flag.line}), a module global: a trace in any thread makes every thread's compiled "
                "calls raise"), cited
    if state == ABSENT:
        return f"{flag.writer or 'its writer'} does not restore a saved value into {flag.name}", cited[1:]
    writer = (f"{flag.writer} ({flag.file}:{flag.writer_line})" if flag.writer and flag.writer_line
              else "Tracer.trace")
    cited = cited[1:] + ((Citation(flag.file, flag.writer_line, flag.name),) if flag.writer_line else ())
    return (f"{writer} saves, sets and restores the module global {flag.name}: two traces that exit out of "
            "order leave it True for good"), cited


def _patcher_reason(state: str, layout: Layout) -> Tuple[str, Tuple[Citation, ...]]:
    patches = layout.fx_patches
    patcher, writer = patches.patcher, patches.patcher_writer
    condition = f" (it bites only where {Hazard.PATCHER_RACE.condition})"
    if state == ABSENT and patcher is not None:
        return (f"torch.fx keeps its active patcher per thread ({patcher.what}, {patcher.file}:{patcher.line})",
                (Citation(patcher.file, patcher.line, patcher.what.split(".")[0]),))
    if state == PRESENT and patches.class_patches:
        first = patches.class_patches[0]
        cited = tuple(Citation(s.file, s.line, s.what) for s in patches.class_patches) + (
            (Citation(patcher.file, patcher.line, patcher.what),) if patcher else ()) + tuple(
            Citation(s.file, s.line, "NameError") for s in patches.name_errors)
        where = f", set by {writer.what} ({writer.file}:{writer.line})" if writer else ""
        kept = (f" and keeps its patcher in the module global {patcher.what} ({patcher.file}:{patcher.line}{where})"
                if patcher else "")
        errors = ", ".join(f"{s.file}:{s.line}" for s in patches.name_errors)
        return (f"Tracer.trace patches torch.nn.Module.{' and '.join(s.what for s in patches.class_patches)} on "
                f"the class ({first.file}:{first.line}){kept}: while one thread traces, other threads' eager module "
                "calls run the tracer's wrapper and raise NameError" + (f" ({errors})" if errors else "")
                + ", and overlapping traces restore each other's patches" + condition), cited
    missing = "; ".join(note for note in patches.notes if note.startswith("no "))
    return f"the source does not say: {missing or 'the FX patcher was not recognised'}", ()


def _compiling_reason(state: str, layout: Layout) -> Tuple[str, Tuple[Citation, ...]]:
    flag, masking = layout.compiling_flag, layout.masking
    if flag is None:
        return "the source does not say where torch.compiler.is_compiling()'s flag lives", ()
    cited = (Citation(flag.file, flag.line, flag.name),)
    where = f"{flag.name} ({flag.file}:{flag.line})"
    if flag.storage == THREAD_LOCAL:
        return f"is_compiling()'s flag {where} is thread-local", cited
    if masking is not None:
        return (f"{masking.function} ({masking.file}:{masking.line}) enters {masking.context}, which holds the "
                f"module global {where} True for the whole compile: every thread sees is_compiling()"), \
            cited + (Citation(masking.file, masking.line, masking.context.rsplit(".", 1)[-1]),)
    if state == ABSENT:
        return f"{where} is a module global, but no Dynamo compile sets it (only torch.export does)", cited
    return f"{where} is a module global; whether Dynamo compiles set it was not read", cited


def _deadlock_reason(state: str, backward: BackwardCompile) -> Tuple[str, Tuple[Citation, ...]]:
    compiler, lock, lazy, holder = backward.compiler, backward.lock, backward.lazy, backward.holder
    if state == ABSENT and backward.takes_lock is False and compiler is not None:
        return (f"the backward compiler {compiler.function} ({compiler.file}:{compiler.line}) takes no "
                "compile_lock, so the lazy backward compile cannot wait on a Dynamo compile"), \
            (Citation(compiler.file, compiler.line, compiler.function.rsplit(".", 1)[-1]),)
    if state == ABSENT:
        return "AOTAutograd compiles the backward with the forward: no lazy compile on the autograd thread", ()
    if state == PRESENT and lock and lazy and holder:
        path = " -> ".join(backward.path)
        return (f"the backward compile ({path}) takes compile_lock ({lock.file}:{lock.line}) and runs lazily at the "
                f"first backward ({lazy.function}, {lazy.file}:{lazy.line}), on the autograd device thread for GPU "
                f"tensors, while a Dynamo compile holds that lock ({holder.file}:{holder.line}) and can wait for "
                "that thread"), (Citation(lock.file, lock.line, "compile_lock"),
                                 Citation(lazy.file, lazy.line, "compiled_bw"),
                                 Citation(holder.file, holder.line, "compile_lock"))
    missing = "; ".join(note for note in backward.notes if "no " in note or "unknown" in note or "nothing" in note)
    return f"the source does not say: {missing or 'the backward compile path was not recognised'}", ()


def headline(verdicts: Sequence[HazardVerdict]) -> Tuple[str, Optional[Hazard]]:
    """(verdict, worst present hazard), over the hazards every threaded trainer can meet (not conditional ones)."""
    states = {v.hazard: v.state for v in verdicts if not v.hazard.conditional}
    worst = next((h for h in WORST_FIRST if states.get(h) == PRESENT), None)
    if worst is not None:
        return VULNERABLE, worst
    if any(state == UNKNOWN for state in states.values()):
        return UNKNOWN, None
    return SAFE, None


def verdict_reasons(verdicts: Sequence[HazardVerdict]) -> List[str]:
    """One line per hazard that is not absent, worst first (every hazard's line when all are absent)."""
    by_hazard = {v.hazard: v for v in verdicts}
    ordered = [by_hazard[h] for h in WORST_FIRST if h in by_hazard]
    shown = [v for v in ordered if v.state != ABSENT] or ordered
    return [f"{v.hazard.label}: {v.state}: {v.reason}" for v in shown]
