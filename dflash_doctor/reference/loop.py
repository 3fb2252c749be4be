"""The target and drafter loops, the same for a thread and a process: only where batches come from and go to,
and how gradients are averaged, differ (they are passed in).

The drafter loop never waits for the GPU within a step: it launches step k, then waits for step k-1 to finish
(a CUDA event recorded after its optimizer step) and reports it. So the GPU always has the next step queued while
Python reports the last one, and the CPU runs at most one step ahead.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, Optional

from dflash_doctor.reference.results import FailHow, RunPlan, StepRecord, WorkerOutcome

if TYPE_CHECKING:
    import torch

    from dflash_doctor.reference.roles import DrafterRole, TargetRole
    from dflash_doctor.reference.training import TargetBatch
    from dflash_doctor.runtime import FlightRecorder

LOG = logging.getLogger("dflash_doctor.reference")


def inject_hang(name: str) -> None:
    """Block forever in a real two-lock cycle with a helper thread: what the stall watchdog must diagnose."""
    mine, theirs = threading.Lock(), threading.Lock()
    both_hold = threading.Barrier(2)

    def helper() -> None:
        with theirs:
            both_hold.wait()
            with mine:
                return

    threading.Thread(target=helper, name=f"{name}-helper", daemon=True).start()
    with mine:
        both_hold.wait()
        with theirs:
            return


@dataclass
class FailureHook:
    """`--fail-worker NAME --fail-at-step N --fail-how HOW`, checked at each of the worker's steps."""

    plan: RunPlan
    name: str
    # How a killed worker dies: a thread just raises (below); a process flushes what it has to say and SIGKILLs
    # itself, since that is what a killed process is.
    kill: Callable[[str], None] = lambda message: None

    def due(self, step: int) -> bool:
        return self.plan.fail_worker == self.name and step == self.plan.fail_at_step

    def __call__(self, step: int) -> None:
        from dflash_doctor.reference.roles import InjectedFailure

        if not self.due(step):
            return
        how = self.plan.fail_how
        if how is FailHow.RAISE:
            raise RuntimeError(f"{self.name}: error injected at step {step} by --fail-worker --fail-how raise")
        if how is FailHow.HANG:
            LOG.error("worker %s deadlocks at step %d (--fail-how hang)", self.name, step)
            inject_hang(self.name)
        message = f"{self.name} killed at step {step} by --fail-worker (testing the clean shutdown)"
        self.kill(message)
        raise InjectedFailure(message)


class StepFence:
    """Marks the end of a step's GPU work; `wait()` blocks until it is done (nothing to wait for on a CPU)."""

    def __init__(self, device) -> None:
        import torch

        self.event = torch.cuda.Event() if device.type == "cuda" else None
        if self.event is not None:
            self.event.record(torch.cuda.current_stream(device))

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()


@dataclass
class _Launched:
    step: int
    loss: "torch.Tensor"  # a device scalar
    batch: "TargetBatch"  # held until the step's GPU work is done: memory mapped from another process (CUDA IPC) is
    # handed back to its owner when the last reference goes, whatever kernels still read it
    began: float
    fence: StepFence


@dataclass
class DrafterLoop:
    plan: RunPlan
    index: int
    role: "DrafterRole"
    outcome: WorkerOutcome
    next_batch: Callable[[], "TargetBatch"]  # blocks until a batch for this replica is there
    report: Callable[[StepRecord], None]
    average: Optional[Callable[[List], List]] = None  # gradients -> their mean over replicas; None: one replica
    compute: Optional[Callable[["TargetBatch"], "torch.Tensor"]] = None  # role.compute, wrapped by mitigations
    recorder: Optional["FlightRecorder"] = None  # the flight recorder: steps, and the blame when one raises
    inject: Optional[FailureHook] = None
    clock: Callable[[], float] = time.perf_counter
    on_phase: Optional[Callable[[str], None]] = None  # told when the phase changes (a process tells its parent)

    def _phase(self, text: str) -> None:
        if self.outcome.phase != text:
            self.outcome.phase = text
            if self.on_phase is not None:
                self.on_phase(text)

    def run(self) -> None:
        launched: List[_Launched] = []  # at most one: the step whose loss is not read yet
        try:
            self._steps(launched)
        except BaseException:
            # The step before the one that failed did finish: count and report it, if its GPU work can be read.
            if launched:
                try:
                    self._finish(launched.pop(), self.plan.start_step + self.plan.steps)
                except Exception:  # noqa: BLE001 - the original failure is the one to report
                    LOG.debug("the step before the failure could not be read back", exc_info=True)
            raise

    def _steps(self, launched: List[_Launched]) -> None:
        compute = self.compute or self.role.compute
        last = self.plan.start_step + self.plan.steps
        for local in range(1, self.plan.steps + 1):
            step = self.plan.start_step + local
            if self.inject is not None:
                if self.inject.due(local) and launched:
                    self._finish(launched.pop(), last)
                self.inject(local)
            waited = self.clock()
            batch = self.next_batch()
            self.outcome.wait_s += self.clock() - waited
            if local == 1:
                self._phase("first step (compiling)")
            began = self.clock()
            with self._recording(step):
                loss = compute(batch)
            self._phase("training")
            if self.average is not None:
                self.role.set_gradients(self.average(self.role.gradients()))
            self.role.apply()
            fence = StepFence(self.role.device)
            if launched:
                self._finish(launched.pop(), last)
            launched.append(_Launched(step, loss, batch, began, fence))
        if launched:
            self._finish(launched.pop(), last)
        if self.index == 0 and self.plan.save_dir:
            from dflash_doctor.reference.checkpoint_files import save_drafter

            self._phase("saving")
            try:
                save_drafter(self.plan.save_dir, self.role.state(last), self.plan.cfg.name)
            except Exception as exc:  # noqa: BLE001 - the training finished: a failed save is that, not a death
                self.outcome.save_error = (exc.strerror if isinstance(exc, OSError) and exc.strerror
                                           else f"{exc.__class__.__name__}: {exc}")
                LOG.error("saving the drafter to %s failed: %s", self.plan.save_dir, self.outcome.save_error)
                return
            self._phase("saved")

    def _recording(self, step: int):
        import contextlib

        return self.recorder.step(step) if self.recorder is not None else contextlib.nullcontext()

    def _finish(self, launched: _Launched, last: int) -> None:
        launched.fence.wait()
        ended = self.clock()
        loss = float(launched.loss)
        seconds = ended - launched.began
        tokens = launched.batch.num_tokens
        self.report(StepRecord(launched.step, self.outcome.name, loss, tokens, seconds, ended))
        self.outcome.steps += 1
        if launched.step % self.plan.cfg.log_every == 0 or launched.step == last:
            LOG.info("step=%d loss=%.4f tok/s=%.0f", launched.step, loss, tokens / max(seconds, 1e-9))


@dataclass
class TargetLoop:
    role: "TargetRole"
    outcome: WorkerOutcome
    send: Callable[["TargetBatch", int], None]  # (batch, k): hand batch k over; blocks while the consumer is behind
    count: Optional[int] = None  # batches to make; None: until stopped
    inject: Optional[FailureHook] = None
    clock: Callable[[], float] = time.perf_counter

    def run(self) -> None:
        self.outcome.phase = "serving batches"
        k = 0
        while self.count is None or k < self.count:
            k += 1
            if self.inject is not None:
                self.inject(k)
            batch = self.role.next_batch()
            waited = self.clock()
            self.send(batch, k)
            self.outcome.wait_s += self.clock() - waited
            self.outcome.steps = k
