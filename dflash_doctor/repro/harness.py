"""The repro harness: a single-thread control, then multi-thread trials up the stress ladder, each in a fresh child.

`run_repro(spec)` returns a Report whose exit code is repro's own: 0 not reproduced, 1 reproduced, 3 harness
failure (the control failed, a requested mitigation could not be applied, or no trial gave a verdict). Trials
run side by side (`--jobs`); which trials run and what they mean is repro/ladder.py's business, what this machine
can show is repro/capabilities.py's. It never prints: a `Reporter` (dflash_doctor/progress.py) is told as the
control and every trial start and end, each event stamped with the run's clock, the one its facts use.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, cast

from dflash_doctor import mitigations as registry
from dflash_doctor.findings import Problem, Report
from dflash_doctor.hazards import STRESS_ORDER, Stress
from dflash_doctor.outcomes import ThreadOutcome
from dflash_doctor.progress import EventKind, ProgressEvent, Reporter, silent
from dflash_doctor.repro import ladder
from dflash_doctor.repro.capabilities import Capabilities, assess
from dflash_doctor.repro.classify import classify_phase, merge_process_results, phase_facts
from dflash_doctor.repro.facts import (
    BlameFacts,
    CpuFacts,
    HeadlineFacts,
    LevelFacts,
    MatrixRowFacts,
    PhaseFacts,
    ReproFacts,
    SettingsFacts,
)
from dflash_doctor.repro.runner import Child, ChildExit, child_env, read_phase_result, write_spec
from dflash_doctor.repro.sharing import SharedCache
from dflash_doctor.repro.spec import PhaseSpec, ReproSpec

EXIT_NOT_REPRODUCED = 0
EXIT_REPRODUCED = 1
EXIT_HARNESS_FAILURE = 3
# A --step/--model replay that reproduced only under a stress injecting the tool's own FX trace: what the step does
# IF a thread of the trainer traces with FX, not a race of its own threads (ladder.INJECTED).
EXIT_REPRODUCED_IF_TRACED = 5
REPRODUCED_IF_TRACED = "reproduced-if-traced"
POLL_S = 0.2
# The default run climbs these; stuck runs only when asked for (--mode stuck) or to qualify a mitigation.
ESCALATION = (Stress.NATURAL, Stress.AMPLIFIED, Stress.FORCED)

CONTROL = "single-thread control"
MAX_TIME = "max-time"  # facts.partial.stopped_by of a run --max-time ended


class _TimeUp(Exception):
    """--max-time passed: stop every trial and report what had ended."""


def trial_key(task: ladder.Task, total: int) -> str:
    """How a trial is named in progress lines: `natural trial 2/3 (mitigation none)`."""
    return f"{task.stress.value} trial {task.index + 1}/{total} (mitigation {registry.label(task.row)})"


def thread_names(count: int) -> List[str]:
    return [f"drafter-{i}" for i in range(count)]


class _Trial:
    """One multi-thread trial in flight: one child, or for `processes` one child per worker plus a disturber."""

    def __init__(self, harness: "Harness", root: Path, task: Optional[ladder.Task], label: str,
                 key: str = "") -> None:
        self.task, self.label, self.harness, self.key = task, label, harness, key or CONTROL
        self.children: List[Tuple[PhaseSpec, Path, Child]] = []
        self.disturber: Optional[Tuple[PhaseSpec, Path, Child]] = None
        self.exits: Dict[int, ChildExit] = {}
        self.shared_cache = task is not None and harness.spec.shares_cache(task.stress, task.row)
        # Workers held back while the first of them fills the shared cache (_start_processes)
        self.deferred: List[Tuple[Path, str, PhaseSpec]] = []
        if task is None:  # the single-thread control
            self._start(root, label, harness.phase_spec("single", 1, (), thread_names(1), Stress.NATURAL))
        elif task.row and registry.get(task.row[0]).separate_processes:
            self._start_processes(root, task)
        else:
            self._start(root, label, harness.phase_spec("multi", harness.spec.threads, task.row,
                                                        thread_names(harness.spec.threads), task.stress))

    def _start(self, root: Path, label: str, spec: PhaseSpec) -> None:
        self.children.append((spec, *self.harness.start_child(root, label, spec, self.shared_cache)))

    def _start_processes(self, root: Path, task: ladder.Task) -> None:
        harness = self.harness
        if task.stress in (Stress.FORCED, Stress.STUCK, Stress.FOREIGN_TRACE):
            spec = harness.phase_spec("disturb", 0, (), [], task.stress)
            self.disturber = (spec, *harness.start_child(root, f"{self.label}-disturb", spec))
        calm = Stress.AMPLIFIED if task.stress is Stress.AMPLIFIED else Stress.NATURAL
        # Into a shared cache nobody has compiled into yet, the first worker goes alone and the others follow
        # once it ended, each then loading what it compiled: workers alone in their processes cannot race with
        # each other, so when they run cannot change what they meet (ReproSpec.shares_cache).
        one_first = self.shared_cache and not harness.shared.filled and harness.spec.shapes != "per-thread"
        for index, name in enumerate(thread_names(harness.spec.threads)):
            spec = harness.phase_spec("multi", 1, (), [name], calm)
            spec.shape_indices = [index if harness.spec.shapes == "per-thread" else 0]
            spec.devices = [harness.spec.devices[index % len(harness.spec.devices)]]
            if one_first and index > 0:
                self.deferred.append((root, f"{self.label}-proc{index}", spec))
            else:
                self._start(root, f"{self.label}-proc{index}", spec)

    def poll(self) -> Optional[dict]:
        """The phase result once every child has ended, else None."""
        timeout = self.harness.spec.timeout_s
        for index, (_, phase_dir, child) in enumerate(self.children):
            if index not in self.exits:
                ended = child.poll(timeout)
                if ended is not None:
                    self.exits[index] = ended
                    if self.shared_cache:
                        self.harness.shared.child_ended(phase_dir)
        if self.deferred and 0 in self.exits:  # the first worker has filled the cache: the rest start now
            for root, label, spec in self.deferred:
                self._start(root, label, spec)
            self.deferred.clear()
            return None
        if len(self.exits) < len(self.children):
            return None
        results = [read_phase_result(phase_dir, self.exits[i], spec)
                   for i, (spec, phase_dir, _) in enumerate(self.children)]
        self.harness.clean_caches([phase_dir for _, phase_dir, _ in self.children])
        if len(results) == 1 and self.disturber is None:
            return results[0]
        merged = merge_process_results(results)
        if self.disturber is not None:
            spec, phase_dir, child = self.disturber
            disturbed = read_phase_result(phase_dir, child.stop(), spec)
            merged["disturbance"] = f"{disturbed.get('disturbance')} (in a process of its own)"
        return merged

    def kill(self) -> None:
        self.deferred.clear()
        for _, _, child in self.children + ([self.disturber] if self.disturber else []):
            child.kill()


class Harness:
    def __init__(self, spec: ReproSpec, *, runner=None, progress: Reporter = silent,
                 clock: Callable[[], float] = time.perf_counter, workdir: Optional[Path] = None,
                 capabilities: Optional[Capabilities] = None, poll_s: float = POLL_S) -> None:
        self.spec = spec
        self.poll_s = poll_s  # between looks at the running children; a runner whose children end at once needs none
        self._started: List[Child] = []  # every child this run started, killed before its folder is removed
        self._interrupted = False
        # None: the run's own, made once its folder exists (warm_start.WarmStartRunner forks children from a
        # server that imported torch once); tests pass a runner of their own.
        self.runner = runner
        self.progress = progress
        self.clock = clock
        self.workdir = workdir
        self.capabilities = capabilities
        self._phase_counter = 0
        self.started = clock()
        self.control: Optional[dict] = None  # the control's result once it ended
        self.shared_fixes: List[str] = []  # rows whose every trial shares the run's cache (ReproSpec.shares_cache)
        self.shared = SharedCache()  # who compiles first into the run's shared cache (repro/sharing.py)
        self.results: List[ladder.TrialResult] = []  # the trials that ended, in order
        # Trials side by side share the cores: each child's inductor worker pool gets its share, not all of them.
        jobs = spec.effective_jobs
        self.compile_threads = max(2, (os.cpu_count() or 2) // jobs) if jobs > 1 else None

    # -- children ----------------------------------------------------------------------------------------
    def phase_spec(self, phase: str, threads: int, mitigation: Tuple[str, ...], names: List[str],
                   stress: Stress) -> PhaseSpec:
        spec = self.spec
        shape_indices = [i if spec.shapes == "per-thread" else 0 for i in range(threads)]
        return PhaseSpec(phase=phase, threads=threads, devices=list(spec.devices), backward=spec.effective_backward,
                         checkpoint=spec.checkpoint, shape_indices=shape_indices, steps=spec.steps,
                         hang_after_s=spec.hang_after_s, mode=stress.value, mitigation=list(mitigation),
                         amplify_ms=spec.amplify_ms, preset=spec.preset, model=spec.model, thread_names=names,
                         disturb_hold_s=spec.timeout_s, model_compile=spec.model_compile, step=spec.step)

    def start_child(self, root: Path, label: str, phase_spec: PhaseSpec,
                    shared_cache: bool = False) -> Tuple[Path, Child]:
        """Start one child in a folder of its own; it compiles into that folder's caches (a cold cache), or with
        `shared_cache` into the one the run's flag-held trials share (ReproSpec.shared_cache_stresses)."""
        self._phase_counter += 1
        phase_dir = root / f"{self._phase_counter:03d}-{label}"
        phase_spec.timing_free = shared_cache
        spec_path = write_spec(phase_dir, phase_spec)
        env = child_env(root / "shared-cache" if shared_cache else phase_dir, self.spec.cache == "cold",
                        compile_threads=self.compile_threads,
                        user_code=self.spec.user_code)
        child = self.runner.start(spec_path, phase_dir / "result.json", env, phase_dir / "log.txt",
                                  user_code=self.spec.user_code)
        self._started.append(child)
        return phase_dir, child

    def clean_caches(self, phase_dirs: Sequence[Path]) -> None:
        if self.spec.cache == "cold":
            for phase_dir in phase_dirs:
                shutil.rmtree(phase_dir / "inductor-cache", ignore_errors=True)
                shutil.rmtree(phase_dir / "triton-cache", ignore_errors=True)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def tell(self, kind: EventKind, key: str, text: str, at_s: Optional[float] = None, step: Optional[int] = None,
             total: Optional[int] = None) -> None:
        at = self.elapsed() if at_s is None else at_s
        self.progress(ProgressEvent(kind, key, text, round(at, 3), step, total))

    # -- the plan ----------------------------------------------------------------------------------------
    def plan(self, matrix: bool, caps: Capabilities) -> Tuple[ladder.Row, List[ladder.Row], ladder.Row]:
        """(baseline, every row in scheduling order, the row whose verdict is the headline)."""
        spec = self.spec
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

    # -- a whole run -------------------------------------------------------------------------------------
    def run(self, matrix: bool = False) -> Report[ReproFacts]:
        root = Path(tempfile.mkdtemp(prefix="dflash-repro-", dir=self.workdir))
        own_runner = self.runner is None
        if own_runner:
            from dflash_doctor.repro.warm_start import WarmStartRunner

            self.runner = WarmStartRunner(root, clock=self.clock)
        try:
            return self._run(root, matrix)
        finally:
            # Every child first (kill() is a no-op for one that ended): a signal leaves trials running, and a
            # disturbance child that writes its result.json after the folder is removed makes it again.
            for child in self._started:
                child.kill()
            if self._interrupted:  # the signal may have landed inside start_child, after the child's start and
                from dflash_doctor import children  # before it was listed here; the registry has every one

                children.stop_all(reopen=True)
            if own_runner:
                self.runner.close()
            shutil.rmtree(root, ignore_errors=True)

    def _run(self, root: Path, matrix: bool) -> Report[ReproFacts]:
        spec = self.spec
        caps = self.capabilities or assess(spec.effective_backward, spec.on_cpu, user_code=spec.user_code)
        for line in caps.cannot_show:
            self.tell(EventKind.NOTE, "note", f"note: {line}")
        if spec.shared_cache_stresses:
            self.tell(EventKind.NOTE, "note", f"note: {' and '.join(s.value for s in spec.shared_cache_stresses)} "
                      "trials share one compile cache: the FX flag is up for their whole run and no backward can "
                      "deadlock, so a compile's length cannot change them; every other trial compiles cold")
        baseline, rows, headline = self.plan(matrix, caps)
        self.shared_fixes = [row.label for row in rows if row.names
                             and spec.shares_cache(Stress.NATURAL, row.names)]
        if self.shared_fixes:
            self.tell(EventKind.NOTE, "note", f"note: every {', '.join(self.shared_fixes)} trial shares one "
                      "compile cache: a worker alone in its process has no second thread to race with, and the "
                      "disturbances run in a process of their own, so a compile's length cannot change them")
        needs_control = any(s in (Stress.NATURAL, Stress.AMPLIFIED) for row in rows for s in row.runnable())
        stopped: Optional[str] = None
        try:
            control, results = self._execute(root, rows, needs_control)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the report is made of the trials that had ended
            from dflash_doctor.errors import stop_signal

            self._interrupted = True
            stopped, control, results = stop_signal(exc), self.control, self.results
        except _TimeUp:  # the same partial report, with the verdict's own exit code where there is one
            stopped, control, results = MAX_TIME, self.control, self.results
        report: Report[ReproFacts] = Report(command="repro")
        settings = self._base_facts(control, caps)
        if control is not None and control.get("usage_error"):
            from dflash_doctor.errors import UsageError

            raise UsageError(control["usage_error"])
        single = phase_facts(control) if control is not None else None
        if control is not None:
            report.problems.extend(_problems(control))
            if control.get("outcome") != ThreadOutcome.OK:
                return self._control_failed(report, settings, single, control)
        if stopped is not None:
            return self._stopped(report, settings, single, stopped, rows, baseline, headline, matrix)
        facts = report.facts = {**settings, "single_thread": single, **self._headline_facts(headline, baseline)}
        if matrix:
            facts["matrix"] = [self._matrix_row(row, baseline) for row in self._matrix_order(rows)]
        report.problems.extend(Problem(p["subject"], p["reason"], p.get("hint", ""))
                               for result in results for p in result.problems)
        from dflash_doctor.repro.next_steps import next_steps
        from dflash_doctor.repro.findings import findings_from_facts

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

    def _execute(self, root: Path, rows: List[ladder.Row], needs_control: bool):
        """Run the control and every trial the rows ask for, `jobs` at a time; returns (control, trial results).
        Both are kept on self as they arrive, for the partial report should a signal stop the run."""
        running: List[_Trial] = []
        results: List[ladder.TrialResult] = self.results
        control: Optional[dict] = None
        try:
            if needs_control:
                self.tell(EventKind.STARTED, CONTROL, f"one worker, {self.spec.cache} compile cache")
                running.append(_Trial(self, root, None, "single"))
                if self.spec.effective_jobs == 1:  # nothing fits beside it: wait; a broken step stops the run
                    control = self._wait(running[0])
                    running.clear()
                    if control.get("outcome") != ThreadOutcome.OK:
                        return control, results
            return self._drive(root, rows, running, results, control)
        finally:
            for trial in running:  # an error, Ctrl-C or SIGTERM: no child outlives the run
                trial.kill()

    def _drive(self, root: Path, rows: List[ladder.Row], running: List["_Trial"],
               results: List[ladder.TrialResult], control: Optional[dict]):
        jobs = self.spec.effective_jobs
        by_row = {row.names: row for row in rows}
        while True:
            self._stop_at_max_time()
            for row in rows:
                for task in row.next_tasks():
                    if len(running) >= jobs:
                        break
                    if not self.shared.may_start(self.spec.shares_cache(task.stress, task.row)):
                        continue
                    row.mark_started(task)
                    label = f"{row.label.replace(',', '+')}-{task.stress.value}-t{task.index + 1}"
                    total = row.trials[task.stress]
                    key = trial_key(task, total)
                    self.tell(EventKind.STARTED, key, key, step=task.index + 1, total=total)
                    trial = _Trial(self, root, task, label, key)
                    running.append(trial)
                    self.shared.started(trial, trial.shared_cache)
            if not running:
                return control, results
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
                    control = self.control = result
                    self._control_ended(result)
                    if result.get("outcome") != ThreadOutcome.OK:
                        return control, results
                    continue
                outcome, said = self._trial_result(trial, result)
                by_row[trial.task.row].record(outcome)
                results.append(outcome)
                # announced once recorded: what it says is in the report, should a signal come now
                self.tell(EventKind.FINISHED, trial.key, said, at_s=outcome.finished_at_s)

    def _stop_at_max_time(self) -> None:
        limit = self.spec.max_time_s
        if limit is not None and self.elapsed() >= limit:
            raise _TimeUp()  # _execute kills what runs; what had ended is the report

    def _wait(self, trial: _Trial) -> dict:
        while True:
            self._stop_at_max_time()
            result = trial.poll()
            if result is not None:
                self.control = result  # kept before it is announced, for a partial report
                self._control_ended(result)
                return result
            time.sleep(self.poll_s)

    def _control_ended(self, result: dict) -> None:
        self.tell(EventKind.FINISHED, CONTROL, str(result.get("outcome")))

    def _trial_result(self, trial: _Trial, result: dict) -> Tuple[ladder.TrialResult, str]:
        """The trial's result, and the words that announce its end."""
        task = trial.task
        assert task is not None, "the control is not a trial"
        if result.get("usage_error"):
            from dflash_doctor.errors import UsageError

            raise UsageError(result["usage_error"])
        kind, blame = classify_phase(result)
        problems = list(result.get("problems") or [])
        subject = f"{task.stress.value} trial {task.index + 1} ({registry.label(task.row)})"
        no_verdict = bool(result.get("timed_out_busy") or result.get("crash"))
        if result.get("crash"):  # the child died without a word: that is the harness's failure, not a race
            kind, blame = None, []
            problems.append({"subject": subject, "reason": f"the trial's child {result['crash']}",
                             "hint": "its log tail is in the JSON facts (multi_thread.log_tail)"})
        elif no_verdict:
            kind, blame = None, []
            problems.append({"subject": subject,
                             "reason": f"still making progress when --timeout ({self.spec.timeout_s:.0f} s) "
                                       "ended it: no verdict",
                             "hint": "raise --timeout (cold compiles of several shapes take a while on a busy "
                                     "machine)"})
        phase = phase_facts(result)
        if result.get("processes"):
            phase["processes"] = result["processes"]
        seconds = float(result.get("seconds") or 0.0)
        said = f"reproduced ({kind})" if kind else ("no verdict" if no_verdict else
                                                     f"not reproduced ({result.get('outcome')})")
        finished_at = self.elapsed()  # the one time this trial's end is given: progress, verdict and JSON
        outcome = ThreadOutcome(result.get("outcome", ThreadOutcome.ERROR))
        # ladder.TrialResult keeps the phase as the plain dict it is at run time; _phase() reads it back typed.
        return ladder.TrialResult(task, kind, outcome, seconds, finished_at, cast(dict, phase),
                                  tuple(blame), tuple(problems), no_verdict, result.get("cpu_s")), said

    # -- facts -------------------------------------------------------------------------------------------
    def _cpu_facts(self) -> CpuFacts:
        """The CPU the control and the trials that ended used, and that CPU spread over every core (CpuFacts). The
        warm-start server's one import (beside the control) and trials stopped once their row had its verdict
        are left out."""
        counted = [r.cpu_s for r in self.results if r.cpu_s is not None]
        if self.control is not None and self.control.get("cpu_s") is not None:
            counted.append(float(self.control["cpu_s"]))
        cores = os.cpu_count() or 1
        total = round(sum(counted), 1)
        return {"children_s": total, "children": len(counted), "cores": cores, "bound_s": round(total / cores, 1)}

    def _base_facts(self, control: Optional[dict], caps: Capabilities) -> SettingsFacts:
        spec = self.spec
        facts: SettingsFacts = {
            "torch_version": (control or {}).get("torch_version") or caps.torch_version,
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
            "capabilities": caps.to_dict(),
        }
        if spec.mode in ("auto", "amplified"):
            facts["amplify_ms"] = spec.amplify_ms
        return facts

    def _headline_facts(self, row: ladder.Row, baseline: ladder.Row) -> HeadlineFacts:
        level = ladder.headline_level(row)
        first = row.failed()
        done = [r for s in STRESS_ORDER for r in row.done_at(s)]
        chosen = first or (done[-1] if done else None)
        phase = _phase(chosen) if chosen else None
        verdict = "reproduced" if first else ("not-reproduced" if any(not r.no_verdict for r in done) else None)
        if first is not None and not row.names and self.spec.user_code and ladder.own_level(row) is None:
            verdict = REPRODUCED_IF_TRACED  # only a trace of the tool's own made the user's step fail
        at = level or next((s for s in reversed(STRESS_ORDER) if row.done_at(s)), None)
        tally = _levels(row)
        counted = tally.get(at.value) if at else None
        facts: HeadlineFacts = {
            "verdict": verdict, "kind": first.kind if first else None, "level": level.value if level else None,
            "levels": tally, "blame": _blame(chosen) if chosen else [], "multi_thread": phase,
            "hang": phase.get("hang") if phase is not None else None,
            "trials": [{"stress": r.task.stress.value, "trial": r.task.index + 1, "outcome": r.outcome,
                        "kind": r.kind, "seconds": round(r.seconds, 3)} for r in done],
            "reproduction_rate": round(counted["reproduced"] / counted["ran"], 3) if counted and counted["ran"]
            else None,
            "time_to_verdict_s": round(first.finished_at_s if first else self.elapsed(), 3),
            "wall_s": round(self.elapsed(), 3),
            "cpu": self._cpu_facts(),
        }
        started = getattr(self.runner, "warm_start_facts", None)  # the warm-start runner's: how children started
        if started is not None:
            facts["warm_start"] = started()
        shim = phase.get("shim") if phase else None
        if phase and shim:
            facts["shim"] = {**shim, "self_check": phase.get("shim_check")}
        if row.names:
            outcome, reason = ladder.judge(row, baseline)
            facts["outcome"], facts["outcome_reason"] = outcome.value, reason
            facts["baseline_levels"] = _levels(baseline)
        # Every race the baseline showed, under which stress first, and whether only an injected trace made it: the
        # advice must cover each of them (next_steps.py), not only the headline's first.
        facts["baseline_reproduced"] = [
            {"kind": kind.value, "stress": stress.value, "injected": stress in ladder.INJECTED}
            for kind in ladder.reproduced_kinds(baseline)
            for stress in [next(s for s in STRESS_ORDER if any(r.kind == kind for r in baseline.done_at(s)))]]
        return facts

    @staticmethod
    def _matrix_order(rows: List[ladder.Row]) -> List[ladder.Row]:
        """The matrix as it is shown: no mitigation first, then the registry's order."""
        order = [(), *registry.MATRIX[1:]]
        return sorted(rows, key=lambda r: order.index(r.names) if r.names in order else -1)

    def _matrix_row(self, row: ladder.Row, baseline: ladder.Row) -> MatrixRowFacts:
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
            "stresses": _levels(row), "steps_per_s": _phase(clean).get("steps_per_s") if clean else None,
            "seconds": round(max((r.seconds for s in STRESS_ORDER for r in row.done_at(s)), default=0.0), 3),
            "cpu_s": round(sum(r.cpu_s or 0.0 for s in STRESS_ORDER for r in row.done_at(s)), 1),
            "outcome": outcome, "reason": reason}
        if row.names:
            entry["covers"] = sorted(h.value for h in registry.covers(row.names))
            entry["caveats"] = list(registry.caveats_for(row.names))
        return entry

    def _stopped(self, report: Report[ReproFacts], settings: SettingsFacts, single: Optional[PhaseFacts],
                 signal_name: str, rows: List[ladder.Row], baseline: ladder.Row, headline: ladder.Row,
                 matrix: bool) -> Report[ReproFacts]:
        """The report of a run a signal or --max-time ended: the verdict so far, its findings and, for the matrix,
        the rows with a trial that ended (each says whether all of its trials did); no advice drawn from a
        part-run."""
        from dflash_doctor.repro.findings import findings_from_facts

        facts = report.facts = {**settings, "single_thread": single, **self._headline_facts(headline, baseline)}
        if matrix:  # the rows with a trial that ended, each saying whether all of its trials did
            ended = {result.task.row for result in self.results}
            facts["matrix"] = [{**self._matrix_row(row, baseline), "finished": row.finished()}
                               for row in self._matrix_order(rows) if row.names in ended]
        report.findings.extend(findings_from_facts(facts))
        # "none" is the baseline's label, and would read as "nothing": the words name it
        unfinished = [row.label if row.names else "the baseline (no mitigation)" for row in rows
                      if not row.finished()]
        said = (f"{len(self.results)} trial(s) had ended; "
                + (f"not finished: {', '.join(unfinished)}" if unfinished else "every row had finished"))
        if signal_name != MAX_TIME:
            report.mark_stopped(signal_name, said)
            return report
        from dflash_doctor.findings import stopped_facts

        # A deadline is no signal: a verdict found in time stands (exit 1), and an unfinished row reads
        # inconclusive, never holds (ladder.judge); with no verdict yet the run failed to answer (exit 3).
        facts["partial"] = stopped_facts(MAX_TIME, said)
        report.problems.append(Problem("repro", f"stopped at --max-time {self.spec.max_time_s:g} s: {said}",
                                       "raise --max-time, or lower --trials / --jobs' load on this machine"))
        found = facts["verdict"] in ("reproduced", REPRODUCED_IF_TRACED)
        report.exit_code_override = verdict_exit_code(facts["verdict"]) if found else EXIT_HARNESS_FAILURE
        return report

    def _control_failed(self, report: Report[ReproFacts], settings: SettingsFacts, single: Optional[PhaseFacts],
                        control: dict) -> Report[ReproFacts]:
        failed = [t for t in control.get("threads", []) if t.get("error")]
        reason = failed[0]["error"] if failed else control.get("crash") or f"outcome {control.get('outcome')}"
        report.problems.append(Problem(
            "single-thread phase", f"the step fails in one thread, so threads cannot be blamed: {reason}",
            "fix the step (or the --model factory) first; the child's log tail is in the JSON facts"))
        report.facts = {**settings, "single_thread": single, "multi_thread": None, "verdict": "not-reproduced",
                        "kind": None, "blame": [], "level": None, "time_to_verdict_s": round(self.elapsed(), 3)}
        report.exit_code_override = EXIT_HARNESS_FAILURE
        return report


def verdict_exit_code(verdict: Optional[str]) -> int:
    """repro's exit code for a verdict a run reached (harness failures are decided before)."""
    if verdict == "reproduced":
        return EXIT_REPRODUCED
    if verdict == REPRODUCED_IF_TRACED:
        return EXIT_REPRODUCED_IF_TRACED
    return EXIT_NOT_REPRODUCED


# ladder.py keeps what a trial left as plain dicts (it is scheduling data); these read them back as the model
# says they are: phase_facts made the phase, the child's recorder the blame, Row.tally the tallies.
def _phase(result: ladder.TrialResult) -> PhaseFacts:
    return cast(PhaseFacts, result.phase)


def _blame(result: ladder.TrialResult) -> List[BlameFacts]:
    return [cast(BlameFacts, entry) for entry in result.blame]


def _levels(row: ladder.Row) -> Dict[str, LevelFacts]:
    return cast(Dict[str, LevelFacts], row.tally())


def _problems(result: dict) -> List[Problem]:
    return [Problem(p["subject"], p["reason"], p.get("hint", "")) for p in result.get("problems") or []]


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


__all__ = ["EXIT_HARNESS_FAILURE", "EXIT_NOT_REPRODUCED", "EXIT_REPRODUCED", "Harness", "run_repro", "trace_phases"]
