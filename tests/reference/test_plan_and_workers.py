"""Plans from options, routing of batches between ranks, and the thread workers' shared machinery (in-process)."""
from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from dflash_doctor.errors import UsageError  # noqa: E402
from dflash_doctor.reference.pipeline import (  # noqa: E402
    PipelineOptions, default_devices, make_plan, parse_devices, run_pipeline, workers_mode,
)
from dflash_doctor.reference.results import (  # noqa: E402
    FailHow, Outcome, Progress, StepAggregator, StepRecord, Transport, percentiles,
)
from dflash_doctor.reference.transport import batches_per_target, describe, group_specs, routes  # noqa: E402
from dflash_doctor.reference.workers_threads import GradientAverager, Run, Stopped, run_threads  # noqa: E402


def test_seeds_topology_maps_one_worker_per_gpu_on_eight_and_shares_on_fewer():
    assert default_devices(5, 3, "cuda", 8) == ([f"cuda:{i}" for i in range(5)], ["cuda:5", "cuda:6", "cuda:7"])
    assert default_devices(5, 3, "cuda", 1) == (["cuda:0"] * 5, ["cuda:0"] * 3)
    assert default_devices(5, 3, "cuda", 4) == (["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"],
                                                ["cuda:2", "cuda:3", "cuda:2"])
    assert default_devices(1, 2, "cpu", 0) == (["cpu"], ["cpu", "cpu"])


def test_device_lists():
    assert parse_devices("0, 2,cuda:3", "cuda", 4) == ["cuda:0", "cuda:2", "cuda:3"]
    with pytest.raises(ValueError, match="only 4 CUDA device"):
        parse_devices("4", "cuda", 4)
    with pytest.raises(ValueError, match="not a cpu device"):
        parse_devices("cuda:0", "cpu", 0)


@pytest.mark.parametrize("options, message", [
    (PipelineOptions(preset="huge"), "unknown preset 'huge'"),
    (PipelineOptions(workers="fibers"), "--workers must be one of"),
    (PipelineOptions(checkpoint="sometimes"), "--checkpoint must be one of"),
    (PipelineOptions(steps=0), "--steps must be at least 1"),
    (PipelineOptions(resume=True), "--resume needs --save DIR"),
    (PipelineOptions(fail_worker="drafter-9"), "--fail-worker 'drafter-9' is not a worker of this run"),
    (PipelineOptions(fail_worker="drafter-1", fail_at_step=0), "--fail-at-step must be at least 1"),
    (PipelineOptions(fail_how="explode"), "--fail-how must be one of kill, raise, hang"),
    (PipelineOptions(seed=-1), "--seed must be in 0..9223372036854775807"),
    (PipelineOptions(seed=2 ** 64), "--seed must be in 0.."),
    (PipelineOptions(stall_timeout_s=float("nan")), "--stall-timeout must be a positive number"),
    (PipelineOptions(stall_timeout_s=0.0), "--stall-timeout must be a positive number"),
    (PipelineOptions(transport="pigeon"), "--transport must be one of auto, ipc, p2p"),
    (PipelineOptions(transport="ipc"), "--transport ipc is for --workers processes"),
    (PipelineOptions(mitigation="processes", workers="threads"), "cannot be combined with --workers threads"),
    (PipelineOptions(device="cuda"), "no CUDA device"),
    (PipelineOptions(hf_checkpoint="/"), "--target-checkpoint / is not a local Hugging Face checkpoint"),
])
def test_bad_options_are_one_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        make_plan(options, cuda_device_count=lambda: 0)


def test_unknown_mitigations_are_refused_with_the_registrys_names():
    with pytest.raises(UsageError, match="unknown mitigation sleep-more; choose from none, first-call-lock"):
        make_plan(PipelineOptions(mitigation="threadlocal-flag,sleep-more"))


def test_mitigations_resolve_through_the_registry():
    plan = make_plan(PipelineOptions(mitigation="non-lazy-backward,threadlocal-flag"))
    assert plan.mitigations == ("threadlocal-flag", "non-lazy-backward")  # the registry's order
    assert workers_mode(PipelineOptions(mitigation="processes")) == "processes"
    assert make_plan(PipelineOptions(mitigation="processes")).mitigations == ()
    assert workers_mode(PipelineOptions()) == "threads"


def test_save_to_an_unwritable_folder_is_refused_before_anything_runs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match=f"--save {blocker / 'sub'}: cannot write there"):
        make_plan(PipelineOptions(save_dir=str(blocker / "sub")))


def test_ipc_transport_needs_each_route_on_one_device():
    options = PipelineOptions(workers="processes", transport="ipc", device="cuda", target_devices="0",
                              drafter_devices="1")
    with pytest.raises(ValueError, match="--transport ipc needs each target and its drafter on one device; cuda:0 "
                                         "feeds cuda:1"):
        make_plan(options, cuda_device_count=lambda: 2)


def _cuda_plan(targets, drafters, transport="auto"):
    options = PipelineOptions(preset="seeds", device="cuda", workers="processes", target_devices=targets,
                              drafter_devices=drafters, transport=transport)
    return make_plan(options, cuda_device_count=lambda: 8)


def test_process_groups_nccl_between_gpus_and_ipc_on_a_shared_one():
    eight = _cuda_plan("0,1,2,3,4", "5,6,7")
    specs = {s.name: (s.ranks, s.backend) for s in group_specs(eight)}
    assert specs["targets"] == ((0, 1, 2, 3, 4), "gloo")  # the corpus broadcast: tokens on the host
    assert specs["drafters"] == ((5, 6, 7), "nccl")
    assert specs["pair:0:0"] == ((0, 5), "nccl") and specs["pair:4:1"] == ((4, 6), "nccl")
    assert describe(eight) == "nccl"
    one = _cuda_plan("0,0,0,0,0", "0,0,0")
    assert {s.name: s.backend for s in group_specs(one)} == {"targets": "gloo", "drafters": "gloo"}
    assert describe(one) == "cuda-ipc"
    forced = _cuda_plan("0", "0", transport="p2p")
    assert group_specs(forced) == [] and describe(forced) == "gloo"  # host-staged: NCCL refuses one GPU twice


def test_plan_on_cpu_trains_through_sdpa_dense_and_counts_workers_from_device_lists():
    plan = make_plan(PipelineOptions(target_devices="cpu,cpu", drafter_devices="cpu"))
    assert plan.attention_path == "sdpa-dense"  # flex_attention has no CPU backward
    assert plan.target_names() == ["target-0", "target-1"] and plan.drafter_names() == ["drafter-0"]
    assert plan.transport is Transport.AUTO and plan.fail_how is FailHow.KILL
    assert describe(plan) == "gloo"


def test_drafters_sharing_a_device_get_distinct_shapes_in_the_seeds_preset():
    one_gpu = _cuda_plan("0,0,0,0,0", "0,0,0")
    assert [one_gpu.drafter_cfg(i).blocks_per_seq for i in range(3)] == [64, 65, 66]
    eight = _cuda_plan("0,1,2,3,4", "5,6,7")
    assert [eight.drafter_cfg(i).blocks_per_seq for i in range(3)] == [64, 64, 64]  # own GPUs: own graphs anyway
    tiny = make_plan(PipelineOptions())
    assert [tiny.drafter_cfg(i).blocks_per_seq for i in range(2)] == [8, 8]


@pytest.mark.parametrize("targets, drafters", [(1, 2), (5, 3), (3, 3), (2, 5)])
def test_routes_give_every_worker_a_partner_and_targets_send_exactly_what_drafters_take(targets, drafters):
    sources, consumers = routes(targets, drafters)
    assert all(sources) and all(consumers)
    for d, own in enumerate(sources):
        for t in own:
            assert d in consumers[t]
    assert sum(batches_per_target(targets, drafters, 7)) == 7 * drafters


class Recording(Progress):
    def __init__(self):
        self.steps, self.phases = [], []

    def step(self, done, total, loss, tokens_per_s):
        self.steps.append((done, total, loss, tokens_per_s))

    def phase(self, worker, text):
        self.phases.append((worker, text))


def test_step_aggregator_waits_for_every_replica_and_measures_after_the_first_step():
    seen = Recording()
    agg = StepAggregator(2, 3, seen, first_step=5)
    agg.add(StepRecord(5, "drafter-0", 4.0, 100, 1.0, 10.0))
    assert seen.steps == []
    agg.add(StepRecord(6, "drafter-1", 2.0, 100, 1.0, 11.0))  # early record for the next step: held
    agg.add(StepRecord(5, "drafter-1", 2.0, 100, 1.0, 10.5))
    agg.add(StepRecord(6, "drafter-0", 1.0, 100, 1.0, 12.5))
    assert seen.steps == [(1, 3, 3.0, None), (2, 3, 1.5, 200 / 2.0)]
    assert agg.step_times() == {"p50": 2.0, "p90": 2.0, "p99": 2.0, "max": 2.0}


def test_percentiles_are_nearest_rank():
    assert percentiles([]) is None
    assert percentiles([float(v) for v in range(1, 101)]) == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}
    assert percentiles([3.0, 1.0]) == {"p50": 1.0, "p90": 3.0, "p99": 3.0, "max": 3.0}


@pytest.mark.timeout(30)
def test_gradient_averager_gives_every_replica_the_mean_and_stops_when_asked():
    run = Run(poll_s=0.05)
    averager = GradientAverager(3, run)
    results = [None] * 3

    def replica(i):
        results[i] = [g.tolist() for g in averager.average(i, [torch.tensor([float(i)]), torch.tensor([i * 3.0])])]

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert results == [[[1.0], [3.0]]] * 3

    lonely = GradientAverager(2, run)
    errors = []

    def waits_forever():
        try:
            lonely.average(0, [torch.zeros(1)])
        except Stopped:
            errors.append("stopped")

    t = threading.Thread(target=waits_forever)
    t.start()
    run.fail("drafter-1")
    t.join(timeout=5)
    assert not t.is_alive() and errors == ["stopped"] and run.failed_worker == "drafter-1"


@pytest.mark.slow  # a real compile end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(90)
def test_a_deadlocked_drafter_thread_is_diagnosed_from_its_stacks_and_the_run_returns():
    from dflash_doctor.reference.findings import findings_from_facts

    plan = replace(make_plan(PipelineOptions(steps=6, fail_worker="drafter-1", fail_at_step=2, fail_how="hang")),
                   stall_timeout_s=2.0, poll_s=0.05)
    progress = Recording()
    result = run_threads(plan, progress)
    by_name = {w.name: w for w in result.workers}
    assert by_name["drafter-1"].outcome is Outcome.HUNG  # blocked for good: it cannot be joined
    assert by_name["drafter-0"].outcome is Outcome.STOPPED and by_name["target-0"].outcome is Outcome.STOPPED
    assert result.failed_worker == "drafter-1"
    assert result.hang["cycle"] == "lock-cycle"
    assert sorted(result.hang["threads"]) == ["drafter-1", "drafter-1-helper"]
    assert {s["name"] for s in result.stacks} >= {"drafter-1", "drafter-1-helper", "drafter-0", "target-0"}
    # Set-up was reported as it went, worker by worker, and was not counted as the stall.
    assert ("target-0", "building the target on cpu") in progress.phases
    assert result.setup_s is not None and set(result.setup) >= {"hooks", "targets", "corpus", "drafters"}
    [finding] = findings_from_facts(result.facts())
    assert (finding.code, finding.name) == ("DFD805", "pipeline-lock-deadlock")
    assert finding.message == "drafter-1 deadlocked on locks (threads in the cycle: drafter-1, drafter-1-helper)"
    assert finding.evidence["chain"][0].startswith("drafter-1 holds mine and waits for theirs")
    assert [s["name"] for s in finding.evidence["stacks"]] == ["drafter-1", "drafter-1-helper"]


class SlowSetUpClock:
    """Real time, except that every reading the set-up thread takes moves the clock 10 s on: a set-up of minutes."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        if threading.current_thread().name == "set-up":
            self.offset += 10.0
        return time.perf_counter() + self.offset


@pytest.mark.timeout(60)
def test_set_up_longer_than_the_stall_timeout_is_not_a_stall():
    plan = replace(make_plan(PipelineOptions(steps=3)), stall_timeout_s=5.0, poll_s=0.05)
    result = run_threads(plan, clock=SlowSetUpClock())
    assert result.setup_s > 5 * plan.stall_timeout_s  # the set-up "took" far longer than the stall timeout
    assert result.ok and result.hang is None and result.steps == 3


@pytest.mark.timeout(90)
def test_a_dead_target_worker_stops_the_drafters_in_process():
    result = run_threads(make_plan(PipelineOptions(steps=10, fail_worker="target-0", fail_at_step=2)))
    assert result.failed_worker == "target-0" and not result.ok
    assert [(w.name, w.outcome) for w in result.workers] == [
        ("target-0", Outcome.KILLED), ("drafter-0", Outcome.STOPPED), ("drafter-1", Outcome.STOPPED)]
    assert result.workers[0].steps == 1  # it handed over one batch, then died at its second


@pytest.mark.timeout(120)
def test_save_then_resume_continues_from_the_saved_drafter(tmp_path):
    folder = str(tmp_path / "run")
    first = run_pipeline(PipelineOptions(steps=4, save_dir=folder))
    saved = tmp_path / "run" / "drafter.pt"
    assert first.ok and first.saved_to == str(saved)
    assert [p.name for p in saved.parent.iterdir()] == ["drafter.pt"]  # no temp file left behind
    assert torch.load(saved, weights_only=True)["step"] == 4

    resumed = run_pipeline(PipelineOptions(steps=2, save_dir=folder, resume=True))
    assert resumed.ok and resumed.start_step == 4 and resumed.steps == 2
    # A fresh drafter starts near ln(vocab) on this task; a resumed one starts where the first run left off.
    assert resumed.losses[0] < 0.8 * first.losses[0]
    assert torch.load(saved, weights_only=True)["step"] == 6


@pytest.mark.timeout(30)
def test_workers_that_do_not_stop_after_a_failure_are_diagnosed_from_their_stacks():
    from dflash_doctor.reference.loop import inject_hang
    from dflash_doctor.reference.signals import StopRequest
    from dflash_doctor.reference.workers_threads import ThreadRun

    plan = replace(make_plan(PipelineOptions()), poll_s=0.05)
    orchestration = ThreadRun(plan, Progress(), time.perf_counter, threading.Thread, StopRequest())
    stuck = threading.Thread(target=inject_hang, args=("drafter-0",), name="drafter-0", daemon=True)
    stuck.start()
    orchestration.threads = [stuck]
    orchestration.run.fail("drafter-1")  # another worker died; drafter-0 never sees the stop
    orchestration._join(0.2)
    orchestration._diagnose_stuck(0.2)
    assert orchestration.hang.diagnosis.cycle == "lock-cycle"
    assert sorted(orchestration.hang.diagnosis.threads) == ["drafter-0", "drafter-0-helper"]


@pytest.mark.timeout(60)
def test_a_failing_set_up_ends_the_run_with_its_error_and_no_worker_started():
    from dflash_doctor.reference.findings import findings_from_facts

    plan = make_plan(PipelineOptions(steps=3))
    plan = replace(plan, cfg=replace(plan.cfg, prompt_len=plan.cfg.seq_len))  # no room left to decode
    result = run_threads(plan)
    assert result.failed_worker == "set-up" and result.steps == 0
    assert [(w.name, w.outcome) for w in result.workers] == [
        ("target-0", Outcome.STOPPED), ("drafter-0", Outcome.STOPPED), ("drafter-1", Outcome.STOPPED),
        ("set-up", Outcome.ERROR)]
    [finding] = findings_from_facts(result.facts())
    assert finding.message == "set-up failed before the workers started: ValueError: prompt length 64 must be in 1..63"


class _SandboxQueue:
    """A queue in a sandbox without CUDA IPC: sharing the first tensor fails, like cudaIpcGetMemHandle would."""

    def __init__(self):
        self.items = []

    def put(self, item):
        if item is not None:
            raise RuntimeError("CUDA error: operation not supported")
        self.items.append(item)

    def get(self):
        return self.items.pop(0)


def test_an_ipc_route_that_cannot_share_memory_says_why_and_the_drafter_is_not_left_waiting():
    import queue as queues

    from dflash_doctor.reference.transport import offer_probe, take_probe

    sandbox = _SandboxQueue()
    assert offer_probe(sandbox, torch.device("cpu")) == "RuntimeError: CUDA error: operation not supported"
    assert take_probe(sandbox) == "the target could not share its memory"
    working = queues.Queue()
    assert offer_probe(working, torch.device("cpu")) is None and take_probe(working) is None
