"""The JSON facts of logs, gpus, status, run, attach, guards, scan, pipeline and check hold exactly the keys of
their typed models (logs/facts.py, gpus/facts.py, status/facts.py, supervise/facts.py, guards/facts.py,
scan/facts.py, reference/facts.py, check/facts.py): a key renamed or dropped on either side fails here, not in a
consumer's jq."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Type, get_type_hints

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


def _facts(*args: str, after: tuple = (), report: Optional[Path] = None) -> Dict[str, Any]:
    """The facts of `dflash-doctor ARGS -f json [-o REPORT] AFTER` (run and attach write their report to -o)."""
    output = ("-o", str(report)) if report is not None else ()
    done = subprocess.run([sys.executable, "-m", "dflash_doctor", *args, "-f", "json", *output, *after],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
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
    facts = _facts("run", after=("--", sys.executable, "-c", "import sys; sys.exit(0)"), report=tmp_path / "r.json")
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


@pytest.mark.timeout(120)
def test_check_facts_match_the_model(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import torch\nstep = torch.compile(lambda x: x)\n", encoding="utf-8")
    facts = _facts("check", str(tmp_path), "--no-probes", "--repro", "--timeout", "60")
    _check(facts, CheckFacts)
    assert facts["parts"] == ["scan", "guards", "repro"] and "partial" not in facts
    _check(facts["scan"], ScanFacts)
    _check(facts["guards"], GuardsFacts, all_keys=True)
