"""Target and drafter workers as threads of one process (the seeds' design), joined by a bounded queue.

A run is four steps: start (set-up in a thread of its own, then the workers), supervise (steps, a dead worker,
a stall, a stop signal), shut down (stop event, bounded joins), collect (the result). Every blocking call of a
worker (queue put/get, the gradient rendezvous) waits in slices of `poll_s` and checks the stop event, so when any
worker dies the others leave within a slice and the run ends with that worker named. A thread stuck inside torch
(a deadlocked compile) cannot be ended: it is reported hung, with every thread's stack and the classified cycle.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
import traceback
from functools import partial
from typing import TYPE_CHECKING, Callable, List, Optional

from dflash_doctor.reference.results import (
    FAILED, Outcome, PipelineResult, Progress, RunPlan, StepAggregator, WorkerOutcome,
)
from dflash_doctor.reference.signals import StopRequest, stop_signals

if TYPE_CHECKING:
    from dflash_doctor.reference.setup import ThreadWorld
    from dflash_doctor.reference.training import StreamHandoff, TargetBatch
    from dflash_doctor.runtime import FlightRecorder, HangReport

LOG = logging.getLogger("dflash_doctor.reference")
STALLED_JOIN_S = 5.0  # after a stall the stuck threads never return: wait this long, not the join timeout


class Stopped(Exception):
    """The run is stopping (finished, or another worker died): leave quietly."""


class Run:
    """What the threads share: the stop event, the first failure, and the stop-aware blocking calls."""

    def __init__(self, poll_s: float):
        self.poll_s = poll_s
        self.stop = threading.Event()
        self.failed = threading.Event()
        self.failed_worker: Optional[str] = None
        self._lock = threading.Lock()

    def fail(self, name: str) -> None:
        with self._lock:
            if self.failed_worker is None:
                self.failed_worker = name
        self.failed.set()
        self.stop.set()

    def put(self, q: queue.Queue, item) -> None:
        while True:
            if self.stop.is_set():
                raise Stopped
            try:
                q.put(item, timeout=self.poll_s)
                return
            except queue.Full:
                continue

    def get(self, q: queue.Queue):
        while True:
            if self.stop.is_set():
                raise Stopped
            try:
                return q.get(timeout=self.poll_s)
            except queue.Empty:
                continue


class GradientAverager:
    """A stop-aware rendezvous of the drafter replicas: each deposits its gradients, each reads their mean."""

    def __init__(self, replicas: int, run: Run):
        self.replicas, self.run = replicas, run
        self.slots: list = [None] * replicas
        self.cond = threading.Condition()
        self.arrived = 0
        self.generation = 0

    def _rendezvous(self) -> None:
        with self.cond:
            generation = self.generation
            self.arrived += 1
            if self.arrived == self.replicas:
                self.arrived = 0
                self.generation += 1
                self.cond.notify_all()
                return
            while self.generation == generation:
                if self.run.stop.is_set():
                    raise Stopped
                self.cond.wait(timeout=self.run.poll_s)

    def average(self, index: int, grads: list) -> list:
        self.slots[index] = grads
        self._rendezvous()  # every replica has deposited
        device = grads[0].device
        mean = [sum(slot[i].to(device) for slot in self.slots) / self.replicas for i in range(len(grads))]
        self._rendezvous()  # every replica has read, so the slots may be overwritten next step
        return mean


def _on_stream(handoff: "StreamHandoff", device: str, body: Callable[[], None]) -> None:
    with handoff.producing(device):
        body()


def _take(run: Run, batches: queue.Queue, handoff: "StreamHandoff", device) -> "TargetBatch":
    return handoff.receive(run.get(batches), device)


def saved_path(plan: RunPlan, failed_worker, workers: List[WorkerOutcome]) -> "str | None":
    """Where the drafter was saved: nowhere when a worker failed, a signal came, or the save itself failed."""
    from dflash_doctor.reference.checkpoint_files import checkpoint_path

    if not plan.save_dir or failed_worker is not None or any(w.save_error for w in workers):
        return None
    return str(checkpoint_path(plan.save_dir))


class ThreadRun:
    def __init__(self, plan: RunPlan, progress: Progress, clock: Callable[[], float], thread_factory,
                 stop: StopRequest) -> None:
        from dflash_doctor.reference.setup import SetupLog

        self.plan, self.progress, self.clock, self.thread_factory, self.stop = (
            plan, progress, clock, thread_factory, stop)
        self.started = clock()
        self.run = Run(plan.poll_s)
        self.log = SetupLog(progress, clock=clock)
        self.recorder: Optional[FlightRecorder] = None
        self.outcomes = ([WorkerOutcome(n, "target", d) for n, d in zip(plan.target_names(), plan.target_devices)]
                         + [WorkerOutcome(n, "drafter", d) for n, d in zip(plan.drafter_names(), plan.drafter_devices)])
        self.threads: List[threading.Thread] = []
        self.records: queue.Queue = queue.Queue()
        self.aggregator = StepAggregator(len(plan.drafter_devices), plan.steps, progress,
                                         first_step=plan.start_step + 1)
        self.world: Optional[ThreadWorld] = None
        self.setup_error: Optional[WorkerOutcome] = None
        self.setup_s: Optional[float] = None
        self.last_step_at = self.started
        self.hang: Optional[HangReport] = None
        self.mitigation_facts: dict = {}

    # -- start ---------------------------------------------------------------------------------------------
    def set_up(self) -> bool:
        """Mitigations here, in the calling thread (a failure is the user's to fix: it propagates); the rest in a
        set-up thread, so a stop signal is still heard. True when the workers can start."""
        from dflash_doctor import runtime
        from dflash_doctor.reference.setup import SetupStopped, apply_mitigations, set_up_threads

        # The order repro uses: the shim before anything wraps Tracer.trace or creates a compile wrapper.
        began = self.clock()
        self.mitigation_facts = apply_mitigations(self.plan.mitigations)
        self.recorder = runtime.install(runtime.FlightRecorder(clock=self.clock))
        self.log.seconds["hooks"] = round(self.clock() - began, 3)
        for outcome in self.outcomes:
            outcome.phase = "waiting for set-up"
        done: dict = {}

        def body() -> None:
            try:
                done["world"] = set_up_threads(self.plan, self.log)
            except SetupStopped:
                done["stopped"] = True
            except BaseException as exc:  # noqa: BLE001 - reported as the set-up's failure, with its traceback
                done["error"] = (f"{exc.__class__.__name__}: {exc}", traceback.format_exc())

        thread = self.thread_factory(target=body, name="set-up", daemon=True)
        thread.start()
        deadline = float("inf")
        while thread.is_alive() and self.clock() < deadline:
            thread.join(self.plan.poll_s)
            if self.stop.requested and deadline == float("inf"):
                # set-up checks the stop between its phases only, and one phase (building or compiling the
                # target) can take longer than the stop bound: give it the grace, then leave it (a daemon)
                self.log.stop.set()
                deadline = self.clock() + self.plan.stop_grace_s
        self.setup_s = self.clock() - self.started
        if thread.is_alive():
            return False
        if "error" in done:
            error, trace = done["error"]
            self.setup_error = WorkerOutcome("set-up", "set-up", self.plan.target_devices[0], Outcome.ERROR,
                                             error, 0, trace, "set-up")
            LOG.error("set-up failed: %s", error)
            self.run.fail("set-up")
            return False
        self.world = done.get("world")
        return self.world is not None

    def start_workers(self) -> None:
        from dflash_doctor.reference.loop import DrafterLoop, FailureHook, TargetLoop
        from dflash_doctor.reference.roles import TargetRole
        from dflash_doctor.reference.setup import wrap_step
        from dflash_doctor.reference.training import StreamHandoff

        import torch

        plan, world, run = self.plan, self.world, self.run
        assert world is not None, "start_workers() after a set-up that failed"
        drafters = len(plan.drafter_devices)
        batches: queue.Queue = queue.Queue(maxsize=max(1, plan.cfg.queue_depth * drafters))
        averager = GradientAverager(drafters, run)
        handoff = StreamHandoff(plan.target_devices)
        bodies: List[Callable[[], None]] = []
        for index, (outcome, device) in enumerate(zip(self.outcomes, plan.target_devices)):
            role = TargetRole(plan.cfg, index, torch.device(device), plan.seed, world.corpus,
                              world.forwards[device], plan.start_step)
            loop = TargetLoop(role, outcome, lambda batch, k: run.put(batches, handoff.mark(batch)),
                              inject=FailureHook(plan, outcome.name), clock=self.clock)
            bodies.append(partial(_on_stream, handoff, device, loop.run))
        for index, drafter in enumerate(world.drafters):
            outcome = self.outcomes[len(plan.target_devices) + index]
            bodies.append(DrafterLoop(
                plan, index, drafter, outcome, next_batch=partial(_take, run, batches, handoff, drafter.device),
                report=self.records.put, average=partial(averager.average, index) if drafters > 1 else None,
                compute=wrap_step(plan.mitigations, drafter.compute), recorder=self.recorder,
                inject=FailureHook(plan, outcome.name), clock=self.clock).run)
        if plan.tracing_thread:
            from dflash_doctor import mitigations
            from dflash_doctor.reference.tracing import NAME, ROLE, TracingLoop

            tracer = WorkerOutcome(NAME, ROLE, "cpu")
            self.outcomes.append(tracer)
            bodies.append(TracingLoop(plan, tracer, run.stop, mitigations.around_foreign_trace(plan.mitigations)).run)
        for outcome, body in zip(self.outcomes, bodies):
            thread = self.thread_factory(target=self._guarded, args=(outcome, body), name=outcome.name, daemon=True)
            self.threads.append(thread)
        for thread in self.threads:
            thread.start()

    def _guarded(self, outcome: WorkerOutcome, body: Callable[[], None]) -> None:
        """A worker thread: the mitigations' per-thread switches (single-thread-autograd) held around all of its
        work, as in a trainer's own worker; what it died of is kept."""
        from dflash_doctor import mitigations

        with mitigations.in_each_thread(self.plan.mitigations)():
            import torch

            # Read here, inside the worker: the switch is thread-local.
            outcome.autograd_multithreading = bool(torch.autograd.is_multithreading_enabled())
            outcome.switches = {switch.setting: repr(switch.read()) for name in self.plan.mitigations
                                for switch in mitigations.get(name).switches}
            self._run_body(outcome, body)

    def _run_body(self, outcome: WorkerOutcome, body: Callable[[], None]) -> None:
        from dflash_doctor.reference.roles import InjectedFailure

        try:
            body()
            outcome.outcome = Outcome.OK
        except Stopped:
            outcome.outcome = Outcome.STOPPED if self.run.failed.is_set() or self.stop.requested else Outcome.OK
        except InjectedFailure as exc:
            outcome.outcome, outcome.error = Outcome.KILLED, str(exc)
            LOG.error("worker %s killed: %s", outcome.name, exc)
            self.run.fail(outcome.name)
        except BaseException as exc:  # noqa: BLE001 - a worker's death is data: kept, named, and the run stops
            outcome.error, outcome.traceback = f"{exc.__class__.__name__}: {exc}", traceback.format_exc()
            # After another worker's death (or a stop signal) an error is a consequence: "stopped", error kept.
            consequence = self.run.failed.is_set() or self.stop.requested
            outcome.outcome = Outcome.STOPPED if consequence else Outcome.ERROR
            LOG.error("Exception in thread %s: %s", outcome.name, outcome.error)
            self.run.fail(outcome.name)

    # -- supervise -----------------------------------------------------------------------------------------
    def last_progress(self) -> float:
        return max(self.last_step_at, self.recorder.last_progress if self.recorder else self.started)

    def on_hang(self, report) -> None:
        """The watchdog's verdict: no step, no compile event and no CPU use for --stall-timeout."""
        self.hang = report
        cycle = [t for t in report.diagnosis.threads if any(o.name == t for o in self.outcomes)]
        alive = [o for o, t in zip(self.drafter_outcomes(), self.drafter_threads()) if t.is_alive()]
        culprit = cycle[0] if cycle else min(alive, key=lambda o: o.steps).name if alive else self.outcomes[0].name
        LOG.error("no drafter step for %.0f s: %s", self.plan.stall_timeout_s, report.diagnosis.summary())
        self.run.fail(culprit)

    def drafter_outcomes(self) -> List[WorkerOutcome]:
        return [o for o in self.outcomes if o.role == "drafter"]

    def drafter_threads(self) -> List[threading.Thread]:
        return [t for t, o in zip(self.threads, self.outcomes) if o.role == "drafter"]

    def supervise(self) -> None:
        from dflash_doctor import runtime

        watchdog = runtime.Watchdog(self.last_progress, self.plan.stall_timeout_s, self.on_hang, clock=self.clock,
                                    poll_s=self.plan.poll_s)
        self.last_step_at = self.clock()  # the stall clock starts when set-up ends
        watchdog.start()
        try:
            while not self.run.failed.is_set() and any(t.is_alive() for t in self.drafter_threads()):
                if self.stop.requested:
                    break
                try:
                    self.aggregator.add(self.records.get(timeout=self.plan.poll_s))
                    self.last_step_at = self.clock()
                except queue.Empty:
                    continue
        finally:
            watchdog.stop()

    # -- shut down -----------------------------------------------------------------------------------------
    def shut_down(self) -> None:
        self.run.stop.set()  # the drafters are done (or someone died, or a signal came): release the targets
        if self.stop.requested:
            budget = self.plan.stop_grace_s
        elif self.hang is not None:
            budget = min(self.plan.join_timeout_s, STALLED_JOIN_S)
        else:
            budget = self.plan.join_timeout_s
        self._join(budget)
        stuck = [t for t in self.threads if t.is_alive()]
        if stuck and self.hang is None and not self.stop.requested:
            self._diagnose_stuck(budget)
        for thread, outcome in zip(self.threads, self.outcomes):
            if not thread.is_alive():
                continue
            if self.stop.requested and self.hang is None:
                outcome.outcome = Outcome.STOPPED
                outcome.error = outcome.error or f"still inside a step when {self.stop.signal_name} came"
            else:
                outcome.outcome = Outcome.HUNG
                outcome.error = outcome.error or (f"did not stop within {budget:.0f} s of the stop"
                                                  if self.run.failed_worker != outcome.name
                                                  else f"no drafter step for {self.plan.stall_timeout_s:.0f} s")
        while not self.records.empty():
            self.aggregator.add(self.records.get_nowait())

    def _join(self, budget: float) -> None:
        """Join every worker within `budget` seconds in all, cut to the stop grace if a signal comes meanwhile
        (a `timeout` wrapper kills a few seconds after its SIGTERM: the report must be out by then)."""
        deadline = self.clock() + budget
        for thread in self.threads:
            while thread.is_alive() and self.clock() < deadline:
                thread.join(self.plan.poll_s)
                if self.stop.requested:
                    deadline = min(deadline, self.clock() + self.plan.stop_grace_s)

    def _diagnose_stuck(self, waited_s: float) -> None:
        """Workers that did not stop after another one failed are stuck somewhere: their stacks say where (the
        seeds' run could show the FX error in one drafter while the others were deadlocked)."""
        from dflash_doctor import runtime

        stacks = runtime.capture_stacks()
        self.hang = runtime.HangReport(runtime.classify_hang(stacks, waited_s), stacks)

    # -- collect -------------------------------------------------------------------------------------------
    def collect(self) -> PipelineResult:
        from dflash_doctor import mitigations

        plan, aggregator, world = self.plan, self.aggregator, self.world
        workers = self.outcomes + ([self.setup_error] if self.setup_error else [])
        if self.stop.requested or self.setup_error:
            for outcome, started in zip(self.outcomes, [True] * len(self.threads) + [False] * len(self.outcomes)):
                unfinished = not started or (outcome.role == "drafter" and outcome.steps < plan.steps)
                if outcome.outcome is Outcome.OK and unfinished:
                    outcome.outcome = Outcome.STOPPED
        failed = self.run.failed_worker if self.hang or any(w.outcome in FAILED for w in workers) else None
        hang = self.hang
        return PipelineResult(
            compile_dense=plan.cfg.compile_dense,
            preset=plan.cfg.name, workers_mode="threads", device_type=plan.device_type,
            steps=len(aggregator.losses), start_step=plan.start_step, losses=aggregator.losses,
            tokens=aggregator.steady_tokens(), tokens_per_s=aggregator.tokens_per_s(),
            warmup_s=(aggregator.step_ends[0] - self.started) if aggregator.step_ends else None,
            setup_s=self.setup_s, setup=dict(self.log.seconds), step_time_s=aggregator.step_times(),
            wall_s=self.clock() - self.started, workers=workers, failed_worker=failed,
            mitigation=mitigations.label(plan.mitigations), mitigation_facts=self.mitigation_facts,
            hang=hang.diagnosis.to_dict() if hang else None,
            stacks=[s.to_dict() for s in hang.stacks] if hang else [],
            blame=[b.to_dict() for b in self.recorder.blames] if self.recorder else [], interrupted=self.stop.signal_name,
            corpus=world.corpus_facts if world else None, target_forward=world.target_forward if world else None,
            saved_to=saved_path(plan, failed or self.stop.signal_name, workers), transport="queue",
        )


def run_threads(plan: RunPlan, progress: Optional[Progress] = None, clock: Callable[[], float] = time.perf_counter,
                thread_factory=threading.Thread, stop: Optional[StopRequest] = None) -> PipelineResult:
    import torch

    from dflash_doctor import runtime

    stop = stop or StopRequest()
    previous = torch.get_num_threads()
    previous_recorder = runtime.active_recorder()
    if plan.device_type == "cpu":
        # Workers share the host's cores: small ops on an oversubscribed OpenMP pool spin instead of working
        # (generating the tiny corpus took 64 s instead of 2 s on a busy 2-core machine).
        workers = len(plan.target_devices) + len(plan.drafter_devices)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    with stop_signals(stop):
        orchestration = ThreadRun(plan, progress or Progress(), clock, thread_factory, stop)
        if orchestration.set_up() and not stop.requested:
            orchestration.start_workers()
            orchestration.supervise()
        orchestration.shut_down()
        result = orchestration.collect()
    if not any(t.is_alive() for t in orchestration.threads):  # stuck threads keep the share they got
        torch.set_num_threads(previous)
    # The flight recorder's hooks are process-wide: a caller running the pipeline in its own process gets its torch
    # back as it was (or its own recorder). Safe with stuck threads: a hook in progress keeps its own recorder.
    runtime.uninstall()
    if previous_recorder is not None:
        runtime.install(previous_recorder)
    return result
