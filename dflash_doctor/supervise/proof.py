"""`run --fix` proved against a baseline: the same command without the fix, in the same invocation.

Trials run in pairs, one without the fix (the baseline arm) and one with it (the fix arm), the order alternating
pair by pair (baseline first, then fix first, ...) so neither arm always runs on the warmer machine or cache.
Each hazard either arm showed, and each the fix claims to stop, gets a verdict in repro's words:

- fails: the fix arm showed it (a fix that does not stop a race the baseline reproduced reads failing);
- holds: the baseline showed it and the fix arm did not, in enough trials that luck is an unlikely reason: at the
  baseline's rate, counted conservatively as b/(m+1), the chance of n clean fix trials, (1 - b/(m+1))^n, is at
  most LUCK (5 %): a race the baseline showed every time holds after 3 pairs, one it showed half the time after 6;
- inconclusive: the baseline never showed it (surviving it shows nothing), or too few trials; with the next step
  (more trials, an amplifier, `--cache cold`).

Pure: trial results in, facts out; the supervisor runs the trials, the command renders.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from dflash_doctor import mitigations as registry
from dflash_doctor.hazards import Hazard, Release
from dflash_doctor.outcomes import BlameKind, WireEnum
from dflash_doctor.rules import live as rules
from dflash_doctor.vocabularies import Amplifier

if TYPE_CHECKING:
    from dflash_doctor.findings import Finding, Report
    from dflash_doctor.supervise.facts import ProofArmFacts, ProofFacts, ProofHazardFacts, RunFacts
    from dflash_doctor.supervise.supervisor import RunSpec, Supervisor, TrialResult

# The most a fix arm's clean trials may be explained by luck at the baseline's rate before "holds" is said.
LUCK = 0.05
OTHER = "other"  # a finding that is none of the registry's hazards: a death of another error, a hang of your locks


class Arm(WireEnum):
    BASELINE = "baseline"
    FIX = "fix"


class Verdict(WireEnum):
    """repro's words (repro/ladder.py Outcome), for `run` too."""

    HOLDS = "holds"
    FAILS = "fails"
    INCONCLUSIVE = "inconclusive"


def hazards_in(findings: Iterable["Finding"]) -> FrozenSet[str]:
    """The hazards a trial's findings show (Hazard values), OTHER for a finding that is none of them."""
    shown = set()
    for finding in findings:
        if finding.code == rules.RUN_FX_FLAG_ERROR.code:
            # as supervise/findings.py words it: a holder inside a trace, or the victim's own trace, is the leak;
            # no holder at all means the flag was left stuck
            kind, holder = finding.evidence.get("blame_kind"), finding.evidence.get("holder")
            leak = kind == BlameKind.NESTED_TRACE.value or (kind == BlameKind.FX_FLAG_LEAK.value and holder)
            shown.add(Hazard.FX_FLAG_LEAK.value if leak else Hazard.STUCK_FLAG.value)
        elif finding.code == rules.RUN_PATCHER_RACE.code:
            shown.add(Hazard.PATCHER_RACE.value)
        elif finding.code == rules.LIVE_COMPILE_DEADLOCK.code:
            shown.add(Hazard.DEADLOCK.value)
        else:
            shown.add(OTHER)
    return frozenset(shown)


@dataclass(frozen=True)
class HazardProof:
    hazard: str  # a Hazard value, or OTHER
    baseline: int  # baseline trials that showed it
    baseline_trials: int
    fixed: int  # fix trials that showed it
    fix_trials: int
    verdict: Verdict
    reason: str
    next: Tuple[str, ...]


def baseline_rate(shown: int, trials: int) -> float:
    """The baseline's rate counted conservatively, b/(m+1): one trial that showed a race is not a rate of 1, so a
    race seen in every baseline trial still needs three pairs before its absence with the fix reads holds."""
    return shown / (trials + 1)


def trials_for(rate: float, luck: float = LUCK) -> int:
    """Clean fix trials needed before luck at `rate` explains them with a chance of at most `luck`."""
    if rate >= 1.0:
        return 1
    return max(1, math.ceil(math.log(luck) / math.log(1.0 - rate)))


def _untried(amplifiers: FrozenSet[Amplifier], cold: bool, hazard: str) -> List[str]:
    """The amplifiers this run did not use that can raise the rate of `hazard`."""
    steps = []
    if Amplifier.SWITCH_INTERVAL not in amplifiers:
        steps.append("`--amplify switch-interval` (the GIL handed over every 0.2 ms: a trace is preempted inside "
                     "its window far more often)")
    if not cold and hazard != Hazard.PATCHER_RACE.value:
        steps.append("`--cache cold` (every trial compiles: the FX flag is up during each compile's trace)")
    if Amplifier.FOREIGN_TRACE not in amplifiers and hazard in (Hazard.PATCHER_RACE.value, Hazard.FX_FLAG_LEAK.value):
        steps.append("`--amplify foreign-trace,switch-interval` if a thread of your trainer traces with torch.fx "
                     "(a profiler, symbolic_trace): a thread of the tool's own does it throughout the run (alone it "
                     "was decisive only on a loaded box: benchmarks/results/run_amplifiers.md)")
    return steps


def judge_hazard(hazard: str, baseline: int, baseline_trials: int, fixed: int, fix_trials: int,
                 amplifiers: FrozenSet[Amplifier] = frozenset(), cold: bool = False,
                 claimed: bool = True) -> HazardProof:
    both = f"baseline {baseline} of {baseline_trials}, with the fix {fixed} of {fix_trials}"
    if fixed:
        why = "" if claimed else " (the fix does not claim to stop it)"
        if hazard == OTHER:
            if baseline:
                return HazardProof(hazard, baseline, baseline_trials, fixed, fix_trials, Verdict.INCONCLUSIVE,
                                   f"{both}: not a race the registry's fixes address; read those findings", ())
            return HazardProof(hazard, baseline, baseline_trials, fixed, fix_trials, Verdict.FAILS,
                               f"{both}: it appeared only with the fix; read those findings", ())
        return HazardProof(hazard, baseline, baseline_trials, fixed, fix_trials, Verdict.FAILS, f"{both}{why}", ())
    if not baseline:
        more = [f"more trials (`--trials {max(2 * baseline_trials, 6)}`)"] + _untried(amplifiers, cold, hazard)
        return HazardProof(hazard, baseline, baseline_trials, fixed, fix_trials, Verdict.INCONCLUSIVE,
                           f"{both}: the baseline never showed it, so the fix surviving it shows nothing",
                           tuple(more) if hazard != OTHER else ())
    rate = baseline_rate(baseline, baseline_trials)
    luck = (1.0 - rate) ** fix_trials
    if luck <= LUCK:
        return HazardProof(hazard, baseline, baseline_trials, fixed, fix_trials, Verdict.HOLDS,
                           f"{both} (at the baseline's rate, {fix_trials} clean trials by luck: {luck:.1%})", ())
    needed = trials_for(rate)
    return HazardProof(hazard, baseline, baseline_trials, fixed, fix_trials, Verdict.INCONCLUSIVE,
                       f"{both}: at the baseline's rate {fix_trials} clean trials happen by luck {luck:.0%} of the "
                       f"time", (f"`--trials {needed}` or more (pairs)",) + tuple(_untried(amplifiers, cold, hazard)))


def release_of(results: Sequence["TrialResult"]) -> Release:
    """The torch the command's processes imported (the first that said), for the advice."""
    for result in results:
        for record in result.records:
            if record.torch_version:
                return Release(version=record.torch_version, fx_flag_thread_local=record.fx_flag_thread_local)
    return Release()


def prove(baseline: Sequence["TrialResult"], fixed: Sequence["TrialResult"], fixes: Sequence[str],
          amplifiers: Iterable[Amplifier] = (), cold: bool = False) -> "ProofFacts":
    """Per-hazard verdicts, the overall one, and the fix that covers every hazard the baseline reproduced."""
    from dflash_doctor.supervise.amplifiers import describe

    used = frozenset(amplifiers)
    shown_base = [hazards_in(r.findings) for r in baseline]
    shown_fix = [hazards_in(r.findings) for r in fixed]
    claimed = {h.value for h in registry.covers(fixes) if not h.minor}
    seen = set().union(*shown_base, *shown_fix) if shown_base or shown_fix else set()
    order = [h.value for h in Hazard] + [OTHER]
    rows = [judge_hazard(h, sum(h in s for s in shown_base), len(baseline), sum(h in s for s in shown_fix),
                         len(fixed), used, cold, h in claimed)
            for h in order if h in seen or h in claimed]
    overall = _overall(rows)
    reproduced = frozenset(Hazard(h) for s in shown_base + shown_fix for h in s if h != OTHER)
    release = release_of(list(baseline) + list(fixed))
    advice = _advice(reproduced, release, tuple(fixes), overall)
    facts: "ProofFacts" = {
        "fixes": list(fixes), "order": "alternating pairs: baseline first in odd pairs, the fix first in even ones",
        "amplifiers": [{"name": a.value, "what": describe(a)} for a in sorted(used, key=list(Amplifier).index)],
        "cache": "cold" if cold else "as-is",
        "baseline": _arm_facts(baseline, shown_base), "fix": _arm_facts(fixed, shown_fix),
        "hazards": [_row_facts(row) for row in rows], "verdict": overall.value,
        "injected": Amplifier.FOREIGN_TRACE in used, "advice": advice,
    }
    return facts


def _overall(rows: Sequence[HazardProof]) -> Verdict:
    """fails if any race fails; holds if every race either arm showed holds (a claim of the fix that neither arm
    showed stays inconclusive in its own row: untested, not broken); else inconclusive (none showed, or too few)."""
    if any(row.verdict is Verdict.FAILS for row in rows):
        return Verdict.FAILS
    shown = [row for row in rows if row.hazard != OTHER and (row.baseline or row.fixed)]
    if shown and all(row.verdict is Verdict.HOLDS for row in shown):
        return Verdict.HOLDS
    return Verdict.INCONCLUSIVE


def _advice(reproduced: FrozenSet[Hazard], release: Release, fixes: Tuple[str, ...], overall: Verdict) -> List[str]:
    """What to apply: the best fix covering every hazard either arm reproduced (and every severe one this release
    has), said as the `run --fix` that proves it; nothing new when the fix applied holds and covers them."""
    if not reproduced:
        return []
    needed = release.hazards(including=reproduced) | reproduced
    best = registry.covering(needed, release)
    shown = ", ".join(h.value for h in Hazard if h in reproduced)
    if best is None:
        return [f"reproduced: {shown}; no fix in the registry covers them on this torch"]
    if overall is Verdict.HOLDS and reproduced <= registry.covers(fixes):
        return [f"reproduced: {shown}; {registry.label(fixes)} stopped each: put it in your trainer: "
                + "; ".join(registry.get(name).api for name in fixes)]
    code = "; ".join(best.api)
    if all(registry.get(name).applies_without_code_change for name in best.mitigations):
        return [f"reproduced: {shown}; the fix that covers every one: {best.label}: prove it with "
                f"`dflash-doctor run --fix {best.label} ...` (same options), then put it in your trainer: {code}"]
    return [f"reproduced: {shown}; the fix that covers every one: {best.label}, in your trainer: {code}"]


def run_advice(results: Sequence["TrialResult"], fixes: Sequence[str] = ()) -> List[str]:
    """A run without a baseline: the fix covering every race its trials showed, as the `run --fix` that proves it
    (each finding's own next step covers its race; this line covers them together)."""
    reproduced = frozenset(Hazard(h) for r in results for h in hazards_in(r.findings) if h != OTHER)
    return _advice(reproduced, release_of(results), tuple(fixes), Verdict.INCONCLUSIVE)


def _arm_facts(results: Sequence["TrialResult"], shown: Sequence[FrozenSet[str]]) -> "ProofArmFacts":
    return {"trials": len(results), "with_findings": sum(not r.clean for r in results),
            "exit_nonzero": sum(r.exit_code != 0 for r in results),
            "per_trial": [{"trial": r.index + 1, "exit_code": r.exit_code, "seconds": r.seconds,
                           "findings": len(r.findings), "shown": sorted(s)} for r, s in zip(results, shown)]}


def add_proof(report: "Report[RunFacts]", baseline: Sequence["TrialResult"], fixed: Sequence["TrialResult"],
              spec: "RunSpec") -> None:
    """The fix arm's report (report_for made it: its findings, trials, rate and the command's exit code) gains
    the baseline's findings, each finding its arm, and the proof."""
    from dflash_doctor.findings import Finding

    def in_arm(finding: "Finding", arm: Arm, **more: object) -> "Finding":
        return Finding(finding.code, finding.name, finding.severity, finding.message, finding.path, finding.line,
                       finding.column, dict(finding.evidence, arm=arm.value, **more))

    report.findings[:] = [in_arm(finding, Arm.FIX) for finding in report.findings]
    for result in baseline:
        report.findings.extend(in_arm(finding, Arm.BASELINE, trial=result.index + 1) for finding in result.findings)
        report.problems.extend(result.problems)
        for record in result.records:
            report.problems.extend(record.problems)
    used = tuple(Amplifier(name) for name in spec.amplifiers)
    facts = prove(baseline, fixed, spec.fixes, used, spec.cold_cache)
    report.facts["proof"] = facts
    report.facts["advice"] = facts["advice"]
    report.summary = closing_line(facts)


def _row_facts(row: HazardProof) -> "ProofHazardFacts":
    return {"hazard": row.hazard, "baseline": row.baseline, "baseline_trials": row.baseline_trials,
            "fix": row.fixed, "fix_trials": row.fix_trials, "verdict": row.verdict.value, "reason": row.reason,
            "next": list(row.next)}


def run_pairs(spec: "RunSpec", make: Callable[["RunSpec"], "Supervisor"]
              ) -> Tuple[List["TrialResult"], List["TrialResult"]]:
    """(baseline results, fix results): `spec.trials` pairs, alternating which arm goes first; a signal the user
    sent (forwarded to the command) ends the run after that trial."""
    arms = {Arm.BASELINE: make(replace(spec, fixes=())), Arm.FIX: make(spec)}
    results: Dict[Arm, List["TrialResult"]] = {Arm.BASELINE: [], Arm.FIX: []}
    for pair in range(spec.trials):
        order = (Arm.BASELINE, Arm.FIX) if pair % 2 == 0 else (Arm.FIX, Arm.BASELINE)
        for arm in order:
            result = arms[arm].run_trial(pair)
            results[arm].append(result)
            if result.signals_forwarded:
                return results[Arm.BASELINE], results[Arm.FIX]
    return results[Arm.BASELINE], results[Arm.FIX]


def closing_line(facts: "ProofFacts") -> str:
    """The verdict in words, for the report's last line."""
    rows = facts["hazards"]
    label = ",".join(facts["fixes"])
    if not rows:
        return f"--fix {label}: inconclusive (no race in either arm, nothing the fix claims)"
    parts = [f"{row['hazard']} {row['verdict']} ({row['baseline']}/{row['baseline_trials']} -> "
             f"{row['fix']}/{row['fix_trials']})" for row in rows]
    return f"--fix {label}: {facts['verdict']}: " + "; ".join(parts)
