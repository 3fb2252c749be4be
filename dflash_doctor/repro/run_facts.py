"""A repro run's facts and exit code, from what the run kept: the settings, the control's record, the trials that
ended and the rows they fill (ladder.py). `RunFacts` writes the report of a run that finished, of one a signal or
--max-time stopped, and of one whose control failed; the harness (harness.py) only runs the trials.
"""
from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Sequence

from dflash_doctor import mitigations as registry
from dflash_doctor.findings import Problem, Report
from dflash_doctor.hazards import STRESS_ORDER
from dflash_doctor.repro import ladder
from dflash_doctor.repro.capabilities import Capabilities
from dflash_doctor.repro.facts import (
    CpuFacts,
    HeadlineFacts,
    MatrixRowFacts,
    PhaseFacts,
    ReproFacts,
    SettingsFacts,
)
from dflash_doctor.repro.phase_record import PhaseRecord
from dflash_doctor.repro.spec import Mode, ReproSpec

EXIT_NOT_REPRODUCED = 0
EXIT_REPRODUCED = 1
EXIT_HARNESS_FAILURE = 3
# A --step/--model replay that reproduced only under a stress injecting the tool's own FX trace: what the step does
# IF a thread of the trainer traces with FX, not a race of its own threads (ladder.INJECTED).
EXIT_REPRODUCED_IF_TRACED = 5
REPRODUCED_IF_TRACED = "reproduced-if-traced"
MAX_TIME = "max-time"  # facts.partial.stopped_by of a run --max-time ended


def verdict_exit_code(verdict: Optional[str]) -> int:
    """repro's exit code for a verdict a run reached (harness failures are decided before)."""
    if verdict == "reproduced":
        return EXIT_REPRODUCED
    if verdict == REPRODUCED_IF_TRACED:
        return EXIT_REPRODUCED_IF_TRACED
    return EXIT_NOT_REPRODUCED


def matrix_order(rows: Sequence[ladder.Row]) -> List[ladder.Row]:
    """The matrix as it is shown: no mitigation first, then the registry's order."""
    order = [(), *registry.MATRIX[1:]]
    return sorted(rows, key=lambda r: order.index(r.names) if r.names in order else -1)


class RunFacts:
    """The facts of one run. `elapsed` is the run's clock (the one its progress lines use); `results` are the
    trials that ended, in order; `warm_start` says how the runner started its children, where it can."""

    def __init__(self, spec: ReproSpec, caps: Capabilities, control: Optional[PhaseRecord],
                 results: Sequence[ladder.TrialResult], shared_fixes: Sequence[str], elapsed: Callable[[], float],
                 warm_start: Optional[Callable[[], Any]] = None) -> None:
        self.spec, self.caps, self.control, self.results = spec, caps, control, results
        self.shared_fixes, self.elapsed, self.warm_start = shared_fixes, elapsed, warm_start

    # -- the parts -----------------------------------------------------------------------------------------
    def cpu(self) -> CpuFacts:
        """The CPU the control and the trials that ended used, and that CPU spread over every core (CpuFacts). The
        warm-start server's one import (beside the control) and trials stopped once their row had its verdict
        are left out."""
        counted = [r.cpu_s for r in self.results if r.cpu_s is not None]
        if self.control is not None and self.control.cpu_s is not None:
            counted.append(self.control.cpu_s)
        cores = os.cpu_count() or 1
        total = round(sum(counted), 1)
        return {"children_s": total, "children": len(counted), "cores": cores, "bound_s": round(total / cores, 1)}

    def settings(self) -> SettingsFacts:
        spec, control = self.spec, self.control
        facts: SettingsFacts = {
            "torch_version": (control.torch_version if control is not None else None) or self.caps.torch_version,
            "device": ",".join(spec.devices),
            "threads": spec.threads,
            "mode": spec.mode,
            "mitigation": registry.label(spec.mitigation),
            "cache": spec.cache,
            "shared_cache": [stress.value for stress in spec.shared_cache_stresses],
            "shared_cache_fixes": list(self.shared_fixes),
            "backward": spec.effective_backward,
            "checkpoint": spec.checkpoint,
            "shapes": spec.shapes,
            "steps": spec.steps,
            "jobs": spec.effective_jobs,
            "model": spec.model or spec.step or f"reference drafter ({spec.preset})",
            "capabilities": self.caps.to_dict(),
        }
        if spec.mode in (Mode.AUTO.value, Mode.AMPLIFIED.value):
            facts["amplify_ms"] = spec.amplify_ms
        return facts

    def headline(self, row: ladder.Row, baseline: ladder.Row) -> HeadlineFacts:
        level = ladder.headline_level(row)
        first = row.failed()
        done = [r for s in STRESS_ORDER for r in row.done_at(s)]
        chosen = first or (done[-1] if done else None)
        phase: Optional[PhaseFacts] = chosen.phase if chosen else None
        verdict = "reproduced" if first else ("not-reproduced" if any(not r.no_verdict for r in done) else None)
        if first is not None and not row.names and self.spec.user_code and ladder.own_level(row) is None:
            verdict = REPRODUCED_IF_TRACED  # only a trace of the tool's own made the user's step fail
        at = level or next((s for s in reversed(STRESS_ORDER) if row.done_at(s)), None)
        tally = row.tally()
        counted = tally.get(at.value) if at else None
        facts: HeadlineFacts = {
            "verdict": verdict, "kind": first.kind if first else None, "level": level.value if level else None,
            "levels": tally, "blame": list(chosen.blame) if chosen else [], "multi_thread": phase,
            "hang": phase.get("hang") if phase is not None else None,
            "trials": [{"stress": r.task.stress.value, "trial": r.task.index + 1, "outcome": r.outcome,
                        "kind": r.kind, "seconds": round(r.seconds, 3)} for r in done],
            "reproduction_rate": round(counted["reproduced"] / counted["ran"], 3) if counted and counted["ran"]
            else None,
            "time_to_verdict_s": round(first.finished_at_s if first else self.elapsed(), 3),
            "wall_s": round(self.elapsed(), 3),
            "cpu": self.cpu(),
        }
        if self.warm_start is not None:  # the warm-start runner's: how children started
            facts["warm_start"] = self.warm_start()
        shim = phase.get("shim") if phase else None
        if phase and shim:
            facts["shim"] = {**shim, "self_check": phase.get("shim_check")}
        if row.names:
            outcome, reason = ladder.judge(row, baseline)
            facts["outcome"], facts["outcome_reason"] = outcome.value, reason
            facts["baseline_levels"] = baseline.tally()
        # Every race the baseline showed, under which stress first, and whether only an injected trace made it: the
        # advice must cover each of them (next_steps.py), not only the headline's first.
        facts["baseline_reproduced"] = [
            {"kind": kind.value, "stress": stress.value, "injected": stress in ladder.INJECTED}
            for kind in ladder.reproduced_kinds(baseline)
            for stress in [next(s for s in STRESS_ORDER if any(r.kind == kind for r in baseline.done_at(s)))]]
        return facts

    def matrix_row(self, row: ladder.Row, baseline: ladder.Row) -> MatrixRowFacts:
        first = row.failed()
        clean = next((r for s in STRESS_ORDER for r in row.done_at(s) if not r.reproduced and not r.no_verdict),
                     None)
        verdict = "reproduced" if first else "not-reproduced"
        if row.names:
            judged, reason = ladder.judge(row, baseline)
            outcome = judged.value
        else:  # the baseline row's outcome is its verdict
            level = ladder.headline_level(row)
            outcome, reason = verdict, (f"{first.kind} under {level.value}" if first and level else
                                        "the race did not show under any stress that ran")
        entry: MatrixRowFacts = {
            "mitigation": row.label, "verdict": verdict, "kind": first.kind if first else None,
            "stresses": row.tally(), "steps_per_s": clean.phase.get("steps_per_s") if clean else None,
            "seconds": round(max((r.seconds for s in STRESS_ORDER for r in row.done_at(s)), default=0.0), 3),
            "cpu_s": round(sum(r.cpu_s or 0.0 for s in STRESS_ORDER for r in row.done_at(s)), 1),
            "outcome": outcome, "reason": reason}
        if row.names:
            entry["covers"] = sorted(h.value for h in registry.covers(row.names))
            entry["caveats"] = list(registry.caveats_for(row.names))
        return entry

    # -- the reports -----------------------------------------------------------------------------------------
    def finished(self, report: Report[ReproFacts], single: Optional[PhaseFacts], rows: List[ladder.Row],
                 baseline: ladder.Row, headline: ladder.Row, matrix: bool) -> Report[ReproFacts]:
        """The report of a run whose every trial it wanted ended: the verdict, the advice, the exit code."""
        from dflash_doctor.repro.findings import findings_from_facts
        from dflash_doctor.repro.next_steps import next_steps

        facts = report.facts = {**self.settings(), "single_thread": single, **self.headline(headline, baseline)}
        if matrix:
            facts["matrix"] = [self.matrix_row(row, baseline) for row in matrix_order(rows)]
        report.problems.extend(p for result in self.results for p in result.problems)
        facts["next_steps"] = next_steps(facts)
        report.findings.extend(findings_from_facts(facts))
        failed_setup = any(p.subject in registry.BY_NAME for p in report.problems)
        if facts["verdict"] is None:
            report.problems.append(Problem(
                "repro", "no trial ran to an end, so there is no verdict",
                "every stress this run needed was skipped or gave no verdict; see the notes above"))
        if failed_setup or facts["verdict"] is None:
            report.exit_code_override = EXIT_HARNESS_FAILURE
        else:
            report.exit_code_override = verdict_exit_code(facts["verdict"])
        return report

    def stopped(self, report: Report[ReproFacts], single: Optional[PhaseFacts], signal_name: str,
                rows: List[ladder.Row], baseline: ladder.Row, headline: ladder.Row,
                matrix: bool) -> Report[ReproFacts]:
        """The report of a run a signal or --max-time ended: the verdict so far, its findings and, for the matrix,
        the rows with a trial that ended (each says whether all of its trials did); no advice drawn from a
        part-run."""
        from dflash_doctor.findings import stopped_facts
        from dflash_doctor.repro.findings import findings_from_facts

        facts = report.facts = {**self.settings(), "single_thread": single, **self.headline(headline, baseline)}
        if matrix:  # the rows with a trial that ended, each saying whether all of its trials did
            ended = {result.task.row for result in self.results}
            facts["matrix"] = [{**self.matrix_row(row, baseline), "finished": row.finished()}
                               for row in matrix_order(rows) if row.names in ended]
        report.findings.extend(findings_from_facts(facts))
        # "none" is the baseline's label, and would read as "nothing": the words name it
        unfinished = [row.label if row.names else "the baseline (no mitigation)" for row in rows
                      if not row.finished()]
        said = (f"{len(self.results)} trial(s) had ended; "
                + (f"not finished: {', '.join(unfinished)}" if unfinished else "every row had finished"))
        if signal_name != MAX_TIME:
            report.mark_stopped(signal_name, said)
            return report
        # A deadline is no signal: a verdict found in time stands (exit 1), and an unfinished row reads
        # inconclusive, never holds (ladder.judge); with no verdict yet the run failed to answer (exit 3).
        facts["partial"] = stopped_facts(MAX_TIME, said)
        report.problems.append(Problem("repro", f"stopped at --max-time {self.spec.max_time_s:g} s: {said}",
                                       "raise --max-time, or lower --trials / --jobs' load on this machine"))
        found = facts["verdict"] in ("reproduced", REPRODUCED_IF_TRACED)
        report.exit_code_override = verdict_exit_code(facts["verdict"]) if found else EXIT_HARNESS_FAILURE
        return report

    def control_failed(self, report: Report[ReproFacts], single: Optional[PhaseFacts],
                       control: PhaseRecord) -> Report[ReproFacts]:
        failed = [t for t in control.threads if t.error]
        reason = failed[0].error if failed else control.crash or f"outcome {control.outcome}"
        report.problems.append(Problem(
            "single-thread phase", f"the step fails in one thread, so threads cannot be blamed: {reason}",
            "fix the step (or the --model factory) first; the child's log tail is in the JSON facts"))
        report.facts = {**self.settings(), "single_thread": single, "multi_thread": None, "verdict": "not-reproduced",
                        "kind": None, "blame": [], "level": None, "time_to_verdict_s": round(self.elapsed(), 3)}
        report.exit_code_override = EXIT_HARNESS_FAILURE
        return report
