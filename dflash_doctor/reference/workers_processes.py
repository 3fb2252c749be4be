"""The same roles as processes: ranks 0..T-1 are target workers, T..T+D-1 drafters (transport.py: how batches and
gradients move between them).

Launch: under torchrun (RANK / WORLD_SIZE / MASTER_ADDR in the environment) this process is one rank; otherwise
it spawns one process per rank and runs them in four steps: start, supervise (steps, a dead rank, a stall, a stop
signal), shut down (SIGTERM, then SIGKILL after a grace), collect. A rank that dies (an exception, a signal,
--fail-worker) ends the run with that rank named. Each rank dumps its threads' stacks on SIGUSR1 (faulthandler,
which works even when Python is stuck), which is how a stall is diagnosed across processes; each rank also leaves
when its parent is gone, so a killed parent leaves no orphan training on.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterator, List, Optional, Set, Tuple, Union

from dflash_doctor.outcomes import HangCycle
from dflash_doctor.reference.facts import BlameFacts, WrittenCorpusFacts
from dflash_doctor.reference.results import (
    FAILED, Outcome, PipelineResult, Progress, RunPlan, StepAggregator, StepRecord, Transport, WorkerOutcome,
)
from dflash_doctor.reference.signals import StopRequest, stop_signals
from dflash_doctor.reference.transport import (
    GradientAllReduce, Groups, IpcReceiver, IpcSender, P2pReceiver, P2pSender, batches_per_target, describe,
    ipc_queue_keys, offer_probe, pair_group, route_kind, routes, take_probe,
)
from dflash_doctor.reference.worker_messages import (
    Blame, Corpus, Ended, MessageError, Phase, Ready, Step, TargetForward, Threads, TransportFallback, WorkerMessage,
    decode, encode, unhandled,
)

if TYPE_CHECKING:
    from dflash_doctor.runtime import FlightRecorder, HangDiagnosis

LOG = logging.getLogger("dflash_doctor.reference")
PARENT_POLL_S = 0.5
# The entry the report gives the parent itself when a message it cannot read does not name a rank of the run.
PARENT = "parent"
STACK_DUMP_WAIT_S = 1.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _names(plan: RunPlan) -> List[str]:
    return plan.target_names() + plan.drafter_names()


def _devices(plan: RunPlan) -> List[str]:
    return plan.target_devices + plan.drafter_devices


# -- one rank -----------------------------------------------------------------------------------------------
class Outbox:
    """Where a rank's messages go: encoded (worker_messages.py, the one codec) onto the parent's queue."""

    def __init__(self, queue, sender: str) -> None:
        self.queue, self.sender = queue, sender

    def put(self, message: WorkerMessage) -> None:
        self.queue.put(encode(self.sender, message))

    def flush(self) -> None:
        """Before a SIGKILL or os._exit: nothing can be said later, so what was put must reach the parent now."""
        self.queue.close()
        self.queue.join_thread()


class KeptSteps:
    """Under torchrun there is no parent: a rank keeps its own steps, which the reporting rank gathers."""

    def __init__(self) -> None:
        self.records: List[StepRecord] = []

    def put(self, message: WorkerMessage) -> None:
        if isinstance(message, Step):
            self.records.append(message.record)

    def flush(self) -> None:
        """Nothing is in flight: the steps are in this process."""


class Rank:
    """One worker process: set-up for its role, then the shared loop, everything it says going to `outbox`."""

    def __init__(self, plan: RunPlan, rank: int, world: int, outbox: Union[Outbox, KeptSteps],
                 ipc_queues: Optional[Dict] = None) -> None:
        targets = len(plan.target_devices)
        self.plan, self.rank, self.world, self.emit = plan, rank, world, outbox.put
        self.outbox = outbox
        self.ipc_queues = ipc_queues or {}
        self.targets = targets
        self.outcome = WorkerOutcome(_names(plan)[rank], "target" if rank < targets else "drafter",
                                     _devices(plan)[rank])
        self.recorder: Optional[FlightRecorder] = None
        self.groups: Optional[Groups] = None

    def phase(self, text: str) -> None:
        self.outcome.phase = text
        self.emit(Phase(text))

    def connect(self, init_method: str) -> None:
        import torch
        import torch.distributed as dist

        from dflash_doctor import runtime
        from dflash_doctor.reference.setup import apply_mitigations

        threading.current_thread().name = self.outcome.name  # log lines and stacks carry the worker name
        device = torch.device(self.outcome.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            # Ranks share the host's cores: each takes its share, or spinning OpenMP pools oversubscribe them badly.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.world))
        apply_mitigations(self.plan.mitigations)
        self.recorder = runtime.install(runtime.FlightRecorder())
        self.phase("joining the process group")
        dist.init_process_group("gloo", init_method=init_method, rank=self.rank, world_size=self.world,
                                timeout=timedelta(seconds=max(300.0, self.plan.join_timeout_s)))
        self.groups = Groups(self.plan)

    def run(self) -> None:
        if self.rank < self.targets:
            self._run_target()
        else:
            self._run_drafter()
        self.phase("waiting for the other workers to finish")
        import torch.distributed as dist

        # A target must outlive the drafters: they may still read its memory through CUDA IPC.
        dist.barrier()

    def _kill(self, message: str) -> None:
        self.outcome.outcome, self.outcome.error = Outcome.KILLED, message
        LOG.error("worker %s killed: %s", self.outcome.name, message)
        self.emit(Ended(self.outcome))
        self.outbox.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def _run_target(self) -> None:
        import torch
        import torch.distributed as dist

        from dflash_doctor.reference.loop import FailureHook, TargetLoop
        from dflash_doctor.reference.roles import TargetRole
        from dflash_doctor.reference.setup import build_target, corpus_text, forward_text, target_forward, write_corpus

        plan, t = self.plan, self.rank
        device = torch.device(self.outcome.device)
        self.phase(f"building the target on {device}")
        model = build_target(plan, device)
        corpus = torch.empty((plan.cfg.corpus_size, plan.cfg.seq_len), dtype=torch.long)
        if t == 0:
            self.phase(corpus_text(plan))
            corpus, facts = write_corpus(plan, model, device)
            self.emit(Corpus(facts))
        else:
            self.phase("waiting for target-0's corpus")
        if self.targets > 1 and self.groups is not None:
            dist.broadcast(corpus, src=0, group=self.groups.get("targets"))
        self.phase(forward_text(device))
        forward, mode = target_forward(plan, model, device)
        self.emit(TargetForward(mode))
        _, consumers = routes(self.targets, len(plan.drafter_devices))
        own = consumers[t]
        ipc_ok = self._check_ipc_as_target([d for d in sorted(set(own)) if route_kind(
            plan, self.outcome.device, plan.drafter_devices[d]) is Transport.IPC], device)
        senders: Dict[int, Union[IpcSender, P2pSender]] = {}
        for d in set(own):
            if ipc_ok.get(d):
                senders[d] = IpcSender(self.ipc_queues[(t, d)], device)
            else:
                senders[d] = P2pSender(self.targets + d, pair_group(self.groups, t, d), device)
        role = TargetRole(plan.cfg, t, device, plan.seed, corpus, forward, plan.start_step)
        self.emit(Ready())
        self.phase("serving batches")
        count = batches_per_target(self.targets, len(plan.drafter_devices), plan.steps)[t]
        TargetLoop(role, self.outcome, lambda batch, k: senders[own[(k - 1) % len(own)]].send(batch), count,
                   inject=FailureHook(plan, self.outcome.name, self._kill)).run()

    def _run_drafter(self) -> None:
        import torch

        from dflash_doctor.reference.loop import DrafterLoop, FailureHook
        from dflash_doctor.reference.roles import target_dtype
        from dflash_doctor.reference.setup import build_drafter, drafter_heads, wants_warm_up, wrap_step

        plan = self.plan
        index = self.rank - self.targets
        device = torch.device(self.outcome.device)
        self.phase(f"building {self.outcome.name} on {device}")
        role = build_drafter(plan, index, device, drafter_heads(plan, device))
        if wants_warm_up(plan.mitigations):
            self.phase(f"warm-up: {self.outcome.name}'s first step alone (compiling its graphs)")
            role.warm_up(plan.seed)
        sources, _ = routes(self.targets, len(plan.drafter_devices))
        ipc_ok = self._check_ipc_as_drafter([t for t in sorted(set(sources[index])) if route_kind(
            plan, plan.target_devices[t], self.outcome.device) is Transport.IPC], index)
        receivers: Dict[int, Union[IpcReceiver, P2pReceiver]] = {}
        for t in set(sources[index]):
            if ipc_ok.get(t):
                receivers[t] = IpcReceiver(self.ipc_queues[(t, index)])
            else:
                receivers[t] = P2pReceiver(t, pair_group(self.groups, t, index), device, target_dtype(device))
        own = sources[index]
        drafters = len(plan.drafter_devices)
        average = None
        if drafters > 1 and self.groups is not None:
            average = GradientAllReduce(self.groups.get("drafters"), self.groups.backends["drafters"], device,
                                        drafters)
        self.emit(Ready())
        received = [0]

        def next_batch():
            received[0] += 1
            return receivers[own[(received[0] - 1) % len(own)]].recv()

        DrafterLoop(plan, index, role, self.outcome, next_batch, lambda record: self.emit(Step(record)),
                    average=average, compute=wrap_step(plan.mitigations, role.compute), recorder=self.recorder,
                    inject=FailureHook(plan, self.outcome.name, self._kill),
                    on_phase=lambda text: self.emit(Phase(text))).run()

    def _check_ipc_as_target(self, drafters: List[int], device) -> Dict[int, bool]:
        """Before the first batch, each IPC route carries a probe and the drafter says (over gloo) whether it read
        it; a route where it did not falls back to torch.distributed, and the report says why. (The H200 machines
        run under sandboxes; not every one is known to allow CUDA IPC.) Every probe is put before any answer is
        awaited, so ranks with several routes cannot wait on each other."""
        import torch
        import torch.distributed as dist

        offered = {d: offer_probe(self.ipc_queues[(self.rank, d)], device) for d in drafters}
        verdict = {}
        for d in drafters:
            answer = torch.zeros(1)
            dist.recv(answer, self.targets + d)
            verdict[d] = offered[d] is None and bool(answer.item())
            if not verdict[d]:
                self.emit(TransportFallback(f"target-{self.rank} -> drafter-{d}: CUDA IPC unusable "
                                            f"({offered[d] or 'the drafter could not read the probe'}); gloo instead"))
        return verdict

    def _check_ipc_as_drafter(self, targets: List[int], index: int) -> Dict[int, bool]:
        import torch
        import torch.distributed as dist

        verdict = {}
        for t in targets:
            problem = take_probe(self.ipc_queues[(t, index)])
            verdict[t] = problem is None
            if problem is not None:
                LOG.error("CUDA IPC from target-%d unusable here: %s", t, problem)
            dist.send(torch.tensor([1.0 if problem is None else 0.0]), t)
        return verdict

    def blame(self) -> List[BlameFacts]:
        return [b.to_dict() for b in self.recorder.blames] if self.recorder else []


def _watch_parent(parent: int) -> None:
    """Leave when the parent is gone (killed with SIGKILL, say): no orphan keeps a GPU busy."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _rank_entry(rank: int, world: int, plan: RunPlan, outbox, init_method: str, log_level: int, ipc_queues,
                stack_file: str, parent: int) -> None:
    """A spawned rank. SIGINT is the parent's to handle (a terminal sends it to the whole group); the parent
    ends ranks with SIGTERM. Everything the rank has to say goes through `outbox`."""
    import faulthandler

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watch", daemon=True).start()
    dump = open(stack_file, "w", encoding="utf-8")
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
    LOG.addHandler(handler)
    LOG.setLevel(log_level)

    messages = Outbox(outbox, _names(plan)[rank])
    worker = Rank(plan, rank, world, messages, ipc_queues)
    try:
        worker.connect(init_method)
        messages.put(Threads({t.ident: t.name for t in threading.enumerate() if t.ident is not None}))
        worker.run()
        worker.outcome.phase = "done"
        messages.put(Blame(worker.blame()))
        messages.put(Ended(worker.outcome))
        import torch.distributed as dist

        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then a non-zero exit
        outcome = worker.outcome
        outcome.outcome, outcome.error = Outcome.ERROR, f"{exc.__class__.__name__}: {exc}"
        outcome.traceback = traceback.format_exc()
        LOG.error("Exception in %s: %s", outcome.name, outcome.error)
        messages.put(Blame(worker.blame()))
        messages.put(Ended(outcome))
        messages.flush()
        os._exit(1)


# -- the parent ---------------------------------------------------------------------------------------------
def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


@contextmanager
def _children_cannot_import_from_here() -> Iterator[None]:
    """While multiprocessing starts its children (the ranks, the resource tracker): their interpreters start with
    this package first on the import path and without the working folder (PYTHONSAFEPATH; on Python < 3.11,
    which ignores it, the working folder is a fresh empty one while they start), so a torch.py where the user
    runs dflash-doctor is never imported by a worker. The CLI's whole environment is already so
    (children.isolate_process); this holds when the pipeline runs as a library too."""
    import sys

    from dflash_doctor.children import child_env

    wanted = child_env()
    saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "PYTHONSAFEPATH")}
    cwd = os.getcwd()
    neutral = tempfile.mkdtemp(prefix="dflash-doctor-spawn-") if sys.version_info < (3, 11) else None
    os.environ.update({key: wanted[key] for key in saved})
    if neutral:
        os.chdir(neutral)
    try:
        yield
    finally:
        if neutral:
            os.chdir(cwd)
            os.rmdir(neutral)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class ProcessRun:
    def __init__(self, plan: RunPlan, progress: Progress, clock: Callable[[], float], stop: StopRequest) -> None:
        self.plan, self.progress, self.clock, self.stop = plan, progress, clock, stop
        self.started = clock()
        self.names, self.devices = _names(plan), _devices(plan)
        self.targets = len(plan.target_devices)
        self.procs: list = []
        self.reported: Dict[str, WorkerOutcome] = {}
        self.phases: Dict[str, str] = {n: "starting" for n in self.names}
        self.ready: set = set()
        self.thread_names: Dict[str, Dict[int, str]] = {}
        self.blame: List[BlameFacts] = []
        # What the ranks report for the facts besides their outcomes and steps.
        self.corpus: Optional[WrittenCorpusFacts] = None  # target-0 writes it
        self.target_forward: Optional[str] = None
        self.transport_fallbacks: List[str] = []  # IPC routes that fell back to gloo, and why
        self.garbled: Dict[str, str] = {}  # a rank (or PARENT) -> why a message from it could not be read
        self.aggregator = StepAggregator(len(plan.drafter_devices), plan.steps, progress,
                                         first_step=plan.start_step + 1)
        self.steps_done: Dict[str, int] = {n: 0 for n in plan.drafter_names()}
        self.mitigation_facts: dict = {}
        self.failed_worker: Optional[str] = None
        self.last_progress = self.started
        self.setup_s: Optional[float] = None
        self.hang: Optional[HangDiagnosis] = None
        self.hang_stacks: list = []
        self.workdir = tempfile.mkdtemp(prefix="dflash-doctor-ranks-")

    # -- start ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        import torch.multiprocessing as mp

        from dflash_doctor import children

        # Everything multiprocessing starts, not only the ranks: the first queue starts its resource tracker,
        # a `python -c` child that would put the working folder first on its path (a threading.py there ran).
        with _children_cannot_import_from_here():
            ctx = mp.get_context("spawn")
            self.outbox = ctx.Queue()
            # Kept for the whole run: a queue the parent drops is unlinked before the ranks have opened it.
            self.ipc_queues = {key: ctx.Queue(maxsize=self.plan.cfg.queue_depth)
                               for key in ipc_queue_keys(self.plan)}
            init_method = f"tcp://127.0.0.1:{_free_port()}"
            world = len(self.names)
            # Not daemonic: a rank's inductor compiles start processes of their own, which a daemon may not.
            self.procs = [ctx.Process(target=_rank_entry, name=name,
                                      args=(rank, world, self.plan, self.outbox, init_method,
                                            LOG.getEffectiveLevel(), self.ipc_queues, self.stack_file(name),
                                            os.getpid()))
                          for rank, name in enumerate(self.names)]
            self.stop.hard_stop.append(self.kill_all)
            for proc in self.procs:
                proc.start()
                children.adopt(proc.pid)  # killed with every other child on any way out of the command

    def stack_file(self, name: str) -> str:
        return str(Path(self.workdir) / f"{name}.stacks")

    # -- supervise -----------------------------------------------------------------------------------------
    def take(self, timeout: float) -> bool:
        """Handle one message from a rank; False when none came within `timeout`."""
        try:
            raw = self.outbox.get(timeout=timeout)
        except queue.Empty:
            return False
        self.last_progress = self.clock()
        try:
            received = decode(raw, self.names)
        except MessageError as exc:
            self.unreadable(exc)
            return True
        sender, message = received.sender, received.message
        if isinstance(message, Step):
            self.aggregator.add(message.record)
            self.steps_done[message.record.worker] += 1
        elif isinstance(message, Phase):
            self.phases[sender] = message.text
            self.progress.phase(sender, message.text)
        elif isinstance(message, Ready):
            self.ready.add(sender)
            if len(self.ready) == len(self.names) and self.setup_s is None:
                self.setup_s = self.clock() - self.started
        elif isinstance(message, Threads):
            self.thread_names[sender] = message.names
        elif isinstance(message, Blame):
            self.blame.extend(message.blames)
        elif isinstance(message, Corpus):
            self.corpus = message.facts
        elif isinstance(message, TargetForward):
            self.target_forward = message.mode
        elif isinstance(message, TransportFallback):
            self.transport_fallbacks.append(message.reason)
        elif isinstance(message, Ended):
            self.reported[message.outcome.name] = message.outcome
            if message.outcome.outcome in (Outcome.ERROR, Outcome.KILLED) and self.failed_worker is None:
                self.failed_worker = message.outcome.name
        else:
            unhandled(message)
        return True

    def unreadable(self, error: MessageError) -> None:
        """A message the parent cannot read ends the run (what it knows of the ranks can no longer be trusted),
        with its sender failed and the reason as its error; a sender it cannot name is the parent's own entry."""
        LOG.error("%s", error)
        name = error.sender if error.sender in self.names else PARENT
        self.garbled.setdefault(name, str(error))
        self.failed_worker = self.failed_worker or name

    def capture_stacks(self) -> list:
        """Every live rank's threads, dumped by faulthandler on SIGUSR1; names are rank/thread."""
        from dflash_doctor.runtime.stacks import ThreadStack, parse_faulthandler

        for proc in self.procs:
            if proc.exitcode is None and proc.pid:
                os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(STACK_DUMP_WAIT_S)
        stacks = []
        for name in self.names:
            text = Path(self.stack_file(name)).read_text(encoding="utf-8", errors="replace")
            names = {int(ident): thread for ident, thread in self.thread_names.get(name, {}).items()}
            for stack in parse_faulthandler(text, names):
                label = stack.name if stack.name == name else f"{name}/{stack.name}"
                stacks.append(ThreadStack(label, stack.ident, stack.frames))
        return stacks

    def on_hang(self, report) -> None:
        """Classify each rank's stacks on their own (a lock cycle lives inside one process) and keep the most
        specific diagnosis."""
        from dflash_doctor.runtime.deadlock import classify_hang

        by_rank: Dict[str, list] = {}
        for stack in report.stacks:
            by_rank.setdefault(stack.name.split("/")[0], []).append(stack)
        diagnoses = [classify_hang(stacks, report.diagnosis.stalled_s) for stacks in by_rank.values()]
        most_specific_first = list(HangCycle)  # its declaration order
        hang = min(diagnoses or [report.diagnosis], key=lambda d: most_specific_first.index(d.cycle))
        self.hang, self.hang_stacks = hang, report.stacks
        involved = [t.split("/")[0] for t in hang.threads if t.split("/")[0] in self.names]
        slowest = min(self.steps_done, key=lambda name: self.steps_done[name])
        self.failed_worker = self.failed_worker or (involved[0] if involved else slowest)
        LOG.error("no drafter step for %.0f s: %s", self.plan.stall_timeout_s, hang.summary())

    def supervise(self) -> None:
        from dflash_doctor import runtime

        watchdog = None
        try:
            while self.failed_worker is None and self.hang is None and not self.stop.requested:
                self.take(self.plan.poll_s)
                if watchdog is None and self.setup_s is not None:
                    # Set-up is its own phase: the stall clock starts when every rank is ready.
                    self.last_progress = self.clock()
                    watchdog = runtime.Watchdog(lambda: self.last_progress, self.plan.stall_timeout_s, self.on_hang,
                                                clock=self.clock, poll_s=self.plan.poll_s,
                                                capture=self.capture_stacks).start()
                for name, proc in zip(self.names, self.procs):
                    if proc.exitcode not in (None, 0) and self.failed_worker is None:
                        while self.take(0.2):  # its own last word (the reason) may still be in flight
                            pass
                        self.failed_worker = self.failed_worker or name
                if all(p.exitcode is not None for p in self.procs):
                    break
        finally:
            if watchdog is not None:
                watchdog.stop()

    # -- shut down -----------------------------------------------------------------------------------------
    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.exitcode is None:
                proc.kill()

    def shut_down(self) -> None:
        """Ranks still running are ended now (they may wait in a collective for a dead peer): SIGTERM, and
        SIGKILL for any that has not gone after the grace."""
        from dflash_doctor import children

        for proc in self.procs:
            if proc.exitcode is None:
                proc.terminate()
        grace = self.plan.stop_grace_s if self.stop.requested or self.hang else self.plan.join_timeout_s
        deadline = self.clock() + grace
        for proc in self.procs:
            while proc.exitcode is None and self.clock() < deadline:
                proc.join(self.plan.poll_s)
                if self.stop.requested:  # a signal while waiting: the grace, not the full join timeout
                    deadline = min(deadline, self.clock() + self.plan.stop_grace_s)
            if proc.exitcode is None:
                proc.kill()
                proc.join(timeout=5)
            if proc.exitcode is not None:
                children.release(proc.pid)
        while self.take(0.05):  # late messages (a step finished just before the end)
            pass

    # -- collect -------------------------------------------------------------------------------------------
    def hung_ranks(self) -> Set[str]:
        """The ranks the stall diagnosis names (their threads are rank/thread), or every drafter if it names none."""
        named: Set[str] = set()
        if self.hang is not None:
            named = {thread.split("/")[0] for thread in self.hang.threads} & set(self.names)
        return named or set(self.plan.drafter_names())

    def outcome_of(self, rank: int, name: str, proc) -> WorkerOutcome:
        outcome = self.reported.get(name)
        if outcome is None:
            role = "target" if rank < self.targets else "drafter"
            outcome = WorkerOutcome(name, role, self.devices[rank], phase=self.phases.get(name, "starting"))
            if self.hang is not None and name in self.hung_ranks():
                outcome.outcome = Outcome.HUNG
                outcome.error = f"no drafter step for {self.plan.stall_timeout_s:.0f} s"
            elif name == self.failed_worker and not self.stop.requested:
                code = proc.exitcode
                outcome.outcome = Outcome.KILLED if code is not None and code < 0 else Outcome.ERROR
                outcome.error = _exit_reason(code) if code is not None else "did not stop"
            else:
                outcome.outcome = Outcome.STOPPED
                if self.stop.requested:
                    outcome.error = f"stopped by {self.stop.signal_name}"
        elif name != self.failed_worker and outcome.outcome is Outcome.ERROR and (
                self.failed_worker or self.stop.requested):
            outcome.outcome = Outcome.STOPPED  # its error (a peer vanished) is a consequence, kept in `error`
        if name in self.garbled:  # whatever else it said, the run ended on this
            outcome.outcome, outcome.error = Outcome.ERROR, self.garbled[name]
        outcome.steps = max(outcome.steps, self.steps_done.get(name, 0))
        return outcome

    def collect(self) -> PipelineResult:
        from dflash_doctor import mitigations
        from dflash_doctor.reference.workers_threads import saved_path

        plan, aggregator = self.plan, self.aggregator
        outcomes = [self.outcome_of(rank, name, proc)
                    for rank, (name, proc) in enumerate(zip(self.names, self.procs))]
        if PARENT in self.garbled:
            outcomes.append(WorkerOutcome(PARENT, PARENT, "cpu", Outcome.ERROR, self.garbled[PARENT],
                                          phase="supervising the ranks"))
        failed = self.failed_worker if self.hang or any(o.outcome in FAILED for o in outcomes) else None
        hang = self.hang
        for path in Path(self.workdir).glob("*.stacks"):
            path.unlink()
        os.rmdir(self.workdir)
        return PipelineResult(
            compile_dense=plan.cfg.compile_dense,
            preset=plan.cfg.name, workers_mode="processes", device_type=plan.device_type,
            steps=len(aggregator.losses), start_step=plan.start_step, losses=aggregator.losses,
            tokens=aggregator.steady_tokens(), tokens_per_s=aggregator.tokens_per_s(),
            warmup_s=(aggregator.step_ends[0] - self.started) if aggregator.step_ends else None,
            setup_s=self.setup_s, step_time_s=aggregator.step_times(), wall_s=self.clock() - self.started,
            workers=outcomes, failed_worker=failed, mitigation=mitigations.label(plan.mitigations),
            mitigation_facts=self.mitigation_facts, hang=hang.to_dict() if hang else None, stacks=[s.to_dict() for s in self.hang_stacks],
            blame=self.blame, interrupted=self.stop.signal_name, corpus=self.corpus,
            target_forward=self.target_forward,
            saved_to=saved_path(plan, failed or self.stop.signal_name, outcomes), transport=self.transport(),
        )

    def transport(self) -> str:
        fallbacks = self.transport_fallbacks
        return describe(self.plan) + (f" (fell back on {len(fallbacks)} route(s): {'; '.join(fallbacks)})"
                                      if fallbacks else "")


def _gather_pickled(obj, rank: int, world: int, dst: int) -> list:
    """Every rank's `obj` on rank `dst` (others get []), pickled into byte tensors: gather_object needs numpy."""
    import pickle

    import torch
    import torch.distributed as dist

    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([data.numel()]))
    longest = max(int(size) for size in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:data.numel()] = data
    slots = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)] if rank == dst else None
    dist.gather(padded, slots, dst=dst)
    if slots is None:
        return []
    return [pickle.loads(bytes(slot[:int(size)].tolist())) for slot, size in zip(slots, sizes)]


def _read_gathered(gathered: list, plan: RunPlan) -> List[Tuple[WorkerOutcome, List[StepRecord]]]:
    """Each rank's outcome and steps from the messages gathered to the reporting rank (through the codec, as a
    parent reads them); a rank whose messages cannot be read is reported failed, with the reason."""
    pairs = []
    targets = len(plan.target_devices)
    for rank, (name, device, envelopes) in enumerate(zip(_names(plan), _devices(plan), gathered)):
        records: List[StepRecord] = []
        outcome = WorkerOutcome(name, "target" if rank < targets else "drafter", device, Outcome.ERROR,
                                f"{name} gathered no outcome")
        try:
            for envelope in envelopes:
                message = decode(envelope, [name]).message
                if isinstance(message, Step):
                    records.append(message.record)
                elif isinstance(message, Ended):
                    outcome = message.outcome
        except (MessageError, TypeError) as exc:  # TypeError: what was gathered is not a list
            outcome.outcome, outcome.error = Outcome.ERROR, str(exc)
        pairs.append((outcome, records))
    return pairs


def _under_torchrun(plan: RunPlan, progress: Progress, clock) -> PipelineResult:
    """This process is one rank of a torchrun job; the first drafter rank gathers everyone's outcome and steps.

    If a rank dies, torchrun itself ends the job; the surviving ranks' reports are then incomplete by design.
    Batches go through torch.distributed (there is no parent to create IPC queues).
    """
    import dataclasses

    import torch.distributed as dist

    plan = dataclasses.replace(plan, transport=Transport.P2P)
    started = clock()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    expected = len(plan.target_devices) + len(plan.drafter_devices)
    if world != expected:
        raise ValueError(f"torchrun started {world} ranks; this plan has {expected} workers "
                         f"({len(plan.target_devices)} target + {len(plan.drafter_devices)} drafter)")
    kept = KeptSteps()
    worker = Rank(plan, rank, world, kept)
    worker.connect("env://")
    worker.run()
    reporter = len(plan.target_devices)
    said = [encode(worker.outcome.name, Step(record)) for record in kept.records]
    said.append(encode(worker.outcome.name, Ended(worker.outcome)))
    gathered = _gather_pickled(said, rank, world, reporter)
    dist.destroy_process_group()
    pairs = _read_gathered(gathered, plan) if rank == reporter else [(worker.outcome, kept.records)]
    aggregator = StepAggregator(len(plan.drafter_devices), plan.steps, progress, first_step=plan.start_step + 1)
    for _, rank_records in pairs:
        for record in sorted(rank_records, key=lambda r: r.step):
            aggregator.add(record)
    return PipelineResult(
        compile_dense=plan.cfg.compile_dense,
        preset=plan.cfg.name, workers_mode="processes", device_type=plan.device_type,
        steps=len(aggregator.losses), start_step=plan.start_step, losses=aggregator.losses,
        tokens=aggregator.steady_tokens(), tokens_per_s=aggregator.tokens_per_s(),
        warmup_s=(aggregator.step_ends[0] - started) if aggregator.step_ends else None,
        step_time_s=aggregator.step_times(), wall_s=clock() - started, workers=[o for o, _ in pairs],
        transport=describe(plan),
    )


def run_processes(plan: RunPlan, progress: Optional[Progress] = None, clock=time.perf_counter,
                  stop: Optional[StopRequest] = None) -> PipelineResult:
    progress = progress or Progress()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _under_torchrun(plan, progress, clock)
    stop = stop or StopRequest()
    with stop_signals(stop):
        from dflash_doctor.reference.setup import apply_mitigations

        # Here too, before any rank starts: a mitigation that cannot apply to this torch is the user's to fix.
        facts = apply_mitigations(plan.mitigations)
        orchestration = ProcessRun(plan, progress, clock, stop)
        orchestration.mitigation_facts = facts
        orchestration.start()
        orchestration.supervise()
        orchestration.shut_down()
        return orchestration.collect()

