"""`status`: the seeds' log and snapshot joined into one diagnosis."""
from __future__ import annotations

import pytest

from dflash_doctor.gpus.roles import parse_roles
from dflash_doctor.gpus.sources import report_from_csv
from dflash_doctor.logs.options import LogOptions
from dflash_doctor.logs.source import scan_stream
from dflash_doctor.status.join import join_status
from tests.conftest import REPO, run_cli, run_cli_json

GPUS = REPO / "fixtures" / "gpus"
LOGS = REPO / "fixtures" / "logs"
ROLES = "target=0-4,drafter=5-7"


def joined(log_name, csv_name, roles=ROLES, thread_map=None):
    with open(LOGS / log_name, "rb") as handle:
        logs = scan_stream(handle, log_name, LogOptions())
    with open(GPUS / csv_name) as handle:
        gpus = report_from_csv(handle, csv_name, roles=parse_roles(roles))
    return join_status(logs, gpus, parse_roles(roles), thread_map)


def test_seed_dead_drafter_left_gpu_5_idle():
    report = joined("seed003_grep.log", "seed003_snapshot.csv")
    assert report.facts["workers"] == [{
        "thread": "drafter-0", "state": "dead", "gpu": 5, "role": "drafter",
        "cause": {"code": "DFD501", "exception": "RuntimeError", "line": 3, "signal": None, "root_cause": False,
                  "message": "Detected that you are using FX to symbolically trace a dynamo-optimized function. "
                             "This is not supported at the moment."},
        "last_step": None, "last_tok_s": None, "gpu_utilization": 0.0, "gpu_memory_used_mib": 46705.0,
        "gpu_findings": ["DFD401"],
    }]
    assert report.facts["unexplained_idle_gpus"] == []
    assert [g["findings"] for g in report.facts["gpus"]] == [
        ["DFD402"], [], [], ["DFD402"], ["DFD402"], ["DFD401"], [], []]
    steps = report.facts["next_steps"]
    assert steps[0].startswith("dflash-doctor guards") and steps[1].startswith("dflash-doctor repro --threads 3")


def test_map_override_moves_the_dead_thread_and_leaves_gpu_5_unexplained():
    report = joined("seed003_grep.log", "seed003_snapshot.csv", thread_map={"drafter-0": 6})
    worker = report.facts["workers"][0]
    assert (worker["gpu"], worker["gpu_utilization"], worker["gpu_findings"]) == (6, 85.0, [])
    assert report.facts["unexplained_idle_gpus"] == [5]


def test_full_run_states():
    report = joined("full_run.log", "seed003_snapshot.csv")
    states = {w["thread"]: (w["state"], w["gpu"]) for w in report.facts["workers"]}
    assert states == {"drafter-0": ("dead", 5), "drafter-1": ("progressing", 6), "drafter-2": ("stalled", 7),
                      "main": ("progressing", None)}
    assert any(step.startswith("py-spy dump") for step in report.facts["next_steps"])


@pytest.mark.timeout(60)
def test_cli_exact_findings_and_exit_code():
    proc, doc = run_cli_json("status", "--log", LOGS / "seed003_grep.log", "--from", GPUS / "seed003_snapshot.csv",
                             "--roles", ROLES)
    assert proc.returncode == 1
    assert sorted((f["code"], f["evidence"].get("gpu"), f["evidence"].get("thread")) for f in doc["findings"]) == [
        ("DFD401", 5, None), ("DFD402", 0, None), ("DFD402", 3, None), ("DFD402", 4, None),
        ("DFD501", None, "drafter-0")]
    assert doc["command"] == "status" and doc["facts"]["workers"][0]["gpu"] == 5


@pytest.mark.timeout(60)
def test_cli_text_screen_and_usage_errors():
    proc = run_cli("status", "--log", LOGS / "seed003_grep.log", "--from", "-", "--roles", ROLES,
                   "--map", "drafter-0=5", input=(GPUS / "seed003_snapshot.csv").read_text())
    assert proc.returncode == 1 and proc.stdout.splitlines()[0] == "Dead workers"
    bad = run_cli("status", "--log", "-", "--from", "-")
    assert bad.returncode == 2 and "both read stdin" in bad.stderr and bad.stderr.count("\n") == 1
    bad_map = run_cli("status", "--log", LOGS / "seed003_grep.log", "--from", GPUS / "seed003_snapshot.csv",
                      "--map", "drafter-0")
    assert bad_map.returncode == 2 and "--map" in bad_map.stderr


@pytest.mark.timeout(60)
def test_cli_without_snapshot_and_without_nvml_is_problem_plus_findings():
    proc, doc = run_cli_json("status", "--log", LOGS / "seed003_grep.log", "--samples", "1", "--interval", "0")
    if not any(p["subject"] == "nvml" for p in doc["problems"]):
        pytest.skip("this machine has GPUs")
    assert proc.returncode == 5
    assert [(f["code"], f["evidence"]["thread"]) for f in doc["findings"]] == [("DFD501", "drafter-0")]
    assert doc["facts"]["workers"][0]["gpu"] is None  # no --roles, no --map: unknown, not guessed


def test_a_killed_rank_is_joined_with_the_gpu_it_freed():
    report = joined("rank_killed.log", "rank_crashed.csv", roles=None)
    dead = [w for w in report.facts["workers"] if w["state"] == "dead"]
    assert [(w["thread"], w["gpu"], w["cause"]["code"], w["cause"]["signal"], w["last_step"], w["gpu_findings"])
            for w in dead] == [("rank2", 2, "DFD514", "SIGKILL", 57, ["DFD405"])]
    assert report.facts["unexplained_idle_gpus"] == []
    assert report.facts["next_steps"][0].startswith("dmesg")


@pytest.mark.timeout(60)
def test_status_text_ends_with_what_to_do_next():
    proc = run_cli("status", "--log", LOGS / "rank_killed.log", "--from", GPUS / "rank_crashed.csv")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert "Next" in lines and any(line.strip().startswith("• dmesg") for line in lines)


def test_the_status_command_holds_no_domain_logic():
    # commands/status.py parses options and calls the status domain; it must not borrow other commands' code
    # or restate the logs defaults.
    import ast

    source = (REPO / "dflash_doctor" / "commands" / "status.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m in ("dflash_doctor.commands.gpus", "dflash_doctor.commands.logs")}
    assert "log_options(" not in source and "0.3" not in source
