"""`dflash-doctor pipeline` end to end through the real CLI: learning, worker health and the findings for dead
and hung workers, the mitigation option, the multi-process path (gloo, shared memory), signals, bad input."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

from dflash_doctor import mitigations as registry  # noqa: E402
from tests.conftest import REPO, run_cli, run_cli_json  # noqa: E402

TINY = ("pipeline", "--preset", "tiny", "--device", "cpu")
ONE_EACH = ("--target-devices", "cpu", "--drafter-devices", "cpu")  # two ranks: enough, and each costs a torch import
STEP_LINE = re.compile(r" (drafter-\d) step=(\d+) loss=([0-9.]+) tok/s=(\d+)$")
WORKERS = [("target-0", "target"), ("drafter-0", "drafter"), ("drafter-1", "drafter")]
PLANTED_TORCH = (
    "import pathlib\n"
    "pathlib.Path(__file__).with_name('PLANTED_TORCH_RAN').write_text('a worker imported the working folder')\n"
    "raise ImportError('planted torch.py')\n"
)


@pytest.fixture(scope="module", params=[("threads", ("--workers", "threads")),
                                        ("processes", ("--mitigation", "processes"))], ids=lambda p: p[0])
def trained(request, tmp_path_factory):
    """A 30-step run started from a folder holding a planted torch.py that no worker may import."""
    mode, selection = request.param
    folder = tmp_path_factory.mktemp(f"cwd-{mode}")
    (folder / "torch.py").write_text(PLANTED_TORCH)
    proc, doc = run_cli_json(*TINY, *selection, "--steps", "30", timeout=110, cwd=folder)
    return mode, proc, doc, folder


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(130)
def test_tiny_run_learns_the_targets_greedy_tokens(trained):
    mode, proc, doc, _ = trained
    facts = doc["facts"]
    assert proc.returncode == 0 and doc["exit_code"] == 0 and doc["findings"] == [], proc.stderr[-2000:]
    assert facts["workers_mode"] == mode and facts["steps"] == 30 and len(facts["losses"]) == 30
    assert facts["loss_last"] < 0.5 * facts["loss_first"], facts["losses"]
    assert facts["tokens_per_s"] > 0 and facts["failed_worker"] is None
    assert [(w["name"], w["role"], w["outcome"], w["error"]) for w in facts["workers"]] == [
        (name, role, "ok", None) for name, role in WORKERS]
    assert [w["steps"] for w in facts["workers"] if w["role"] == "drafter"] == [30, 30]
    assert facts["transport"] == ("queue" if mode == "threads" else "gloo")
    assert set(facts["step_time_s"]) == {"p50", "p90", "p99", "max"}
    assert facts["corpus"]["sequences"] == 64 and facts["corpus"]["decode"] == "eager"
    assert facts["setup_s"] is not None and facts["setup_s"] < facts["warmup_s"]


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(130)
def test_no_worker_imports_a_torch_py_from_the_working_folder(trained):
    _, proc, _, folder = trained
    assert proc.returncode == 0
    assert not (folder / "PLANTED_TORCH_RAN").exists()


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(130)
def test_step_log_lines_carry_the_worker_name(trained):
    _, proc, _, _ = trained
    steps = {}
    for line in proc.stderr.splitlines():
        match = STEP_LINE.search(line)
        if match:
            steps.setdefault(match.group(1), []).append(int(match.group(2)))
    assert steps == {"drafter-0": list(range(1, 31)), "drafter-1": list(range(1, 31))}


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode, victim, topology", [
    ("threads", "drafter-1", ()),
    ("processes", "drafter-0", ONE_EACH),
])
def test_killing_one_worker_is_a_finding_that_names_it(mode, victim, topology):
    proc, doc = run_cli_json(*TINY, "--workers", mode, *topology, "--steps", "10", "--fail-worker", victim,
                             "--fail-at-step", "3", timeout=100)
    facts = doc["facts"]
    assert proc.returncode == 1 and doc["exit_code"] == 1  # documented: 1 = a worker died
    assert facts["failed_worker"] == victim and facts["ok"] is False
    by_name = {w["name"]: w for w in facts["workers"]}
    assert by_name[victim]["outcome"] == "killed" and by_name[victim]["steps"] == 2
    assert {w["outcome"] for name, w in by_name.items() if name != victim} == {"stopped"}
    [finding] = doc["findings"]
    assert (finding["code"], finding["name"]) == ("DFD802", "pipeline-worker-killed")
    assert finding["message"] == (f"{victim} (drafter on cpu) was killed: {victim} killed at step 3 by --fail-worker "
                                  "(testing the clean shutdown)")
    assert facts["steps"] < 10


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(60)
def test_an_error_in_a_worker_is_a_finding_with_its_traceback():
    proc, doc = run_cli_json(*TINY, "--steps", "6", "--fail-worker", "drafter-0", "--fail-at-step", "2",
                             "--fail-how", "raise", timeout=50)
    assert proc.returncode == 1
    [finding] = doc["findings"]
    assert finding["code"] == "DFD801"
    assert finding["message"] == ("drafter-0 (drafter on cpu) died in training: RuntimeError: drafter-0: error "
                                  "injected at step 2 by --fail-worker --fail-how raise")
    assert finding["evidence"]["worker"]["traceback"][-1].startswith("RuntimeError: drafter-0: error injected")
    assert finding["evidence"]["stopped"] == ["target-0", "drafter-1"]


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(120)
def test_a_hung_worker_process_is_diagnosed_from_its_faulthandler_stacks():
    proc, doc = run_cli_json(*TINY, "--workers", "processes", *ONE_EACH, "--steps", "8", "--fail-worker",
                             "drafter-0", "--fail-at-step", "3", "--fail-how", "hang", "--stall-timeout", "3",
                             timeout=100)
    facts = doc["facts"]
    assert proc.returncode == 1 and facts["failed_worker"] == "drafter-0"
    assert [(w["name"], w["outcome"]) for w in facts["workers"]] == [("target-0", "stopped"), ("drafter-0", "hung")]
    [finding] = doc["findings"]
    assert (finding["code"], finding["name"]) == ("DFD805", "pipeline-lock-deadlock")
    assert finding["evidence"]["cycle"] == "lock-cycle"
    assert finding["evidence"]["threads"][0] == "drafter-0"  # its helper is an unnamed thread of that rank
    assert finding["evidence"]["threads"][1].startswith("drafter-0/thread-")
    assert any(frame["function"] == "inject_hang" for stack in finding["evidence"]["stacks"]
               for frame in stack["frames"])


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(90)
@pytest.mark.parametrize("mitigation, setup_part", [
    ("threadlocal-flag,non-lazy-backward", None), ("warmup", "warm-up"), ("global-lock", None),
    ("first-call-lock", None), ("threadlocal-flag,single-thread-autograd", None), ("isolate-fx-patches", None),
])
def test_every_thread_mitigation_of_the_registry_applies_and_the_run_trains(mitigation, setup_part):
    proc, doc = run_cli_json(*TINY, "--steps", "6", "--mitigation", mitigation, timeout=80)
    facts = doc["facts"]
    assert proc.returncode == 0 and doc["findings"] == [], proc.stderr[-2000:]
    assert facts["mitigation"] == mitigation and facts["steps"] == 6
    if setup_part:
        assert setup_part in facts["setup"]
    if "threadlocal-flag" in mitigation:
        assert facts["mitigation_facts"]["threadlocal-flag"]["shim_check"]["ok"] is True
    if "non-lazy-backward" in mitigation:
        assert facts["mitigation_facts"]["non-lazy-backward"] == {"non_lazy_backward_was": False}
    if "isolate-fx-patches" in mitigation:
        assert facts["mitigation_facts"]["isolate-fx-patches"]["fx_patches_check"]["ok"] is True
    # single-threaded autograd is entered in every worker thread (read there), and nowhere without it
    per_thread = "single-thread-autograd" in mitigation
    assert {w["name"]: w["autograd_multithreading"] for w in facts["workers"]} == {
        w["name"]: not per_thread for w in facts["workers"]}
    # a compile setting a fix switches is read inside every worker thread: it reached them (per thread from 2.12)
    if "non-lazy-backward" in mitigation:
        assert {w["name"]: w["switches"] for w in facts["workers"]} == {
            w["name"]: {"torch._functorch.config.force_non_lazy_backward_lowering": "True"} for w in facts["workers"]}


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(200)
def test_a_tracing_thread_kills_a_worker_with_the_patcher_race_and_isolate_fx_patches_lets_it_train():
    proc, doc = run_cli_json(*TINY, "--steps", "6", "--tracing-thread", timeout=90)
    facts = doc["facts"]
    assert proc.returncode == 1 and facts["ok"] is False
    dead = [w for w in facts["workers"] if w["outcome"] == "error"]
    assert dead and all("module is not installed as a submodule" in w["error"] or "CURRENT_PATCHER" in w["error"]
                        for w in dead), dead
    assert {f["code"] for f in doc["findings"]} == {"DFD807"} and facts["failed_worker"] in {w["name"] for w in dead}
    proc, doc = run_cli_json(*TINY, "--steps", "6", "--tracing-thread", "--mitigation", "isolate-fx-patches",
                             timeout=90)
    facts = doc["facts"]
    assert proc.returncode == 0 and doc["findings"] == [] and facts["steps"] == 6, proc.stderr[-2000:]
    [tracer] = [w for w in facts["workers"] if w["role"] == "tracer"]
    assert tracer["outcome"] == "ok" and tracer["steps"] > 0  # it traced the whole run, next to the workers


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(150)
def test_two_targets_and_two_drafters_as_processes_share_one_corpus_over_shared_memory():
    proc, doc = run_cli_json(*TINY, "--workers", "processes", "--transport", "ipc", "--target-devices", "cpu,cpu",
                             "--drafter-devices", "cpu,cpu", "--steps", "12", timeout=140)
    facts = doc["facts"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert facts["transport"] == "shared-memory" and facts["steps"] == 12
    assert [(w["name"], w["outcome"], w["steps"]) for w in facts["workers"]] == [
        ("target-0", "ok", 12), ("target-1", "ok", 12), ("drafter-0", "ok", 12), ("drafter-1", "ok", 12)]
    assert facts["loss_last"] < facts["loss_first"]


def _start(*args, cwd=REPO):
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    return subprocess.Popen([sys.executable, "-m", "dflash_doctor", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_training(proc, workers: int, limit_s: float = 90.0) -> list:
    """Block until the first step line; return the worker processes' pids (none for threads)."""
    deadline = time.monotonic() + limit_s
    for line in proc.stderr:
        if STEP_LINE.search(line.rstrip("\n")):
            break
        assert time.monotonic() < deadline, "no training step in time"
    ranks = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
    assert len(ranks) in (0, workers)
    return [rank.pid for rank in ranks]


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode, sig, code", [
    ("processes", signal.SIGINT, 130), ("processes", signal.SIGTERM, 143), ("threads", signal.SIGINT, 130),
])
def test_a_stop_signal_stops_every_worker_quickly_and_writes_the_partial_report(tmp_path, mode, sig, code):
    report = tmp_path / "report.json"
    proc = _start(*TINY, "--workers", mode, "--steps", "100000", "--format", "json", "--output", report)
    try:
        ranks = _wait_for_training(proc, workers=3)
        sent = time.monotonic()
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, stderr[-2000:]
    assert took < 5.0
    assert not [pid for pid in ranks if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    name = signal.Signals(sig).name
    [line] = [line for line in stderr.splitlines() if line.startswith("dflash-doctor: interrupted")]
    assert line.startswith(f"dflash-doctor: interrupted ({name}): stopped 3 workers [target-0 (")
    import json

    doc = json.loads(report.read_text())
    assert doc["exit_code"] == code and doc["facts"]["interrupted"] == name and doc["findings"] == []
    assert {w["outcome"] for w in doc["facts"]["workers"]} == {"stopped"}
    assert {w["phase"] for w in doc["facts"]["workers"] if w["role"] == "drafter"} <= {
        "first step (compiling)", "training"}  # what each was doing when it was stopped


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, message", [
    (("--stall-timeout", "nan"), "--stall-timeout must be a finite number, got nan"),
    (("--stall-timeout", "0"), "--stall-timeout must be > 0, got 0"),
    (("--fail-worker", "drafter-1", "--fail-at-step", "0"),
     "--fail-at-step must be at least 1 (a worker's first step is 1), got 0"),
    (("--seed", "-5"), "--seed must be in 0..9223372036854775807, got -5"),
    (("--mitigation", "thread-local"), "unknown mitigation thread-local; choose from none, "
                                       + ", ".join(registry.NAMES) + " (combine with commas)"),
    (("--tracing-thread", "--workers", "processes"), "--tracing-thread runs beside thread workers (it is the race "
                                                     "between threads of one process); it cannot be combined with "
                                                     "--workers processes"),
    (("--mitigation", "processes", "--workers", "threads"), "--mitigation processes runs every worker in a process "
                                                             "of its own; it cannot be combined with --workers threads"),
])
def test_bad_options_are_one_usage_line(args, message):
    proc = run_cli(*TINY, *args, timeout=50)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [f"dflash-doctor: error: {message}"]


@pytest.mark.timeout(60)
def test_save_to_an_unwritable_folder_is_refused_before_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = run_cli(*TINY, "--save", blocker / "run", timeout=50)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"dflash-doctor: error: --save {blocker / 'run'}: cannot write there "
                                        "(Not a directory)"]


@pytest.mark.timeout(60)
def test_resume_without_a_checkpoint_is_one_usage_line(tmp_path):
    proc = run_cli(*TINY, "--save", tmp_path / "empty", "--resume", timeout=50)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dflash-doctor: error:")]
    assert errors == [f"dflash-doctor: error: --resume: no checkpoint in {tmp_path / 'empty'}"]
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(60)
def test_resume_from_a_checkpoint_without_its_step_is_one_usage_line(tmp_path):
    import torch

    saved = tmp_path / "ckpt" / "drafter.pt"
    saved.parent.mkdir()
    # What a save that lost its step would leave (another writer, a field renamed): the format and preset match.
    torch.save({"format": 1, "preset": "tiny", "drafter": {}, "optimizer": {}}, str(saved))
    proc = run_cli(*TINY, "--save", saved.parent, "--resume", timeout=50)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dflash-doctor: error:")]
    assert errors == [f"dflash-doctor: error: {saved} is not a whole drafter checkpoint: it has no step"]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(120)
def test_under_torchrun_every_rank_runs_and_the_first_drafter_reports_all(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200", PYTHONSAFEPATH="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(port), "-m", "dflash_doctor", *TINY, *ONE_EACH, "--workers", "processes", "--steps", "4",
                           "--format", "json"], capture_output=True, text=True, timeout=110, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    decoder, text, docs = json.JSONDecoder(), proc.stdout.strip(), []
    while text:
        doc, end = decoder.raw_decode(text)
        docs.append(doc)
        text = text[end:].strip()
    reporter = next(doc for doc in docs if len(doc["facts"]["workers"]) == 2)
    assert reporter["facts"]["steps"] == 4 and reporter["exit_code"] == 0
    assert [(w["name"], w["outcome"]) for w in reporter["facts"]["workers"]] == [("target-0", "ok"),
                                                                                 ("drafter-0", "ok")]
