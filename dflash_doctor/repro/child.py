"""One phase of a repro, run in its own process: `python -m dflash_doctor.repro.child SPEC.json RESULT.json`.

Fresh Dynamo state per phase. Order matters: mitigations first (the shim must precede every compile wrapper),
then the flight recorder, the mode's amplifier, the steps (building them creates no wrapper), warm-up, the
watchdog, the mode's disturbance, and finally the worker threads. The result (outcomes, events, blame, and on a
hang the classified stacks) is a phase_record.PhaseRecord, written atomically to RESULT.json through that module,
the one the parent reads it with; on a hang the watchdog writes it and ends the process, since the stuck threads
never return.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Dict, List, Optional

from dflash_doctor.findings import Problem
from dflash_doctor.hazards import Stress
from dflash_doctor.outcomes import RecorderEventKind, ThreadOutcome
from dflash_doctor.repro import phase_record
from dflash_doctor.repro.phase_record import PhaseRecord, SetupReport, ThreadRecord, TracingThreadRecord
from dflash_doctor.repro.spec import PhaseSpec
from dflash_doctor.runtime.deadlock import HangDiagnosis
from dflash_doctor.runtime.recorder import FlightRecorder
from dflash_doctor.runtime.stacks import ThreadStack

FAULTHANDLER_GRACE_S = 15.0  # the C-level stack dump fires this long after the Python watchdog should have
OVERLAP_PAUSE_S = 0.001


def _cpu_seconds() -> Optional[float]:
    """CPU seconds this child and its compile workers used (a forked child's count starts at its fork): what the
    harness adds up into facts.cpu."""
    from dflash_doctor.runtime.watchdog import process_tree_cpu_seconds

    try:
        return round(process_tree_cpu_seconds(), 3)
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable: the count is left out, not the result
        return None


@dataclass
class WorkerState:
    """One worker's part of the result while the phase runs (its own thread fills it in); sealed at the end."""

    name: str
    outcome: ThreadOutcome = ThreadOutcome.RUNNING
    error: Optional[str] = None
    steps: int = 0
    seconds: float = 0.0
    traceback: Optional[str] = None
    autograd_multithreading: Optional[bool] = None
    switches: Optional[Dict[str, str]] = None
    lazy_backward_compiles: Optional[int] = None

    def sealed(self) -> ThreadRecord:
        return ThreadRecord(self.name, self.outcome, self.error, self.steps, self.seconds, self.traceback,
                            self.autograd_multithreading, None if self.switches is None else dict(self.switches),
                            self.lazy_backward_compiles)


@dataclass
class PhaseDraft:
    """The phase's result while it runs: what PhaseChild.finish seals into a PhaseRecord with the outcome, the
    recorder's events and blames, and the times."""

    problems: List[Problem] = field(default_factory=list)
    setups: Dict[str, Any] = field(default_factory=dict)  # what the mitigations' set-up hooks returned, merged
    setup: SetupReport = field(default_factory=SetupReport)  # ... read as the record has it
    warmup_s: List[float] = field(default_factory=list)
    hang: Optional[HangDiagnosis] = None
    stacks: List[ThreadStack] = field(default_factory=list)
    setup_s: Optional[float] = None
    run_s: Optional[float] = None
    disturbance: Optional[str] = None
    tracing_thread: Optional[TracingThreadRecord] = None
    torch_version: Optional[str] = None
    python: Optional[str] = None
    pid: Optional[int] = None
    gc_frozen: Optional[int] = None
    usage_error: Optional[str] = None


class PhaseChild:
    def __init__(self, spec: PhaseSpec, result_path: Path, clock=time.perf_counter) -> None:
        self.spec = spec
        self.result_path = result_path
        self.clock = clock
        self.draft = PhaseDraft()
        self.thread_results: List[WorkerState] = []
        # Plain data until run() installs its hooks into torch (runtime.install).
        self.recorder = FlightRecorder(clock=clock)
        self._written = threading.Lock()
        self._fault_file: Optional[IO[str]] = None
        self.started = clock()
        self._first_steps_lock = threading.Lock()
        self._first_steps_pending = spec.threads
        self._disturbance = None  # the mode's disturbance while the workers run (foreign-trace asks them to stay)
        self._traces_at_start = 0
        self._lazy_backward: dict = {}  # thread name -> backward graphs it compiled lazily

    # -- set-up ------------------------------------------------------------------------------------------
    def install_mitigations(self) -> None:
        """Each requested mitigation's process-wide set-up (mitigations.py), before any compile wrapper exists."""
        from dflash_doctor import mitigations as registry

        for name in self.spec.mitigation:
            entry = registry.get(name)
            if entry.setup is None:
                continue
            try:
                reported = {**self.draft.setups, **entry.setup()}
            except registry.MitigationFailed as exc:
                self.draft.problems.append(Problem(name, str(exc),
                                                   "this torch cannot apply it; the run went on without it"))
                continue
            # read as the record will have it now: a hook reporting a key the record has no field for fails here
            self.draft.setup, self.draft.setups = SetupReport.from_setups(reported), reported

    def wrap_steps(self, steps):
        from dflash_doctor import mitigations as registry

        for name in self.spec.mitigation:
            wrap = registry.get(name).wrap_step
            if wrap is not None:
                steps = [wrap(step) for step in steps]
        return steps

    def warm_up_wanted(self) -> bool:
        from dflash_doctor import mitigations as registry

        return any(registry.get(name).warm_up for name in self.spec.mitigation)

    # -- running -----------------------------------------------------------------------------------------
    def _first_step_over(self) -> None:
        with self._first_steps_lock:
            self._first_steps_pending -= 1

    def _overlap_wanted(self, own_steps_done_at: float) -> bool:
        """After its own steps a worker goes on stepping while another worker is still in its first step: in
        training, warm threads keep calling compiled code while a cold one compiles, and that overlap is the
        race. Beside a foreign trace it also goes on until it has met enough of the tracer's traces
        (Disturbance.wants_company). Capped at --hang-after, so a thread stuck in its first step cannot hide behind
        busy peers."""
        if self.clock() - own_steps_done_at >= self.spec.hang_after_s:
            return False
        if self._disturbance is not None and self._disturbance.wants_company(self._traces_at_start):
            return True
        return self._first_steps_pending > 0

    def worker(self, index: int, step, barrier: threading.Barrier) -> None:
        """One worker thread: every per-thread switch of the mitigations (mitigations.in_each_thread) held
        around all of its steps, as a trainer's worker would."""
        from dflash_doctor import mitigations as registry

        with registry.in_each_thread(self.spec.mitigation)():
            self.record_thread_switches(self.thread_results[index])
            self.work(index, step, barrier)

    def record_thread_switches(self, record: WorkerState) -> None:
        import torch

        from dflash_doctor import mitigations as registry

        # Read inside the worker: the switch is thread-local, so the main thread's value says nothing. Every switch
        # the applied mitigations declare is read here too: compile settings are per thread from torch 2.12, so
        # this is where a set-up is seen to reach (or miss) the worker.
        record.autograd_multithreading = bool(torch.autograd.is_multithreading_enabled())
        record.switches = {switch.setting: repr(switch.read()) for name in self.spec.mitigation
                           for switch in registry.get(name).switches}

    def count_lazy_backward_compiles(self) -> None:
        """Each worker's backward compiles made lazily, at its first backward (thread_config.watch_lazy_backward):
        0 with non-lazy backward in effect there. On a CPU the
        backward runs in the worker; on a GPU the autograd device thread runs it, so the count is the device
        thread's and the workers read 0 either way."""
        for record in self.thread_results:
            record.lazy_backward_compiles = self._lazy_backward.get(record.name, 0)

    def _lazy_backward_in(self, thread: str) -> None:
        with self._written:
            self._lazy_backward[thread] = self._lazy_backward.get(thread, 0) + 1

    def work(self, index: int, step, barrier: threading.Barrier) -> None:
        record = self.thread_results[index]
        try:
            barrier.wait(60.0)
        except threading.BrokenBarrierError:
            record.outcome, record.error = ThreadOutcome.ERROR, "start barrier broken"
            self._first_step_over()
            return
        started = self.clock()
        own_steps_done_at = None
        try:
            while own_steps_done_at is None or self._overlap_wanted(own_steps_done_at):
                with self.recorder.step(record.steps):
                    step()
                record.steps += 1
                if record.steps == 1:
                    self._first_step_over()
                if own_steps_done_at is None and record.steps >= self.spec.steps:
                    own_steps_done_at = self.clock()
                if own_steps_done_at is not None:
                    time.sleep(OVERLAP_PAUSE_S)  # lets a thread waiting on a lock the step takes get it
            record.outcome = ThreadOutcome.OK
        except Exception as exc:  # noqa: BLE001 - every failure is the data this harness collects
            record.outcome, record.error = ThreadOutcome.ERROR, f"{type(exc).__name__}: {exc}"
            record.traceback = traceback.format_exc(limit=12)
            if record.steps == 0:
                self._first_step_over()  # a dead thread holds nobody back
        record.seconds = round(self.clock() - started, 6)

    def on_hang(self, report) -> None:
        self.draft.hang, self.draft.stacks = report.diagnosis, list(report.stacks)
        self.recorder.record(RecorderEventKind.HANG, "I", cycle=report.diagnosis.cycle)
        for record in self.thread_results:
            if record.outcome == ThreadOutcome.RUNNING:
                record.outcome = ThreadOutcome.HUNG
        self.finish(ThreadOutcome.HUNG)
        os._exit(0)

    def finish(self, outcome: ThreadOutcome) -> None:
        if not self._written.acquire(blocking=False):
            return
        draft = self.draft
        phase_record.write(self.result_path, PhaseRecord(
            phase=self.spec.phase, outcome=outcome, seconds=round(self.clock() - self.started, 6),
            threads=tuple(record.sealed() for record in self.thread_results), events=tuple(self.recorder.events),
            blame=tuple(self.recorder.blames), problems=tuple(draft.problems), hang=draft.hang,
            stacks=tuple(draft.stacks), setup=draft.setup, warmup_s=tuple(draft.warmup_s), setup_s=draft.setup_s,
            run_s=draft.run_s, disturbance=draft.disturbance, tracing_thread=draft.tracing_thread,
            torch_version=draft.torch_version, python=draft.python, pid=draft.pid, gc_frozen=draft.gc_frozen,
            cpu_s=_cpu_seconds(), usage_error=draft.usage_error))

    def rearm_faulthandler(self) -> None:
        import faulthandler

        if self._fault_file is not None:
            faulthandler.dump_traceback_later(self.spec.hang_after_s + FAULTHANDLER_GRACE_S, repeat=False,
                                              file=self._fault_file, exit=False)

    def run(self) -> None:
        import torch

        from dflash_doctor import runtime
        from dflash_doctor.runtime import thread_config
        from dflash_doctor.repro import disturb
        from dflash_doctor.repro.steps import build_thread_steps

        import gc

        spec = self.spec
        # gc_frozen: objects kept out of this child's collections (a timing-free child forked from the warm-start
        # server keeps the server's; any other child has none, as a fresh interpreter)
        draft = self.draft
        draft.torch_version, draft.python = torch.__version__, sys.version.split()[0]
        draft.pid, draft.gc_frozen = os.getpid(), gc.get_freeze_count()
        self._fault_file = open(self.result_path.with_name("faulthandler.txt"), "w", encoding="utf-8")
        self.install_mitigations()
        runtime.install(self.recorder)
        thread_config.watch_lazy_backward(self._lazy_backward_in)
        if spec.mode == Stress.AMPLIFIED.value:
            disturb.install_amplifier(spec.amplify_ms, on_sleep=self.recorder.mark_progress)
        self.started = self.clock()
        if spec.phase == "disturb":
            self.run_disturbance_only()
            return
        self.thread_results = [WorkerState(name) for name in spec.thread_names]
        steps = self.wrap_steps(build_thread_steps(spec))
        if self.warm_up_wanted():
            draft.warmup_s = [round(s, 6) for s in runtime.warmup(steps, clock=self.clock)]
        draft.setup_s = round(self.clock() - self.started, 6)
        watchdog = runtime.Watchdog(lambda: self.recorder.last_progress, spec.hang_after_s, self.on_hang,
                                    clock=self.clock)
        self.recorder.record(RecorderEventKind.NOTE, "I", message="workers starting")
        self.rearm_faulthandler()
        watchdog.start()
        disturbance = self.start_disturbance()
        if disturbance is not None and disturbance.traces is not None:
            self._disturbance, self._traces_at_start = disturbance, disturbance.traces[0]
        barrier = threading.Barrier(spec.threads)
        workers = [threading.Thread(target=self.worker, args=(i, step, barrier), name=spec.thread_names[i],
                                    daemon=True) for i, step in enumerate(steps)]
        workers_started = self.clock()
        for thread in workers:
            thread.start()
        phase_record.write_thread_names(self.result_path.with_name("threads.json"),
                                        {thread.ident: thread.name for thread in workers if thread.ident is not None})
        for thread in workers:
            while thread.is_alive():
                thread.join(1.0)
                if self.clock() - watchdog.last_alive() < spec.hang_after_s:
                    self.rearm_faulthandler()
        draft.run_s = round(self.clock() - workers_started, 6)
        self.count_lazy_backward_compiles()
        watchdog.stop()
        if disturbance is not None:
            disturbance.stop()
            self.keep_tracing_thread(disturbance)
        tracer = draft.tracing_thread
        ok = all(r.outcome == ThreadOutcome.OK for r in self.thread_results) and not (
            tracer is not None and tracer.outcome == ThreadOutcome.ERROR)
        outcome = ThreadOutcome.OK if ok else ThreadOutcome.ERROR
        self.finish(outcome)

    def keep_tracing_thread(self, disturbance) -> None:
        """The foreign-trace stress's thread is the user's (a profiler): how it ended is part of the result."""
        if disturbance.traces is None:
            return
        self.draft.tracing_thread = TracingThreadRecord(
            disturbance.threads[0].name if disturbance.threads else "fx-profiler",
            ThreadOutcome.ERROR if disturbance.errors else ThreadOutcome.OK,
            disturbance.errors[0] if disturbance.errors else None, disturbance.traces[0])

    def make_disturbance(self, hold_s: float):
        from dflash_doctor import mitigations as registry
        from dflash_doctor.repro import disturb

        if self.spec.mode == Stress.FORCED.value:
            return disturb.hold_fx_flag(hold_s)
        if self.spec.mode == Stress.STUCK.value:
            return disturb.leave_fx_flag_stuck()
        if self.spec.mode == Stress.FOREIGN_TRACE.value:
            return disturb.trace_alongside(hold_s, around=registry.around_foreign_trace(self.spec.mitigation))
        return None

    def start_disturbance(self):
        if self.spec.phase != "multi":
            return None
        disturbance = self.make_disturbance(self.spec.hang_after_s * 4)
        if disturbance is not None:
            self.draft.disturbance = disturbance.description
        return disturbance

    def run_disturbance_only(self) -> None:
        """The `processes` mitigation: the mode's disturbance in a process of its own, beside the workers."""
        # Nothing in this process reaches the workers' processes, so the CPU it gets cannot change what they meet:
        # it takes only what they leave (a tracing loop would otherwise hold a core of theirs for the whole trial).
        try:
            os.nice(19)
        except OSError:  # not allowed here: it runs at its usual priority
            pass
        disturbance = self.make_disturbance(self.spec.disturb_hold_s + 5.0)
        self.draft.disturbance = disturbance.description if disturbance else None
        self.finish(ThreadOutcome.OK)
        time.sleep(self.spec.disturb_hold_s)
        if disturbance is not None:
            disturbance.stop()


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    spec = PhaseSpec.from_dict(json.loads(spec_path.read_text(encoding="utf-8")))
    child = PhaseChild(spec, result_path)
    from dflash_doctor.errors import UsageError

    try:
        child.run()
    except UsageError as exc:  # a --model that cannot be imported or built: one line for the user, no traceback
        child.draft.usage_error = str(exc)
        child.finish(ThreadOutcome.ERROR)
        return 2
    except BaseException as exc:  # noqa: BLE001 - the parent must get a result, whatever broke here
        child.draft.problems.append(Problem(f"{spec.phase}-thread phase", f"{type(exc).__name__}: {exc}",
                                            traceback.format_exc(limit=8)))
        child.finish(ThreadOutcome.ERROR)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
