"""Target and drafter workers as threads of one process (the seeds' design), joined by a bounded queue.

Every blocking call (queue put/get, the gradient rendezvous) waits in slices of `poll_s` and checks the stop
event, so when any worker dies the others leave within a slice and the run ends with that worker named.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
import traceback
from typing import Callable, List

from dflash_doctor.reference.results import (
    PipelineResult, Progress, RunPlan, StepAggregator, StepRecord, WorkerOutcome, no_progress,
)

LOG = logging.getLogger("dflash_doctor.reference")


class Stopped(Exception):
    """The run is stopping (finished, or another worker died): leave quietly."""


class Run:
    """What the threads share: the stop event, the first failure, and the stop-aware blocking calls."""

    def __init__(self, poll_s: float):
        self.poll_s = poll_s
        self.stop = threading.Event()
        self.failed = threading.Event()
        self.failed_worker = None
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


def _check_injected_failure(plan: RunPlan, name: str, step: int) -> None:
    from dflash_doctor.reference.roles import InjectedFailure

    if plan.fail_worker == name and step == plan.fail_at_step:
        raise InjectedFailure(f"{name} killed at step {step} by --fail-worker (testing the clean shutdown)")


def _target_worker(plan: RunPlan, run: Run, index: int, batches: queue.Queue, outcome: WorkerOutcome) -> None:
    import torch

    from dflash_doctor.reference.roles import TargetRole

    role = TargetRole(plan.cfg, index, torch.device(outcome.device), plan.seed, plan.hf_checkpoint)
    step = 0
    while True:
        step += 1
        _check_injected_failure(plan, outcome.name, step)
        run.put(batches, role.next_batch())
        outcome.steps = step


def _drafter_worker(plan: RunPlan, run: Run, index: int, batches: queue.Queue, records: queue.Queue,
                    averager: GradientAverager, outcome: WorkerOutcome, clock: Callable[[], float]) -> None:
    import torch

    from dflash_doctor.reference.checkpointing import save_drafter
    from dflash_doctor.reference.roles import DrafterRole

    device = torch.device(outcome.device)
    role = DrafterRole(plan.cfg, index, device, plan.seed, plan.checkpoint, plan.attention_path,
                       plan.hf_checkpoint, plan.resume_state)
    last = plan.start_step + plan.steps
    for step in range(plan.start_step + 1, last + 1):
        _check_injected_failure(plan, outcome.name, step - plan.start_step)
        batch = run.get(batches).to(device)
        began = clock()
        loss = role.compute(batch)
        if averager.replicas > 1:
            role.set_gradients(averager.average(index, role.gradients()))
        role.apply()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ended = clock()
        records.put(StepRecord(step, outcome.name, loss, batch.num_tokens, ended - began, ended))
        outcome.steps += 1
        if step % plan.cfg.log_every == 0 or step == last:
            LOG.info("step=%d loss=%.4f tok/s=%.0f", step, loss, batch.num_tokens / max(ended - began, 1e-9))
    if index == 0 and plan.save_dir:
        save_drafter(plan.save_dir, role.state(last), plan.cfg.name)


def _guarded(run: Run, outcome: WorkerOutcome, body: Callable[[], None]) -> None:
    from dflash_doctor.reference.roles import InjectedFailure

    try:
        body()
        outcome.outcome = "ok"
    except Stopped:
        if outcome.outcome != "hung":  # declared hung by the stall watchdog: that verdict stands
            outcome.outcome = "stopped" if run.failed.is_set() else "ok"
    except InjectedFailure as exc:
        outcome.outcome, outcome.error = "killed", str(exc)
        LOG.error("worker %s killed: %s", outcome.name, exc)
        run.fail(outcome.name)
    except BaseException as exc:  # noqa: BLE001 - a worker's death is data: kept, named, and the run stops
        outcome.error, outcome.traceback = f"{exc.__class__.__name__}: {exc}", traceback.format_exc()
        # After another worker's death an error is a consequence: "stopped", the error kept.
        outcome.outcome = "stopped" if run.failed.is_set() else "error"
        LOG.error("Exception in thread %s: %s", outcome.name, outcome.error)
        run.fail(outcome.name)


def _mark_stalled(run: Run, outcomes: List[WorkerOutcome], threads, timeout_s: float) -> None:
    """No drafter step for `timeout_s`: the slowest live drafter is named hung (the usual deadlock shape)."""
    alive = [o for o, t in zip(outcomes, threads) if t.is_alive()]
    stuck = min(alive, key=lambda o: o.steps)
    for outcome in alive:
        outcome.outcome = "hung"
        outcome.error = f"no drafter step for {timeout_s:.0f} s (deadlocked? `dflash-doctor repro` tells)"
    run.fail(stuck.name)


def saved_path(plan: RunPlan, failed_worker) -> "str | None":
    from dflash_doctor.reference.checkpointing import checkpoint_path

    return str(checkpoint_path(plan.save_dir)) if plan.save_dir and failed_worker is None else None


def run_threads(plan: RunPlan, progress: Progress = no_progress, clock: Callable[[], float] = time.perf_counter,
                thread_factory=threading.Thread) -> PipelineResult:
    import torch

    if plan.device_type != "cpu":
        return _run_threads(plan, progress, clock, thread_factory)
    # Workers share the host's cores: small ops on an oversubscribed OpenMP pool spin instead of working
    # (generating the tiny corpus took 64 s instead of 2 s on a busy 2-core machine).
    workers = len(plan.target_devices) + len(plan.drafter_devices)
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    result = _run_threads(plan, progress, clock, thread_factory)
    if not any(w.outcome == "hung" for w in result.workers):  # hung workers still run with the share they got
        torch.set_num_threads(previous)
    return result


def _run_threads(plan: RunPlan, progress: Progress, clock: Callable[[], float], thread_factory) -> PipelineResult:
    started = clock()
    run = Run(plan.poll_s)
    drafters = len(plan.drafter_devices)
    batches: queue.Queue = queue.Queue(maxsize=max(1, plan.cfg.queue_depth * drafters))
    records: queue.Queue = queue.Queue()
    averager = GradientAverager(drafters, run)
    outcomes: List[WorkerOutcome] = []
    threads = []
    for i, (name, device) in enumerate(zip(plan.target_names(), plan.target_devices)):
        outcome = WorkerOutcome(name, "target", device)
        body = (lambda i=i, o=outcome: _target_worker(plan, run, i, batches, o))
        outcomes.append(outcome)
        threads.append(thread_factory(target=_guarded, args=(run, outcome, body), name=name, daemon=True))
    for i, (name, device) in enumerate(zip(plan.drafter_names(), plan.drafter_devices)):
        outcome = WorkerOutcome(name, "drafter", device)
        body = (lambda i=i, o=outcome: _drafter_worker(plan, run, i, batches, records, averager, o, clock))
        outcomes.append(outcome)
        threads.append(thread_factory(target=_guarded, args=(run, outcome, body), name=name, daemon=True))
    for thread in threads:
        thread.start()

    aggregator = StepAggregator(drafters, plan.steps, progress, first_step=plan.start_step + 1)
    drafter_threads = threads[len(plan.target_devices):]
    last_progress, stalled = clock(), False
    while not run.failed.is_set() and any(t.is_alive() for t in drafter_threads):
        try:
            aggregator.add(records.get(timeout=plan.poll_s))
            last_progress = clock()
        except queue.Empty:
            if clock() - last_progress > plan.stall_timeout_s:
                stalled = True
                _mark_stalled(run, outcomes[len(plan.target_devices):], drafter_threads, plan.stall_timeout_s)
    run.stop.set()  # the drafters are done (or someone died): release the targets
    # Threads stuck in a deadlock never return: after a stall, do not wait the full join timeout for them.
    deadline = clock() + (min(plan.join_timeout_s, 5.0) if stalled else plan.join_timeout_s)
    for thread, outcome in zip(threads, outcomes):
        thread.join(timeout=max(0.0, deadline - clock()))
        if thread.is_alive():
            outcome.outcome = "hung"
            outcome.error = outcome.error or "did not stop within the join timeout"
    while not records.empty():
        aggregator.add(records.get_nowait())

    return PipelineResult(
        preset=plan.cfg.name, workers_mode="threads", device_type=plan.device_type,
        steps=len(aggregator.losses), start_step=plan.start_step, losses=aggregator.losses,
        tokens=aggregator.steady_tokens(), tokens_per_s=aggregator.tokens_per_s(),
        warmup_s=(aggregator.step_ends[0] - started) if aggregator.step_ends else None,
        wall_s=clock() - started, workers=outcomes, failed_worker=run.failed_worker,
        saved_to=saved_path(plan, run.failed_worker), transport="queue",
    )
