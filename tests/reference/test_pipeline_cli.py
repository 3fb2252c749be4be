"""`dflash-doctor pipeline` end to end through the real CLI: learning, worker health, clean shutdown, resume."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("torch")

from tests.conftest import run_cli, run_cli_json  # noqa: E402

TINY = ("pipeline", "--preset", "tiny", "--device", "cpu")
STEP_LINE = re.compile(r" (drafter-\d) step=(\d+) loss=([0-9.]+) tok/s=(\d+)$")
WORKERS = [("target-0", "target"), ("drafter-0", "drafter"), ("drafter-1", "drafter")]


@pytest.fixture(scope="module", params=["threads", "processes"])
def trained(request):
    proc, doc = run_cli_json(*TINY, "--workers", request.param, "--steps", "30", timeout=90)
    return request.param, proc, doc


@pytest.mark.timeout(120)
def test_tiny_run_learns_the_targets_greedy_tokens(trained):
    mode, proc, doc = trained
    facts = doc["facts"]
    assert proc.returncode == 0 and doc["exit_code"] == 0, proc.stderr[-2000:]
    assert facts["workers_mode"] == mode and facts["steps"] == 30 and len(facts["losses"]) == 30
    assert facts["loss_last"] < 0.5 * facts["loss_first"], facts["losses"]
    assert facts["tokens_per_s"] > 0 and facts["failed_worker"] is None
    assert [(w["name"], w["role"], w["outcome"], w["error"]) for w in facts["workers"]] == [
        (name, role, "ok", None) for name, role in WORKERS]
    assert [w["steps"] for w in facts["workers"] if w["role"] == "drafter"] == [30, 30]
    assert facts["transport"] == ("queue" if mode == "threads" else "gloo")


@pytest.mark.timeout(120)
def test_step_log_lines_carry_the_worker_name(trained):
    _, proc, _ = trained
    steps = {}
    for line in proc.stderr.splitlines():
        match = STEP_LINE.search(line)
        if match:
            steps.setdefault(match.group(1), []).append(int(match.group(2)))
    assert steps == {"drafter-0": list(range(1, 31)), "drafter-1": list(range(1, 31))}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode, victim, topology", [
    ("threads", "drafter-1", ()),
    # Two ranks are enough to see a rank SIGKILLed and its peer ended; each rank costs a torch import.
    ("processes", "drafter-0", ("--target-devices", "cpu", "--drafter-devices", "cpu")),
])
def test_killing_one_worker_ends_the_run_with_that_worker_named(mode, victim, topology):
    proc, doc = run_cli_json(*TINY, "--workers", mode, *topology, "--steps", "10", "--fail-worker", victim,
                             "--fail-at-step", "3", timeout=100)
    facts = doc["facts"]
    assert proc.returncode == 1 and doc["exit_code"] == 1  # documented: 1 = a worker died
    assert facts["failed_worker"] == victim and facts["ok"] is False
    by_name = {w["name"]: w for w in facts["workers"]}
    assert by_name[victim]["outcome"] == "killed"
    assert by_name[victim]["error"] == f"{victim} killed at step 3 by --fail-worker (testing the clean shutdown)"
    assert {w["outcome"] for name, w in by_name.items() if name != victim} == {"stopped"}
    assert facts["steps"] < 10


@pytest.mark.timeout(60)
def test_resume_without_a_checkpoint_is_one_usage_line(tmp_path):
    proc = run_cli(*TINY, "--save", tmp_path / "empty", "--resume", timeout=50)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dflash-doctor: error:")]
    assert errors == [f"dflash-doctor: error: --resume: no checkpoint in {tmp_path / 'empty'}"]
    assert "Traceback" not in proc.stderr
