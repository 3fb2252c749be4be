"""Plans from options, routing of batches between ranks, and the thread workers' shared machinery."""
from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from dflash_doctor.reference.pipeline import PipelineOptions, default_devices, make_plan, parse_devices  # noqa: E402
from dflash_doctor.reference.results import StepAggregator, StepRecord  # noqa: E402
from dflash_doctor.reference.workers_processes import backend_for, batches_per_target, routes  # noqa: E402
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
    (PipelineOptions(device="cuda"), "no CUDA device"),
    (PipelineOptions(hf_checkpoint="/"), "--target-checkpoint / is not a local Hugging Face checkpoint"),
])
def test_bad_options_are_one_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        make_plan(options, cuda_device_count=lambda: 0)


def test_plan_on_cpu_trains_through_sdpa_dense_and_counts_workers_from_device_lists():
    plan = make_plan(PipelineOptions(target_devices="cpu,cpu", drafter_devices="cpu"))
    assert plan.attention_path == "sdpa-dense"  # flex_attention has no CPU backward
    assert plan.target_names() == ["target-0", "target-1"] and plan.drafter_names() == ["drafter-0"]
    assert backend_for(plan) == "gloo"


@pytest.mark.parametrize("targets, drafters", [(1, 2), (5, 3), (3, 3), (2, 5)])
def test_routes_give_every_worker_a_partner_and_targets_send_exactly_what_drafters_take(targets, drafters):
    sources, consumers = routes(targets, drafters)
    assert all(sources) and all(consumers)
    for d, own in enumerate(sources):
        for t in own:
            assert d in consumers[t]
    assert sum(batches_per_target(targets, drafters, 7)) == 7 * drafters


def test_step_aggregator_waits_for_every_replica_and_measures_after_the_first_step():
    seen = []
    agg = StepAggregator(2, 3, lambda done, total, loss, rate: seen.append((done, total, loss, rate)),
                         first_step=5)
    agg.add(StepRecord(5, "drafter-0", 4.0, 100, 1.0, 10.0))
    assert seen == []
    agg.add(StepRecord(6, "drafter-1", 2.0, 100, 1.0, 11.0))  # early record for the next step: held
    agg.add(StepRecord(5, "drafter-1", 2.0, 100, 1.0, 10.5))
    agg.add(StepRecord(6, "drafter-0", 1.0, 100, 1.0, 12.5))
    assert seen == [(1, 3, 3.0, None), (2, 3, 1.5, 200 / 2.0)]


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


@pytest.mark.timeout(60)
def test_a_run_without_progress_is_declared_hung_and_returns():
    from dataclasses import replace

    import itertools

    # A clock that moves 10 s per reading: the first poll that finds no drafter step (building the models and the
    # corpus takes many 0.05 s polls) is already past the stall timeout, however fast this machine is.
    ticks = itertools.count(step=10.0)
    plan = replace(make_plan(PipelineOptions(steps=5)), stall_timeout_s=0.3, join_timeout_s=2.0, poll_s=0.05)
    result = run_threads(plan, clock=lambda: next(ticks))
    for thread in threading.enumerate():  # they are not deadlocked, only slow: they leave at the stop event
        if thread.name in ("target-0", "drafter-0", "drafter-1"):
            thread.join(timeout=40)
            assert not thread.is_alive()
    assert result.failed_worker in ("drafter-0", "drafter-1")
    hung = [w for w in result.workers if w.outcome == "hung"]
    assert result.failed_worker in [w.name for w in hung]
    assert all(w.error.startswith("no drafter step for 0 s") for w in hung if w.role == "drafter")


@pytest.mark.timeout(90)
def test_a_dead_target_worker_stops_the_drafters_in_process():
    result = run_threads(make_plan(PipelineOptions(steps=10, fail_worker="target-0", fail_at_step=2)))
    assert result.failed_worker == "target-0" and not result.ok
    assert [(w.name, w.outcome) for w in result.workers] == [
        ("target-0", "killed"), ("drafter-0", "stopped"), ("drafter-1", "stopped")]
    assert result.workers[0].steps == 1  # it handed over one batch, then died at its second


@pytest.mark.timeout(120)
def test_save_then_resume_continues_from_the_saved_drafter(tmp_path):
    from dflash_doctor.reference.pipeline import run_pipeline

    folder = str(tmp_path / "run")
    first = run_pipeline(PipelineOptions(steps=4, save_dir=folder))
    saved = tmp_path / "run" / "drafter.pt"
    assert first.ok and first.saved_to == str(saved)
    assert [p.name for p in saved.parent.iterdir()] == ["drafter.pt"]  # no temp file left behind
    assert torch.load(saved, weights_only=True)["step"] == 4

    resumed = run_pipeline(PipelineOptions(steps=2, save_dir=folder, resume=True))
    assert resumed.ok and resumed.start_step == 4 and resumed.steps == 2
    # A fresh drafter starts at ~8.3 on this task; a resumed one starts where the first run left off.
    assert resumed.losses[0] < 0.8 * first.losses[0]
    assert torch.load(saved, weights_only=True)["step"] == 6
