"""The JSON facts of logs, gpus, status, run, attach, guards, scan, pipeline, check and repro hold exactly the keys
of their typed models (logs/facts.py, gpus/facts.py, status/facts.py, supervise/facts.py, guards/facts.py,
scan/facts.py, reference/facts.py, check/facts.py, repro/facts.py): a key renamed or dropped on either side fails
here, not in a consumer's jq."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Set, Type, get_type_hints

import pytest

from dflash_doctor.check.facts import CheckFacts
from dflash_doctor.gpus.facts import GpuFacts, GpusFacts, ProcessFacts
from dflash_doctor.guards.facts import GuardsFacts, ReleaseFacts
from dflash_doctor.scan.facts import ScanFacts, SkippedFolderFacts
from dflash_doctor.logs.facts import DeathFacts, LogsFacts, RootCauseFacts, ThreadFacts
from dflash_doctor.reference.facts import (
    HangFacts,
    PipelineFacts,
    PipelineWorkerFacts,
    StepTimeFacts,
    ThreadStackFacts,
    WrittenCorpusFacts,
)
from dflash_doctor.runtime.recorder import Blame, BlameFacts
from dflash_doctor.runtime.stacks import Frame, FrameFacts
from dflash_doctor.repro import facts as repro
from dflash_doctor.status.facts import CauseFacts, GpuStatusFacts, StatusFacts, WorkerFacts
from dflash_doctor.supervise.facts import (
    AttachFacts,
    AttachProcessFacts,
    RateFacts,
    RunFacts,
    RunProcessFacts,
    TrialFacts,
)

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "fixtures" / "logs"
GPUS = REPO / "fixtures" / "gpus"


def _facts(*args: str, after: tuple = (), report: Optional[Path] = None,
           env: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """The facts of `dflash-doctor ARGS -f json [-o REPORT] AFTER` (run and attach write their report to -o)."""
    output = ("-o", str(report)) if report is not None else ()
    done = subprocess.run([sys.executable, "-m", "dflash_doctor", *args, "-f", "json", *output, *after],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, **env} if env is not None else None)
    text = report.read_text() if report is not None else done.stdout
    return json.loads(text)["facts"]


def _check(value: Mapping[str, Any], model: Type[Any], *, all_keys: bool = False) -> None:
    """Every key of `value` is in `model`; every required key of `model` is in `value` (every key, with
    `all_keys`: a run that fills all of them)."""
    declared = set(get_type_hints(model))
    assert set(value) <= declared, f"{model.__name__}: keys not in the model: {set(value) - declared}"
    needed = declared if all_keys else set(model.__required_keys__)
    assert needed <= set(value), f"{model.__name__}: keys missing from the JSON: {needed - set(value)}"


def test_logs_facts_match_the_model() -> None:
    facts = _facts("logs", str(LOGS / "rank_killed.log"))
    _check(facts, LogsFacts)
    assert {"root_cause", "untracked_threads", "progress_sampled", "repeats", "suppressed", "next_steps",
            "compression"} <= set(facts)
    assert facts["threads"]
    for thread in facts["threads"].values():
        _check(thread, ThreadFacts, all_keys=True)
        if thread["died"]:
            _check(thread["died"], DeathFacts, all_keys=True)
    root = _facts("logs", str(LOGS / "torchrun_summary.log"))["root_cause"]
    _check(root, RootCauseFacts, all_keys=True)


def test_unreadable_log_facts_match_the_model() -> None:
    _check(_facts("logs", "/dev/null"), LogsFacts)  # a device is a problem, not a scan: the base keys only


@pytest.mark.parametrize("snapshot", ["seed003_snapshot.csv", "h100_header_with_total.csv"])
def test_gpus_facts_match_the_model(snapshot: str) -> None:
    facts = _facts("gpus", "--from", str(GPUS / snapshot), "--roles", "target=0-4,drafter=5-7")
    _check(facts, GpusFacts)
    assert {"path", "roles", "role_busy_level", "thresholds", "skipped_checks", "columns", "header", "rows",
            "next_steps"} <= set(facts)
    for gpu in facts["gpus"]:
        _check(gpu, GpuFacts, all_keys=True)
        for process in gpu["processes"]:
            _check(process, ProcessFacts, all_keys=True)


def test_status_facts_match_the_model() -> None:
    facts = _facts("status", "--log", str(LOGS / "seed003_grep.log"), "--from", str(GPUS / "seed003_snapshot.csv"),
                   "--roles", "target=0-4,drafter=5-7")
    _check(facts, StatusFacts, all_keys=True)
    assert any(w["cause"] for w in facts["workers"])
    for worker in facts["workers"]:
        _check(worker, WorkerFacts, all_keys=True)
        if worker["cause"]:
            _check(worker["cause"], CauseFacts, all_keys=True)
    for gpu in facts["gpus"]:
        _check(gpu, GpuStatusFacts, all_keys=True)


@pytest.mark.timeout(120)
def test_run_facts_match_the_model(tmp_path: Path) -> None:
    # a process that starts a thread is watched (and recorded); one that starts none and imports no torch is not
    threaded = "import threading; t = threading.Thread(target=print); t.start(); t.join()"
    facts = _facts("run", after=("--", sys.executable, "-c", threaded), report=tmp_path / "r.json")
    _check(facts, RunFacts, all_keys=True)
    _check(facts["rate"], RateFacts, all_keys=True)
    trial, = facts["trials"]
    _check(trial, TrialFacts, all_keys=True)
    process, = trial["processes"]
    _check(process, RunProcessFacts, all_keys=True)


@pytest.mark.timeout(120)
def test_attach_facts_match_the_model(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        facts = _facts("attach", str(sleeper.pid), "--samples", "2", "--interval", "0.2", report=tmp_path / "a.json")
    finally:
        sleeper.kill()
        sleeper.wait(10)
    _check(facts, AttachFacts, all_keys=True)
    process, = facts["processes"]
    _check(process, AttachProcessFacts, all_keys=True)


@pytest.mark.parametrize("release", ["torch-2.13", "torch-2.14"])
def test_guards_facts_match_the_model(release: str) -> None:
    facts = _facts("guards", "--torch-root", str(REPO / "fixtures" / "guards" / release), "--no-probes")
    _check(facts, GuardsFacts, all_keys=True)
    _check(facts["release"], ReleaseFacts, all_keys=True)


def test_scan_facts_match_the_model(tmp_path: Path) -> None:
    (tmp_path / "node_modules").mkdir()  # a folder scan skips, so skipped_folders has an entry to check
    (tmp_path / "train.py").write_text("import torch\nstep = torch.compile(lambda x: x)\n", encoding="utf-8")
    facts = _facts("scan", str(tmp_path))
    _check(facts, ScanFacts)
    assert "statistics" not in facts
    skipped, = facts["skipped_folders"]
    _check(skipped, SkippedFolderFacts, all_keys=True)
    counted = _facts("scan", str(tmp_path), "--statistics")
    _check(counted, ScanFacts, all_keys=True)  # --statistics adds the one optional key


def _check_workers(facts: Mapping[str, Any]) -> None:
    for worker in facts["workers"]:
        _check(worker, PipelineWorkerFacts, all_keys=True)


@pytest.mark.timeout(120)
def test_pipeline_facts_match_the_model() -> None:
    facts = _facts("pipeline", "--preset", "tiny", "--device", "cpu", "--steps", "2")
    _check(facts, PipelineFacts, all_keys=True)
    _check_workers(facts)
    _check(facts["step_time_s"], StepTimeFacts, all_keys=True)
    _check(facts["corpus"], WrittenCorpusFacts, all_keys=True)


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(120)
def test_hung_pipeline_facts_match_the_model() -> None:
    """A worker deadlocked by --fail-how hang: the stall's diagnosis and every thread's stack fill hang and
    stacks (the flight recorder's blame needs a real FX race: the next test holds its entries to the model)."""
    facts = _facts("pipeline", "--preset", "tiny", "--device", "cpu", "--steps", "3", "--fail-worker", "drafter-0",
                   "--fail-how", "hang", "--stall-timeout", "2")
    _check(facts, PipelineFacts, all_keys=True)
    _check_workers(facts)
    assert facts["failed_worker"] == "drafter-0"
    _check(facts["hang"], HangFacts, all_keys=True)
    assert facts["stacks"]
    for stack in facts["stacks"]:
        _check(stack, ThreadStackFacts, all_keys=True)
        for frame in stack["frames"]:
            _check(frame, FrameFacts, all_keys=True)


def test_blame_entries_match_the_model() -> None:
    """`blame` entries are the flight recorder's Blame.to_dict(), as a run that raised the FX error fills them; one
    costs a real race, so the entry is built here and put through JSON as the report would."""
    from dflash_doctor.outcomes import BlameKind

    frame = Frame("train.py", 3, "step", "loss = model(x)", ((2, "lock"),))
    blame = json.loads(json.dumps(Blame("drafter-0", "drafter-1", 1.5, BlameKind.FX_FLAG_LEAK, "RuntimeError: ...",
                                        (frame,)).to_dict()))
    _check(blame, BlameFacts, all_keys=True)
    _check(blame["holder_stack"][0], FrameFacts, all_keys=True)


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(120)
def test_check_facts_match_the_model(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import torch\nstep = torch.compile(lambda x: x)\n", encoding="utf-8")
    facts = _facts("check", str(tmp_path), "--no-probes", "--repro", "--timeout", "60")
    _check(facts, CheckFacts)
    assert facts["parts"] == ["scan", "guards", "repro"] and "partial" not in facts
    _check(facts["scan"], ScanFacts)
    _check(facts["guards"], GuardsFacts, all_keys=True)
# -- repro ---------------------------------------------------------------------------------------------------
Check = Callable[..., None]


def _check_phase(phase: Mapping[str, Any], check: Check) -> None:
    check(phase, repro.PhaseFacts)
    for thread in phase["threads"]:
        check(thread, repro.ThreadFacts)
    for event in phase["events"]:
        check(event, repro.EventFacts, all_keys=True)
    if "hang" in phase:
        check(phase["hang"], repro.HangFacts, all_keys=True)
    for stack in phase.get("stacks", []):
        check(stack, repro.StackFacts, all_keys=True)
        for frame in stack["frames"]:
            check(frame, repro.FrameFacts, all_keys=True)
    for key, model in (("shim", repro.ShimStatusFacts), ("shim_check", repro.SelfCheckFacts),
                       ("fx_patches", repro.PatchIsolationFacts), ("fx_patches_check", repro.SelfCheckFacts),
                       ("tracing_thread", repro.TracingThreadFacts)):
        if key in phase:
            check(phase[key], model, all_keys=True)
    for process in phase.get("processes", []):
        check(process, repro.ProcessFacts, all_keys=True)
        for event in process["events"]:
            check(event, repro.EventFacts, all_keys=True)


def _check_levels(levels: Mapping[str, Any], check: Check) -> None:
    for level in levels.values():
        check(level, repro.LevelFacts)


def _check_repro(facts: Mapping[str, Any], check: Check = _check) -> None:
    """Every part of a repro facts document against its model."""
    check(facts, repro.ReproFacts)
    check(facts["capabilities"], repro.CapabilitiesFacts, all_keys=True)
    for phase in (facts["single_thread"], facts["multi_thread"]):
        if phase is not None:
            _check_phase(phase, check)
    for blame in facts["blame"]:
        check(blame, repro.BlameFacts, all_keys=True)
        for frame in blame["holder_stack"]:
            check(frame, repro.FrameFacts, all_keys=True)
    _check_levels(facts.get("levels", {}), check)
    _check_levels(facts.get("baseline_levels", {}), check)
    for trial in facts.get("trials", []):
        check(trial, repro.TrialFacts)
    if facts.get("hang"):
        check(facts["hang"], repro.HangFacts, all_keys=True)
    if "shim" in facts:
        check(facts["shim"], repro.ShimFacts, all_keys=True)
        check(facts["shim"]["self_check"], repro.SelfCheckFacts, all_keys=True)
    for row in facts.get("matrix", []):
        check(row, repro.MatrixRowFacts)
        _check_levels(row["stresses"], check)
    if "partial" in facts:
        check(facts["partial"], repro.PartialFacts, all_keys=True)
    if "cpu" in facts:
        check(facts["cpu"], repro.CpuFacts, all_keys=True)
    if "warm_start" in facts:
        check(facts["warm_start"], repro.WarmStartFacts, all_keys=True)
    for entry in facts.get("baseline_reproduced", []):
        check(entry, repro.ReproducedFacts, all_keys=True)


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(120)
def test_a_real_forced_repro_matches_the_model(tmp_path: Path) -> None:
    facts = _facts("repro", "--mode", "forced", "--device", "cpu", "--expect", "reproduced", "-q",
                   env={"DFLASH_DOCTOR_CACHE": str(tmp_path)})  # its last-repro.json stays out of the user's cache
    _check_repro(facts)
    assert facts["verdict"] == "reproduced" and facts["blame"], "the FX-flag leak and who held the flag"
    assert {"levels", "trials", "next_steps", "made", "expect", "cpu", "warm_start"} <= set(facts)
    assert facts["cpu"]["children_s"] > 0  # the real children's counts
    assert facts["warm_start"]["forked"] >= 1 or not sys.platform.startswith("linux")  # forks on Linux only
    multi = facts["multi_thread"]
    assert {"run_s", "setup_s", "disturbance"} <= set(multi)
    for thread in multi["threads"]:
        _check(thread, repro.ThreadFacts, all_keys=True)  # a real worker records its autograd switch


# Child results as a phase child writes them: its typed record (repro/phase_record.py), built with the producers'
# own types (the real ones are the runtime's), so a field renamed there fails here as it would in the JSON.
def _frames() -> list:
    from dflash_doctor.runtime.stacks import Frame

    return [Frame("train.py", 3, "step", "loss.backward()", ((2, "torch.no_grad()"),))]


def _child_result(spec: Dict[str, Any], outcome: str = "ok", error: Optional[str] = None, **keys: Any) -> Any:
    from dflash_doctor.outcomes import ThreadOutcome
    from dflash_doctor.repro.phase_record import PhaseRecord, ThreadRecord
    from dflash_doctor.runtime.recorder import Event

    names = spec["thread_names"]
    threads = tuple(ThreadRecord(n, ThreadOutcome(outcome), error, 0 if error else spec["steps"], 0.5,
                                 autograd_multithreading=True, switches={}, lazy_backward_compiles=0) for n in names)
    fields: Dict[str, Any] = dict(phase=spec["phase"], outcome=ThreadOutcome(outcome), seconds=1.0, threads=threads,
                                  torch_version="2.13.0+cpu", python="3.11.7", pid=7, setup_s=0.1, run_s=0.5,
                                  events=tuple(Event(0.1, n, i, "step", "I") for i, n in enumerate(names)))
    fields.update(keys)
    return PhaseRecord(**fields)


def _leak(spec: Dict[str, Any]) -> Any:
    from dflash_doctor.outcomes import BlameKind
    from dflash_doctor.runtime.recorder import Blame

    error = "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function."
    blame = tuple(Blame(n, "fx-holder", 0.2, BlameKind.FX_FLAG_LEAK, error, tuple(_frames()))
                  for n in spec["thread_names"])
    return _child_result(spec, "error", error, blame=blame, disturbance="fx-holder holds the FX flag")


def _deadlock(spec: Dict[str, Any]) -> Any:
    from dflash_doctor.outcomes import FailureKind, HangCycle
    from dflash_doctor.runtime.deadlock import HangDiagnosis
    from dflash_doctor.runtime.stacks import ThreadStack

    hang = HangDiagnosis(FailureKind.DEADLOCK, HangCycle.COMPILE_LOCK_AUTOGRAD, ("a waits", "b waits"), ("a", "b"),
                         60.0)
    stacks = tuple(ThreadStack(n, i, tuple(_frames())) for i, n in enumerate(spec["thread_names"]))
    return _child_result(spec, "hung", hang=hang, stacks=stacks)


def _with_mitigations(spec: Dict[str, Any], result: Any) -> Any:
    """What each mitigation's set-up adds to the result (mitigations.py), and a foreign trace's thread."""
    from dataclasses import replace

    from dflash_doctor.outcomes import ThreadOutcome
    from dflash_doctor.repro.phase_record import SelfCheck, TracingThreadRecord
    from dflash_doctor.runtime.fx_flag import ShimStatus
    from dflash_doctor.runtime.fx_patches import PatchIsolation

    check = SelfCheck(True, "a second thread's trace left this thread's flag alone")
    setup = result.setup
    if "threadlocal-flag" in spec["mitigation"]:
        setup = replace(setup, shim=ShimStatus("installed", "patched", ("torch.fx._symbolic_trace.is_fx_tracing",)),
                        shim_check=check)
    if "isolate-fx-patches" in spec["mitigation"]:
        setup = replace(setup, fx_patches=PatchIsolation("installed", "isolated", ("_Patcher",)),
                        fx_patches_check=check)
    result = replace(result, setup=setup)
    if "warmup" in spec["mitigation"]:
        result = replace(result, warmup_s=(0.5,))
    if spec["mode"] == "foreign-trace" and spec["phase"] == "multi":
        result = replace(result, tracing_thread=TracingThreadRecord("fx-profiler", ThreadOutcome.OK, None, 4))
    return result


def _races(spec: Dict[str, Any]) -> Any:
    """No mitigation deadlocks naturally and leaks the flag under the other stresses; the fixes hold."""
    if spec["phase"] != "multi" or spec["threads"] == 1:
        return _child_result(spec)
    if spec["mitigation"]:
        return _with_mitigations(spec, _child_result(spec))
    return _deadlock(spec) if spec["mode"] in ("natural", "amplified") else _leak(spec)


class _Runner:
    """tests/repro/test_harness.py's FakeRunner, with a signal at the `stop_at`-th child and a child that dies
    without a result (`crash`)."""

    def __init__(self, behaviour: Callable[[Dict[str, Any]], Any], stop_at: int = 0,
                 crash: bool = False) -> None:
        from tests.repro.test_harness import FakeRunner

        self.fake, self.stop_at, self.crash, self.started = FakeRunner(behaviour), stop_at, crash, 0

    def warm_start_facts(self) -> dict:  # what warm_start.WarmStartRunner says of its children: all started fresh
        return {"forked": 0, "fresh": self.started, "unavailable": "a fake runner forks nothing"}

    def start(self, spec_path: Path, result_path: Path, env: dict, log_path: Path, user_code: bool = False) -> Any:
        from dflash_doctor.repro.runner import ChildExit

        self.started += 1
        if self.started == self.stop_at:
            raise KeyboardInterrupt  # Ctrl-C while the run starts its next child
        child = self.fake.start(spec_path, result_path, env, log_path, user_code)
        if self.crash and json.loads(Path(spec_path).read_text())["phase"] == "multi":
            log_path.write_text("Fatal Python error: Segmentation fault\n")
            child.poll = lambda timeout_s: ChildExit(-11, False, 1.0)  # killed, no result.json
        return child


def _fake_repro(tmp_path: Path, matrix: bool = False, stop_at: int = 0, crash: bool = False,
                behaviour: Callable[[Dict[str, Any]], Any] = _races, **spec: Any) -> Dict[str, Any]:
    from dflash_doctor.hazards import Stress
    from dflash_doctor.repro.capabilities import Capabilities
    from dflash_doctor.repro.harness import run_repro
    from dflash_doctor.repro.spec import ReproSpec

    caps = Capabilities(skipped={Stress.STUCK: "the FX flag is thread-local in torch 2.14"},
                        cannot_show=("a note",), flag_storage="module-global", masked_during_compile=False,
                        torch_version="2.13.0")
    report = run_repro(ReproSpec(**spec), matrix=matrix, runner=_Runner(behaviour, stop_at, crash),
                       workdir=tmp_path, capabilities=caps, poll_s=0.001)
    return json.loads(json.dumps(report.facts, default=str))  # as the JSON envelope has them


def _control_fails(spec: Dict[str, Any]) -> Any:
    return _child_result(spec, "error", "NotImplementedError: no CPU backward")


# Each run fills some of the optional keys; together they fill every key of every model.
FAKE_RUNS: Dict[str, Dict[str, Any]] = {
    "matrix": {"matrix": True, "trials": 2},
    "deadlock": {"mode": "natural", "trials": 2},
    "leak": {"mode": "forced"},
    "shim": {"mode": "forced", "mitigation": ("threadlocal-flag",)},
    "warm-up": {"mitigation": ("warmup",), "trials": 2},
    "processes": {"mode": "forced", "mitigation": ("processes",), "threads": 2},
    "foreign-trace": {"mode": "foreign-trace", "mitigation": ("isolate-fx-patches",)},
    "control-fails": {"jobs": 1, "behaviour": _control_fails},
    "crash": {"mode": "forced", "crash": True},
    "stopped-matrix": {"matrix": True, "trials": 2, "stop_at": 8},
}


def test_fake_repro_runs_match_the_model_and_fill_every_key_of_it(tmp_path: Path) -> None:
    seen: Dict[Type[Any], Set[str]] = defaultdict(set)

    def check(value: Mapping[str, Any], model: Type[Any], *, all_keys: bool = False) -> None:
        _check(value, model, all_keys=all_keys)
        seen[model] |= set(value)

    runs = {name: _fake_repro(tmp_path, **options) for name, options in FAKE_RUNS.items()}
    for facts in runs.values():
        _check_repro(facts, check)
    cli_only = {"made", "expect"}  # the command's, not the harness's: the real run above has them
    for model, keys in seen.items():
        declared = set(get_type_hints(model)) - (cli_only if model is repro.ReproFacts else set())
        assert keys == declared, f"{model.__name__}: keys no run filled: {declared - keys}"
    models = {name for name in dir(repro) if name.endswith("Facts") and not name.startswith("_")}
    merged = {"HeadlineFacts", "SettingsFacts"}  # parts the harness merges into ReproFacts, never alone in the JSON
    assert models - merged <= {model.__name__ for model in seen}, "a model no run's facts were checked against"
    failed = runs["control-fails"]
    assert failed["multi_thread"] is None and not {"levels", "trials", "next_steps"} & set(failed)
    stopped = runs["stopped-matrix"]
    assert stopped["partial"]["stopped_by"] == "SIGINT" and "next_steps" not in stopped
    assert any(row["finished"] for row in stopped["matrix"])
    assert "log_tail" in runs["crash"]["multi_thread"]
    assert "autograd_multithreading" not in runs["crash"]["multi_thread"]["threads"][0]  # the parent made it up


def test_the_view_tests_example_facts_match_the_model() -> None:
    from tests.repro.example_facts import phase, repro_facts, thread

    _check_repro(repro_facts(single_thread=phase("ok", [thread("drafter-0")]),
                             multi_thread=phase("error", [thread("drafter-1", "error", "boom")])))
