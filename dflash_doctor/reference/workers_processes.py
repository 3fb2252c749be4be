"""The same roles as processes through torch.distributed: ranks 0..T-1 are target workers, T..T+D-1 drafters.

Target ranks send batches point-to-point to their drafter ranks; drafter ranks average gradients with an
all-reduce. NCCL when every rank has a GPU of its own; gloo otherwise (always on CPU; on a shared GPU, because
NCCL refuses two ranks on one device, with tensors staged through host memory).

Launch: under torchrun (RANK / WORLD_SIZE / MASTER_ADDR in the environment) this process is one rank; otherwise
it spawns one process per rank with a free port on 127.0.0.1 and watches them: when any rank dies (an exception,
a signal, --fail-worker) it terminates the rest, so the run always ends, with the dead rank named.
"""
from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import traceback
from datetime import timedelta
from typing import Dict, List, Tuple

from dflash_doctor.reference.results import (
    PipelineResult, Progress, RunPlan, StepAggregator, StepRecord, WorkerOutcome, no_progress,
)

LOG = logging.getLogger("dflash_doctor.reference")
KILL_SIGNAL_EXIT = -9


def routes(targets: int, drafters: int) -> Tuple[List[List[int]], List[List[int]]]:
    """(sources of each drafter, consumers of each target): pairs (i % T, i % D), so every worker has a partner."""
    sources: List[List[int]] = [[] for _ in range(drafters)]
    consumers: List[List[int]] = [[] for _ in range(targets)]
    for i in range(max(targets, drafters)):
        sources[i % drafters].append(i % targets)
        consumers[i % targets].append(i % drafters)
    return sources, consumers


def batches_per_target(targets: int, drafters: int, steps: int) -> List[int]:
    """How many batches each target must send so every drafter gets `steps` (each drafter cycles its sources)."""
    sources, _ = routes(targets, drafters)
    counts = [0] * targets
    for own in sources:
        for step in range(steps):
            counts[own[step % len(own)]] += 1
    return counts


def backend_for(plan: RunPlan) -> str:
    devices = plan.target_devices + plan.drafter_devices
    if plan.device_type == "cuda" and len(set(devices)) == len(devices):
        return "nccl"
    return "gloo"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Channel:
    """Point-to-point batches and the drafters' all-reduce, staging CUDA tensors through the host under gloo."""

    def __init__(self, backend: str, device, drafter_group):
        self.staged = backend == "gloo" and device.type == "cuda"
        self.device = device
        self.drafter_group = drafter_group

    def _wire(self, tensor):
        return tensor.cpu() if self.staged else tensor.contiguous()

    def send_batch(self, batch, dst: int) -> None:
        import torch
        import torch.distributed as dist

        header = torch.tensor(list(batch.features.shape), dtype=torch.long, device=batch.tokens.device)
        for tensor in (header, batch.tokens, batch.lengths, batch.features, batch.greedy):
            dist.send(self._wire(tensor), dst)

    def recv_batch(self, src: int, feature_dtype):
        import torch
        import torch.distributed as dist

        from dflash_doctor.reference.training import TargetBatch

        where = torch.device("cpu") if self.staged else self.device
        header = torch.empty(3, dtype=torch.long, device=where)
        dist.recv(header, src)
        batch, seq, width = header.tolist()
        parts = [torch.empty((batch, seq), dtype=torch.long, device=where),
                 torch.empty((batch,), dtype=torch.long, device=where),
                 torch.empty((batch, seq, width), dtype=feature_dtype, device=where),
                 torch.empty((batch, seq), dtype=torch.long, device=where)]
        for tensor in parts:
            dist.recv(tensor, src)
        return TargetBatch(*parts).to(self.device)

    def average(self, grads: list, replicas: int) -> list:
        import torch
        import torch.distributed as dist

        flat = torch.cat([g.reshape(-1) for g in grads])
        wire = self._wire(flat)
        dist.all_reduce(wire, group=self.drafter_group)
        flat = wire.to(self.device) / replicas
        out, offset = [], 0
        for g in grads:
            out.append(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        return out


def _rank_body(plan: RunPlan, rank: int, channel: _Channel, outcome: WorkerOutcome, emit) -> None:
    import torch

    from dflash_doctor.reference.checkpointing import save_drafter
    from dflash_doctor.reference.roles import DrafterRole, InjectedFailure, TargetRole, target_dtype

    targets, drafters = len(plan.target_devices), len(plan.drafter_devices)
    sources, consumers = routes(targets, drafters)
    device = torch.device(outcome.device)

    def check_failure(step: int) -> None:
        if plan.fail_worker == outcome.name and step == plan.fail_at_step:
            raise InjectedFailure(f"{outcome.name} killed at step {step} by --fail-worker (testing the clean shutdown)")

    if rank < targets:
        role = TargetRole(plan.cfg, rank, device, plan.seed, plan.hf_checkpoint)
        own = consumers[rank]
        for k in range(batches_per_target(targets, drafters, plan.steps)[rank]):
            check_failure(k + 1)
            channel.send_batch(role.next_batch(), targets + own[k % len(own)])
            outcome.steps = k + 1
        return

    index = rank - targets
    role = DrafterRole(plan.cfg, index, device, plan.seed, plan.checkpoint, plan.attention_path, plan.hf_checkpoint,
                       plan.resume_state)
    own = sources[index]
    last = plan.start_step + plan.steps
    for local in range(1, plan.steps + 1):
        step = plan.start_step + local
        check_failure(local)
        batch = channel.recv_batch(own[(local - 1) % len(own)], target_dtype(device))
        began = time.perf_counter()
        loss = role.compute(batch)
        if drafters > 1:
            role.set_gradients(channel.average(role.gradients(), drafters))
        role.apply()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ended = time.perf_counter()
        emit(("step", StepRecord(step, outcome.name, loss, batch.num_tokens, ended - began, ended)))
        outcome.steps = local
        if step % plan.cfg.log_every == 0 or step == last:
            LOG.info("step=%d loss=%.4f tok/s=%.0f", step, loss, batch.num_tokens / max(ended - began, 1e-9))
    if index == 0 and plan.save_dir:
        save_drafter(plan.save_dir, role.state(last), plan.cfg.name)


def _setup_rank(plan: RunPlan, rank: int, world: int, init_method: str):
    import torch
    import torch.distributed as dist

    targets = len(plan.target_devices)
    names = plan.target_names() + plan.drafter_names()
    devices = plan.target_devices + plan.drafter_devices
    outcome = WorkerOutcome(names[rank], "target" if rank < targets else "drafter", devices[rank])
    threading.current_thread().name = outcome.name  # log lines carry the worker name, as with threads
    device = torch.device(outcome.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        # Ranks share the host's cores: each takes its share, or spinning OpenMP pools oversubscribe them badly.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    backend = backend_for(plan)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=max(300.0, plan.join_timeout_s)))
    drafter_ranks = list(range(targets, world))
    group = dist.new_group(drafter_ranks) if len(drafter_ranks) > 1 else None
    return outcome, _Channel(backend, device, group)


def _rank_entry(rank: int, world: int, plan: RunPlan, outbox, init_method: str, log_level: int) -> None:
    """A spawned rank: everything it has to say goes through `outbox`; an injected failure is a real SIGKILL."""
    import signal

    import torch.distributed as dist

    from dflash_doctor.reference.roles import InjectedFailure

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
    LOG.addHandler(handler)
    LOG.setLevel(log_level)
    outcome = None
    try:
        outcome, channel = _setup_rank(plan, rank, world, init_method)
        _rank_body(plan, rank, channel, outcome, outbox.put)
        outbox.put(("outcome", outcome))
        dist.destroy_process_group()
    except InjectedFailure as exc:
        outcome.outcome, outcome.error = "killed", str(exc)
        LOG.error("worker %s killed: %s", outcome.name, exc)
        outbox.put(("outcome", outcome))
        outbox.close()
        outbox.join_thread()  # flush before dying: SIGKILL gives no chance later
        os.kill(os.getpid(), signal.SIGKILL)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then a non-zero exit
        name = outcome.name if outcome else f"rank-{rank}"
        error = f"{exc.__class__.__name__}: {exc}"
        LOG.error("Exception in %s: %s", name, error)
        if outcome is not None:
            outcome.outcome, outcome.error, outcome.traceback = "error", error, traceback.format_exc()
            outbox.put(("outcome", outcome))
        outbox.close()
        outbox.join_thread()
        os._exit(1)


def _exit_reason(code: int) -> str:
    import signal

    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _spawn(plan: RunPlan, progress: Progress, clock) -> PipelineResult:
    import torch.multiprocessing as mp

    started = clock()
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    names = plan.target_names() + plan.drafter_names()
    devices = plan.target_devices + plan.drafter_devices
    world = len(names)
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    procs = [ctx.Process(target=_rank_entry, name=name,
                         args=(rank, world, plan, outbox, init_method, LOG.getEffectiveLevel()))
             for rank, name in enumerate(names)]
    for proc in procs:
        proc.start()

    targets = len(plan.target_devices)
    reported: Dict[str, WorkerOutcome] = {}
    aggregator = StepAggregator(len(plan.drafter_devices), plan.steps, progress, first_step=plan.start_step + 1)
    failed_worker = None

    def drain(timeout: float) -> bool:
        """Take one message; False when none came. The first failure reported or seen is the root cause."""
        nonlocal failed_worker
        try:
            kind, payload = outbox.get(timeout=timeout)
        except queue.Empty:
            return False
        if kind == "step":
            aggregator.add(payload)
            step_counts[payload.worker] = step_counts.get(payload.worker, 0) + 1
            last_progress[0] = clock()
        else:
            reported[payload.name] = payload
            if payload.outcome in ("error", "killed") and failed_worker is None:
                failed_worker = payload.name
        return True

    step_counts: Dict[str, int] = {}
    last_progress = [clock()]
    stalled = False
    while failed_worker is None:
        drain(plan.poll_s)
        if clock() - last_progress[0] > plan.stall_timeout_s:
            stalled = True
            failed_worker = min(plan.drafter_names(), key=lambda n: step_counts.get(n, 0))
            break
        for name, proc in zip(names, procs):
            if proc.exitcode not in (None, 0) and failed_worker is None:
                while drain(0.2):  # its own last word (the reason) may still be in flight
                    pass
                failed_worker = failed_worker or name
        if all(p.exitcode is not None for p in procs):
            break
    # A rank died: end the others now (they may be blocked in a collective with the dead one).
    for proc in procs:
        if proc.exitcode is None:
            proc.terminate()
    deadline = clock() + plan.join_timeout_s
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - clock()))
        if proc.exitcode is None:
            proc.kill()
            proc.join(timeout=5)
    while drain(0.05):  # late messages (a step finished just before the end)
        pass

    outcomes = []
    for rank, (name, proc) in enumerate(zip(names, procs)):
        outcome = reported.get(name) or WorkerOutcome(name, "target" if rank < targets else "drafter", devices[rank])
        if name not in reported:
            if name == failed_worker and not stalled:
                outcome.outcome, outcome.error = "error", _exit_reason(proc.exitcode)
            elif stalled and rank >= targets:
                outcome.outcome = "hung"
                outcome.error = f"no drafter step for {plan.stall_timeout_s:.0f} s (deadlocked?)"
            else:
                outcome.outcome = "stopped" if failed_worker else "hung"
        elif failed_worker and name != failed_worker and outcome.outcome == "error":
            outcome.outcome = "stopped"  # its error (a peer vanished) is a consequence, kept in `error`
        outcomes.append(outcome)
    from dflash_doctor.reference.workers_threads import saved_path

    return PipelineResult(
        preset=plan.cfg.name, workers_mode="processes", device_type=plan.device_type,
        steps=len(aggregator.losses), start_step=plan.start_step, losses=aggregator.losses,
        tokens=aggregator.steady_tokens(), tokens_per_s=aggregator.tokens_per_s(),
        warmup_s=(aggregator.step_ends[0] - started) if aggregator.step_ends else None,
        wall_s=clock() - started, workers=outcomes, failed_worker=failed_worker,
        saved_to=saved_path(plan, failed_worker), transport=backend_for(plan),
    )


def _under_torchrun(plan: RunPlan, progress: Progress, clock) -> PipelineResult:
    """This process is one rank of a torchrun job; the first drafter rank gathers everyone's outcome and steps.

    If a rank dies, torchrun itself ends the job; the surviving ranks' reports are then incomplete by design.
    """
    import torch.distributed as dist

    started = clock()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    expected = len(plan.target_devices) + len(plan.drafter_devices)
    if world != expected:
        raise ValueError(f"torchrun started {world} ranks; this plan has {expected} workers "
                         f"({len(plan.target_devices)} target + {len(plan.drafter_devices)} drafter)")
    records: List[StepRecord] = []
    outcome, channel = _setup_rank(plan, rank, world, "env://")
    _rank_body(plan, rank, channel, outcome, lambda item: records.append(item[1]))
    reporter = len(plan.target_devices)
    gathered = [None] * world if rank == reporter else None
    dist.gather_object((outcome, records), gathered, dst=reporter)
    dist.destroy_process_group()
    pairs = gathered if gathered is not None else [(outcome, records)]
    aggregator = StepAggregator(len(plan.drafter_devices), plan.steps, progress, first_step=plan.start_step + 1)
    for _, rank_records in pairs:
        for record in sorted(rank_records, key=lambda r: r.step):
            aggregator.add(record)
    return PipelineResult(
        preset=plan.cfg.name, workers_mode="processes", device_type=plan.device_type,
        steps=len(aggregator.losses), start_step=plan.start_step, losses=aggregator.losses,
        tokens=aggregator.steady_tokens(), tokens_per_s=aggregator.tokens_per_s(),
        warmup_s=(aggregator.step_ends[0] - started) if aggregator.step_ends else None,
        wall_s=clock() - started, workers=[o for o, _ in pairs], transport=backend_for(plan),
    )


def run_processes(plan: RunPlan, progress: Progress = no_progress, clock=time.perf_counter) -> PipelineResult:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _under_torchrun(plan, progress, clock)
    return _spawn(plan, progress, clock)
