"""The stress ladder: which trials a repro runs, in which order, and what their results mean. Pure data.

Three kinds of row:
- the headline baseline (no mitigation, no matrix) *escalates*: every trial of a stress, then the next stress
  only if none reproduced, so the answer says at which level the race showed and how often;
- a baseline that *qualifies* mitigations runs every stress some row needs, each until it first reproduces:
  a mitigation's clean trials under a stress count only where the baseline reproduced under it;
- a mitigation row runs its whole ladder (mitigations.ladder) and stops at its first reproduction.

A mitigation `fails` when any stress broke it, `holds` when every stress of its ladder ran enough trials and the
baseline reproduced under each, and is `inconclusive` otherwise: never "held" against nothing.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from dflash_doctor import mitigations as registry
from dflash_doctor.findings import Problem
from dflash_doctor.hazards import STRESS_ORDER, Stress
from dflash_doctor.outcomes import FailureKind, ThreadOutcome
from dflash_doctor.repro.facts import BlameFacts, LevelFacts, PhaseFacts

# Trials a clean natural level needs before it may count towards "holds": one clean run of a race is luck.
MIN_NATURAL_TRIALS = 2


class RowKind(str, enum.Enum):
    ESCALATE = "escalate"
    QUALIFY = "qualify"
    LADDER = "ladder"


class Outcome(str, enum.Enum):
    FAILS = "fails"
    HOLDS = "holds"
    INCONCLUSIVE = "inconclusive"


def trials_per_stress(trials: int) -> Dict[Stress, int]:
    """--trials is the natural count; amplification needs fewer; forced, stuck and a foreign trace settle in one."""
    return {Stress.NATURAL: trials, Stress.AMPLIFIED: max(1, trials - 1), Stress.FORCED: 1, Stress.STUCK: 1,
            Stress.FOREIGN_TRACE: 1}


@dataclass(frozen=True)
class Task:
    row: Tuple[str, ...]
    stress: Stress
    index: int  # 0-based trial number within (row, stress)


@dataclass(frozen=True)
class TrialResult:
    task: Task
    kind: Optional[FailureKind]  # the race it reproduced; None when every thread finished
    outcome: ThreadOutcome  # the phase's
    seconds: float
    finished_at_s: float  # since the run started
    phase: PhaseFacts  # the multi-thread phase facts
    blame: Tuple[BlameFacts, ...] = ()
    problems: Tuple[Problem, ...] = ()
    no_verdict: bool = False  # killed while still making progress: neither reproduced nor clean
    cpu_s: Optional[float] = None  # CPU seconds its children used (their compile workers included)

    @property
    def reproduced(self) -> bool:
        return self.kind is not None


@dataclass
class Row:
    names: Tuple[str, ...]
    kind: RowKind
    stresses: Tuple[Stress, ...]
    trials: Dict[Stress, int]
    skipped: Dict[Stress, str] = field(default_factory=dict)  # stress -> why this machine cannot run it
    results: Dict[Stress, List[TrialResult]] = field(default_factory=dict)
    started: Dict[Stress, int] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return registry.label(self.names)

    def runnable(self) -> Tuple[Stress, ...]:
        return tuple(s for s in self.stresses if s not in self.skipped)

    def done_at(self, stress: Stress) -> List[TrialResult]:
        return self.results.get(stress, [])

    def reproduced_at(self, stress: Stress) -> bool:
        return any(r.reproduced for r in self.done_at(stress))

    def failed(self) -> Optional[TrialResult]:
        return next((r for s in STRESS_ORDER for r in self.done_at(s) if r.reproduced), None)

    def stress_finished(self, stress: Stress) -> bool:
        results = self.done_at(stress)
        if self.kind is RowKind.QUALIFY and any(r.reproduced for r in results):
            return True
        return len(results) >= self.trials[stress]

    def finished(self) -> bool:
        if self.kind is RowKind.ESCALATE:  # done once a stress reproduced and its trials all ended (the rate)
            level = headline_level(self)
            if level is not None:
                return self.stress_finished(level)
        elif self.kind is RowKind.LADDER and self.failed() is not None:
            return True
        return all(self.stress_finished(s) for s in self.runnable())

    def next_tasks(self) -> List[Task]:
        """Tasks that may start now (the scheduler runs as many as it has room for, in this order)."""
        if self.finished():
            return []
        tasks: List[Task] = []
        for stress in self.runnable():
            if self.stress_finished(stress):
                continue
            already = self.started.get(stress, 0)
            tasks.extend(Task(self.names, stress, i) for i in range(already, self.trials[stress]))
            if self.kind is RowKind.ESCALATE:
                break  # the next stress waits until this one ends without a reproduction
        return tasks

    def mark_started(self, task: Task) -> None:
        self.started[task.stress] = max(self.started.get(task.stress, 0), task.index + 1)

    def record(self, result: TrialResult) -> None:
        self.results.setdefault(result.task.stress, []).append(result)

    def wanted(self, task: Task) -> bool:
        """Is a started task still worth waiting for? A ladder row stops at its first reproduction, a qualifying
        stress too; an escalating row lets every trial of its stress end, for the rate."""
        if self.kind is RowKind.QUALIFY:
            return not self.reproduced_at(task.stress)
        if self.kind is RowKind.LADDER:
            return self.failed() is None
        return True

    def tally(self) -> Dict[str, LevelFacts]:
        """Per stress: trials run, how many reproduced, of which kinds; or why it was skipped; and, once the row
        had its verdict, how many of its planned trials it did not wait for (`stopped_early`: stopped, or never
        started), so a count like `natural 0/1` is not read as the plan."""
        out: Dict[str, LevelFacts] = {}
        decided = self.finished()
        for stress in self.stresses:
            if stress in self.skipped:
                out[stress.value] = {"ran": 0, "reproduced": 0, "kinds": {}, "skipped": self.skipped[stress]}
                continue
            results = [r for r in self.done_at(stress) if not r.no_verdict]
            kinds: Dict[str, int] = {}  # FailureKind members: str, and their words on the wire
            for r in results:
                if r.kind:
                    kinds[r.kind] = kinds.get(r.kind, 0) + 1
            out[stress.value] = {"ran": len(results), "reproduced": sum(kinds.values()), "kinds": kinds}
            left = self.trials[stress] - len(self.done_at(stress))
            if decided and left > 0:
                out[stress.value]["stopped_early"] = left
        return out


def escalating_baseline(stresses: Iterable[Stress], trials: int, skipped: Dict[Stress, str]) -> Row:
    return Row((), RowKind.ESCALATE, tuple(stresses), trials_per_stress(trials), dict(skipped))


def qualifying_baseline(stresses: Iterable[Stress], trials: int, skipped: Dict[Stress, str]) -> Row:
    return Row((), RowKind.QUALIFY, tuple(stresses), trials_per_stress(trials), dict(skipped))


def mitigation_row(names: Tuple[str, ...], trials: int, skipped: Dict[Stress, str],
                   stresses: Optional[Tuple[Stress, ...]] = None) -> Row:
    """A fix's row: its whole ladder, or the `stresses` asked for by name."""
    stresses = stresses or registry.ladder(names)
    return Row(names, RowKind.LADDER, stresses, trials_per_stress(trials),
               {s: why for s, why in skipped.items() if s in stresses})


def expected_cost(row: Row) -> float:
    """Trials a row runs if nothing breaks it, a process-per-worker trial counting as two."""
    trials = sum(row.trials[s] for s in row.runnable())
    return trials * (2.0 if any(registry.get(n).separate_processes for n in row.names) else 1.0)


def judge(row: Row, baseline: Row) -> Tuple[Outcome, str]:
    """A mitigation row's one-word outcome and the reason behind it."""
    failure = row.failed()
    if failure is not None:
        stress = failure.task.stress
        finished = row.done_at(stress)
        broke = sum(1 for r in finished if r.reproduced)
        return Outcome.FAILS, f"{failure.kind} under {stress.value} stress ({broke} of {len(finished)} finished trials)"
    gaps: List[str] = []
    skipped: Dict[str, List[str]] = {}
    for stress in row.stresses:
        if stress in row.skipped:
            skipped.setdefault(row.skipped[stress], []).append(stress.value)
            continue
        clean = [r for r in row.done_at(stress) if not r.no_verdict]
        needed = MIN_NATURAL_TRIALS if stress is Stress.NATURAL else 1
        if len(clean) < needed:
            gaps.append(f"{stress.value}: {len(clean)} clean trial(s), {needed} needed")
        elif not baseline.reproduced_at(stress):
            gaps.append(f"{stress.value}: the baseline did not reproduce under it, so surviving it shows nothing")
    gaps.extend(f"{', '.join(stresses)} not run ({why})" for why, stresses in skipped.items())
    # A pinned --mode puts a fix through fewer stresses than it claims to survive: surviving those is evidence,
    # not "holds" (a word a user bets a training run on).
    unasked = [s.value for s in registry.ladder(row.names) if s not in row.stresses]
    if unasked:
        gaps.append(f"{', '.join(unasked)} not run (--mode pinned the stresses; holds needs the fix's whole ladder)")
    if gaps:
        return Outcome.INCONCLUSIVE, "; ".join(gaps)
    return Outcome.HOLDS, "no reproduction in " + ", ".join(
        f"{len(row.done_at(s))} {s.value}" for s in row.stresses) + " trials"


# The stresses that inject a torch.fx trace of the tool's own beside the workers (a thread holding the FX flag inside
# a real trace, two traces exiting out of order, a thread looping symbolic_trace): a reproduction under one of them
# shows what the step does IF a thread of the trainer traces with FX while it runs, not a race of its own threads.
# Natural and amplified only run the step (amplified widens the window of the step's own traces).
INJECTED = frozenset({Stress.FORCED, Stress.STUCK, Stress.FOREIGN_TRACE})


def own_level(row: Row) -> Optional[Stress]:
    """The first stress that reproduced without a trace of the tool's beside the workers (natural, amplified)."""
    return next((s for s in STRESS_ORDER if s not in INJECTED and row.reproduced_at(s)), None)


def reproduced_kinds(row: Row) -> Tuple[FailureKind, ...]:
    """Every race the row reproduced, under any stress, in the order first seen (a step can have two at once)."""
    kinds: List[FailureKind] = []
    for stress in STRESS_ORDER:
        for result in row.done_at(stress):
            if result.kind is not None and result.kind not in kinds:
                kinds.append(result.kind)
    return tuple(kinds)


def headline_level(row: Row) -> Optional[Stress]:
    """The first stress under which the row reproduced."""
    return next((s for s in STRESS_ORDER if row.reproduced_at(s)), None)
