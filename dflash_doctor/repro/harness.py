"""The repro harness: a single-thread control, then multi-thread trials up the stress ladder, each in a fresh child.

`run_repro(spec)` returns a Report whose exit code is repro's own: 0 not reproduced, 1 reproduced, 3 harness
failure (the control failed, a requested mitigation could not be applied, or no trial gave a verdict). Trials
run side by side (`--jobs`); which trials run and what they mean is repro/ladder.py's business, what this machine
can show is repro/capabilities.py's, how a trial's children start and what they left is repro/trials.py's, and
the report's facts are repro/run_facts.py's. It never prints: a `Reporter` (dflash_doctor/progress.py) is told as
the control and every trial start and end, each event stamped with the run's clock, the one its facts use.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from dflash_doctor import mitigations as registry
from dflash_doctor.findings import Problem, Report
from dflash_doctor.hazards import STRESS_ORDER, Stress
from dflash_doctor.outcomes import ThreadOutcome
from dflash_doctor.progress import EventKind, ProgressEvent, Reporter, silent
from dflash_doctor.repro import ladder
from dflash_doctor.repro.capabilities import Capabilities, assess
from dflash_doctor.repro.classify import classify_phase, phase_facts
from dflash_doctor.repro.facts import ReproFacts
from dflash_doctor.repro.phase_record import PhaseRecord
from dflash_doctor.repro.run_facts import (
    EXIT_HARNESS_FAILURE,
    EXIT_NOT_REPRODUCED,
    EXIT_REPRODUCED,
    EXIT_REPRODUCED_IF_TRACED,
    MAX_TIME,
    REPRODUCED_IF_TRACED,
    RunFacts,
    verdict_exit_code,
)
from dflash_doctor.repro.sharing import SharedCache
from dflash_doctor.repro.spec import ReproSpec
from dflash_doctor.repro.trials import CONTROL, Launcher, Trial, trial_key

POLL_S = 0.2
# The default run climbs these; stuck runs only when asked for (--mode stuck) or to qualify a mitigation.
ESCALATION = (Stress.NATURAL, Stress.AMPLIFIED, Stress.FORCED)


class _TimeUp(Exception):
    """--max-time passed: stop every trial and report what had ended."""


def plan(spec: ReproSpec, matrix: bool, caps: Capabilities) -> Tuple[ladder.Row, List[ladder.Row], ladder.Row]:
    """(baseline, every row in scheduling order, the row whose verdict is the headline)."""
    pinned = spec.pinned_stress
    if pinned is None:
        skipped = dict(caps.skipped)
    else:  # asked for by name: it runs even where this machine is not expected to show anything
        skipped = {s: f"--mode {pinned.value} runs that stress alone" for s in STRESS_ORDER if s is not pinned}
    if not matrix and not spec.mitigation:
        stresses = (pinned,) if pinned else ESCALATION
        baseline = ladder.escalating_baseline(stresses, spec.trials, skipped)
        return baseline, [baseline], baseline
    wanted = list(registry.MATRIX[1:]) if matrix else []
    if spec.mitigation and spec.mitigation not in wanted:
        wanted.insert(0, spec.mitigation)
    # A pinned stress is what the user asked every row to face, in its ladder or not (`--mode foreign-trace
    # --mitigation threadlocal-flag` shows that the shim leaves the patcher race open).
    rows = [ladder.mitigation_row(names, spec.trials, skipped, (pinned,) if pinned else None)
            for names in wanted]
    if matrix:  # longest ladders first, so the slowest rows do not start last (longest-processing-time order)
        rows.sort(key=lambda row: -ladder.expected_cost(row))
    needed = {stress for row in rows for stress in row.stresses}
    baseline = ladder.qualifying_baseline(tuple(s for s in STRESS_ORDER if s in needed), spec.trials, skipped)
    headline = baseline if not spec.mitigation else next(r for r in rows if r.names == spec.mitigation)
    return baseline, [baseline] + rows, headline


class Harness:
    def __init__(self, spec: ReproSpec, *, runner=None, progress: Reporter = silent,
                 clock: Callable[[], float] = time.perf_counter, workdir: Optional[Path] = None,
                 capabilities: Optional[Capabilities] = None, poll_s: float = POLL_S) -> None:
        self.spec = spec
        self.poll_s = poll_s  # between looks at the running children; a runner whose children end at once needs none
        self._interrupted = False
        # None: the run's own, made once its folder exists (warm_start.WarmStartRunner forks children from a
        # server that imported torch once); tests pass a runner of their own.
        self.runner = runner
        self.progress = progress
        self.clock = clock
        self.workdir = workdir
        self.capabilities = capabilities
        self.started = clock()
        self.control: Optional[PhaseRecord] = None  # the control's result once it ended
        self.shared_fixes: List[str] = []  # rows whose every trial shares the run's cache (ReproSpec.shares_cache)
        self.shared = SharedCache()  # who compiles first into the run's shared cache (repro/sharing.py)
        self.results: List[ladder.TrialResult] = []  # the trials that ended, in order
        self.launcher = Launcher(spec, runner, self.shared)  # every child this run starts (repro/trials.py)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def tell(self, kind: EventKind, key: str, text: str, at_s: Optional[float] = None, step: Optional[int] = None,
             total: Optional[int] = None) -> None:
        at = self.elapsed() if at_s is None else at_s
        self.progress(ProgressEvent(kind, key, text, round(at, 3), step, total))

    # -- a whole run -------------------------------------------------------------------------------------
    def run(self, matrix: bool = False) -> Report[ReproFacts]:
        root = Path(tempfile.mkdtemp(prefix="dflash-repro-", dir=self.workdir))
        own_runner = self.runner is None
        if own_runner:
            from dflash_doctor.repro.warm_start import WarmStartRunner

            self.runner = self.launcher.runner = WarmStartRunner(root, clock=self.clock)
        try:
            return self._run(root, matrix)
        finally:
            # Every child first (kill() is a no-op for one that ended): a signal leaves trials running, and a
            # disturbance child that writes its result.json after the folder is removed makes it again.
            for child in self.launcher.started:
                child.kill()
            if self._interrupted:  # the signal may have landed inside start_child, after the child's start and
                from dflash_doctor import children  # before it was listed here; the registry has every one

                children.stop_all(reopen=True)
            if own_runner:
                self.runner.close()
            shutil.rmtree(root, ignore_errors=True)

    def _notes(self, caps: Capabilities, rows: Sequence[ladder.Row]) -> None:
        """What this run cannot show, and which trials share a compile cache and why, before the first trial."""
        spec = self.spec
        for line in caps.cannot_show:
            self.tell(EventKind.NOTE, "note", f"note: {line}")
        if spec.shared_cache_stresses:
            self.tell(EventKind.NOTE, "note", f"note: {' and '.join(s.value for s in spec.shared_cache_stresses)} "
                      "trials share one compile cache: the FX flag is up for their whole run and no backward can "
                      "deadlock, so a compile's length cannot change them; every other trial compiles cold")
        if self.shared_fixes:
            self.tell(EventKind.NOTE, "note", f"note: every {', '.join(self.shared_fixes)} trial shares one "
                      "compile cache: a worker alone in its process has no second thread to race with, and the "
                      "disturbances run in a process of their own, so a compile's length cannot change them")

    def _run(self, root: Path, matrix: bool) -> Report[ReproFacts]:
        spec = self.spec
        caps = self.capabilities or assess(spec.effective_backward, spec.on_cpu, user_code=spec.user_code)
        baseline, rows, headline = plan(spec, matrix, caps)
        self.shared_fixes = [row.label for row in rows if row.names
                             and spec.shares_cache(Stress.NATURAL, row.names)]
        self._notes(caps, rows)
        needs_control = any(s in (Stress.NATURAL, Stress.AMPLIFIED) for row in rows for s in row.runnable())
        stopped: Optional[str] = None
        try:
            control = self._execute(root, rows, needs_control)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the report is made of the trials that had ended
            from dflash_doctor.errors import stop_signal

            self._interrupted = True
            stopped, control = stop_signal(exc), self.control
        except _TimeUp:  # the same partial report, with the verdict's own exit code where there is one
            stopped, control = MAX_TIME, self.control
        report: Report[ReproFacts] = Report(command="repro")
        facts = RunFacts(spec, caps, control, self.results, self.shared_fixes, self.elapsed,
                         getattr(self.runner, "warm_start_facts", None))  # only the warm-start runner says
        if control is not None and control.usage_error:
            from dflash_doctor.errors import UsageError

            raise UsageError(control.usage_error)
        single = phase_facts(control) if control is not None else None
        if control is not None:
            report.problems.extend(control.problems)
            if control.outcome != ThreadOutcome.OK:
                return facts.control_failed(report, single, control)
        if stopped is not None:
            return facts.stopped(report, single, stopped, rows, baseline, headline, matrix)
        return facts.finished(report, single, rows, baseline, headline, matrix)

    def _execute(self, root: Path, rows: List[ladder.Row], needs_control: bool) -> Optional[PhaseRecord]:
        """Run the control and every trial the rows ask for, `jobs` at a time; returns the control's record. It
        and the trials' results are kept on self as they arrive, for the partial report should a signal stop the
        run."""
        running: List[Trial] = []
        try:
            if needs_control:
                self.tell(EventKind.STARTED, CONTROL, f"one worker, {self.spec.cache} compile cache")
                running.append(Trial(self.launcher, root, None, "single"))
                if self.spec.effective_jobs == 1:  # nothing fits beside it: wait; a broken step stops the run
                    control = self._wait(running[0])
                    running.clear()
                    if control.outcome != ThreadOutcome.OK:
                        return control
            return self._drive(root, rows, running)
        finally:
            for trial in running:  # an error, Ctrl-C or SIGTERM: no child outlives the run
                trial.kill()

    def _start_due(self, root: Path, rows: List[ladder.Row], running: List[Trial]) -> None:
        """Start every trial the rows want now, while fewer than `jobs` run."""
        for row in rows:
            for task in row.next_tasks():
                if len(running) >= self.spec.effective_jobs:
                    break
                if not self.shared.may_start(self.spec.shares_cache(task.stress, task.row)):
                    continue
                row.mark_started(task)
                label = f"{row.label.replace(',', '+')}-{task.stress.value}-t{task.index + 1}"
                total = row.trials[task.stress]
                key = trial_key(task, total)
                self.tell(EventKind.STARTED, key, key, step=task.index + 1, total=total)
                trial = Trial(self.launcher, root, task, label, key)
                running.append(trial)
                self.shared.started(trial, trial.shared_cache)

    def _drive(self, root: Path, rows: List[ladder.Row], running: List[Trial]) -> Optional[PhaseRecord]:
        by_row = {row.names: row for row in rows}
        while True:
            self._stop_at_max_time()
            self._start_due(root, rows, running)
            if not running:
                return self.control
            time.sleep(self.poll_s)
            for trial in list(running):
                if trial.task is not None and not by_row[trial.task.row].wanted(trial.task):
                    trial.kill()
                    running.remove(trial)
                    self.shared.ended(trial)
                    self.tell(EventKind.FINISHED, trial.key, "stopped: its row already has its verdict")
                    continue
                result = trial.poll()
                if result is None:
                    continue
                running.remove(trial)
                self.shared.ended(trial)
                if trial.task is None:
                    self._control_ended(result)
                    if result.outcome != ThreadOutcome.OK:
                        return result
                    continue
                outcome, said = self._trial_result(trial, result)
                by_row[trial.task.row].record(outcome)
                self.results.append(outcome)
                # announced once recorded: what it says is in the report, should a signal come now
                self.tell(EventKind.FINISHED, trial.key, said, at_s=outcome.finished_at_s)

    def _stop_at_max_time(self) -> None:
        limit = self.spec.max_time_s
        if limit is not None and self.elapsed() >= limit:
            raise _TimeUp()  # _execute kills what runs; what had ended is the report

    def _wait(self, trial: Trial) -> PhaseRecord:
        while True:
            self._stop_at_max_time()
            result = trial.poll()
            if result is not None:
                self._control_ended(result)
                return result
            time.sleep(self.poll_s)

    def _control_ended(self, result: PhaseRecord) -> None:
        self.control = result  # kept before it is announced, for a partial report
        self.tell(EventKind.FINISHED, CONTROL, str(result.outcome))

    def _trial_result(self, trial: Trial, result: PhaseRecord) -> Tuple[ladder.TrialResult, str]:
        """The trial's result, and the words that announce its end."""
        task = trial.task
        assert task is not None, "the control is not a trial"
        if result.usage_error:
            from dflash_doctor.errors import UsageError

            raise UsageError(result.usage_error)
        kind, blame = classify_phase(result)
        problems = list(result.problems)
        subject = f"{task.stress.value} trial {task.index + 1} ({registry.label(task.row)})"
        no_verdict = bool(result.timed_out_busy or result.crash)
        if result.crash:  # the child died without a word: that is the harness's failure, not a race
            kind, blame = None, []
            problems.append(Problem(subject, f"the trial's child {result.crash}",
                                    "its log tail is in the JSON facts (multi_thread.log_tail)"))
        elif no_verdict:
            kind, blame = None, []
            problems.append(Problem(subject, f"still making progress when --timeout ({self.spec.timeout_s:.0f} s) "
                                             "ended it: no verdict",
                                    "raise --timeout (cold compiles of several shapes take a while on a busy "
                                    "machine)"))
        said = (f"reproduced ({kind})" if kind else "no verdict" if no_verdict else
                f"not reproduced ({result.outcome})")
        finished_at = self.elapsed()  # the one time this trial's end is given: progress, verdict and JSON
        return ladder.TrialResult(task, kind, result.outcome, result.seconds, finished_at, phase_facts(result),
                                  tuple(b.to_dict() for b in blame), tuple(problems), no_verdict, result.cpu_s), said


def run_repro(spec: ReproSpec, *, matrix: bool = False, runner=None, progress: Reporter = silent,
              clock: Callable[[], float] = time.perf_counter, workdir: Optional[Path] = None,
              capabilities: Optional[Capabilities] = None, poll_s: float = POLL_S) -> Report[ReproFacts]:
    """Run a repro (or the mitigation matrix) and return its Report; see the module docstring."""
    return Harness(spec.validate(), runner=runner, progress=progress, clock=clock, workdir=workdir,
                   capabilities=capabilities, poll_s=poll_s).run(matrix)


def trace_phases(facts: ReproFacts) -> Sequence[tuple]:
    """(phase name, events) pairs for the Chrome trace: the control, then the reported multi-thread run."""
    single, multi = facts["single_thread"], facts["multi_thread"]
    phases = [("single-thread", single["events"] if single else [])]
    processes = multi.get("processes") if multi else None
    if processes:
        phases.extend((f"process {', '.join(p['threads'])}", p["events"]) for p in processes)
    else:
        phases.append((f"{facts['threads']} threads", multi["events"] if multi else []))
    return phases


__all__ = ["EXIT_HARNESS_FAILURE", "EXIT_NOT_REPRODUCED", "EXIT_REPRODUCED", "EXIT_REPRODUCED_IF_TRACED", "Harness",
           "REPRODUCED_IF_TRACED", "plan", "run_repro", "trace_phases", "verdict_exit_code"]
