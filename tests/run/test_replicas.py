"""nn.DataParallel's replica threads under `run`: named as replicas (index and device), and a replica's failure
reported although parallel_apply catches it and the trainer catches the re-raise (real torch, real parallel_apply
threads; only the accelerator calls are CPU stand-ins inside the program, since this machine has none)."""
from __future__ import annotations

import json
import sys

import pytest

from tests.run.helpers import program


@pytest.mark.timeout(200)
def test_a_replicas_caught_failure_is_named_by_replica_and_located_at_its_line(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "-f", "json", "-o", out, "--", sys.executable, program("replica_step.py"), timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]  # the trainer caught it: its own exit code
    assert proc.stdout.strip() == "done"
    finding, = json.loads(out.read_text())["findings"]
    assert finding["code"] == "DFD906"
    assert finding["evidence"]["worker"].startswith("replica 1 on device ")
    assert finding["evidence"]["worker"].endswith("(_worker))")  # the thread's own name kept beside the role
    assert finding["message"].startswith("replica 1 on device ") and " failed at " in finding["message"]
    source = open(program("replica_step.py")).read().splitlines()
    assert 'batch["labels"]' in source[finding["line"] - 1]


@pytest.mark.timeout(200)
def test_replicas_of_a_compiled_module_are_one_finding_that_names_dataparallel_and_its_fixes(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "-f", "json", "-o", out, "--", sys.executable, program("replicated_compiled_step.py"),
               timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]  # the trainer caught every step's error: its own exit code
    assert proc.stdout.strip() == "done"
    finding, = json.loads(out.read_text())["findings"]
    assert finding["code"] == "DFD911"
    evidence = finding["evidence"]
    assert evidence["failures"] >= 3 and evidence["replicas"][0].startswith("replica 0 on device ")
    assert [step.split(":")[0] for step in evidence["next_steps"][:2]] == ["processes", "compile-outside-dataparallel"]
    assert finding["path"].endswith("replicated_compiled_step.py")


@pytest.mark.timeout(200)
def test_the_callers_death_by_the_reraise_is_the_same_finding_not_a_second_one(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "-f", "json", "-o", out, "--", sys.executable, program("replicated_compiled_step.py"),
               "--raise", timeout=180)
    assert proc.returncode == 1, proc.stderr[-2000:]  # the trainer's own exit code: it died of the re-raise
    finding, = json.loads(out.read_text())["findings"]
    assert finding["code"] == "DFD911" and finding["evidence"]["reraised_in"] == ["MainThread"]
