"""`dflash-doctor check` end to end, as CI runs it: the real scan, the real guards of the installed torch.

A risky project fails with a SARIF file that validates against the official schema and has a location on every
result, and a JUnit file with the expected failures; a clean project passes; --fail-on never passes; without
torch the scan still runs and the guards are one "could not check". Each CLI run is shared by the tests that
read it (module-scoped), because each costs a Python start and a read of torch's sources.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.render.sarif_schema import assert_valid_sarif

pytestmark = pytest.mark.timeout(240)

RISKY = '''import threading

import torch
import torch.utils.checkpoint as tuc

attn = torch.compile(lambda q, k: q @ k.T)


def chunk_loss(fn, x):
    return tuc.checkpoint(fn, x)


def worker(q, k):
    return attn(q, k)


threading.Thread(target=worker, args=(1, 2)).start()
'''
CLEAN = '''import torch
import torch.utils.checkpoint as tuc

attn = torch.compile(lambda q, k: q @ k.T)


def chunk_loss(fn, x):
    return tuc.checkpoint(fn, x, use_reentrant=False)


def step(q, k):
    return attn(q, k)
'''
# Runs the CLI in a child where `import torch` fails, as on a CI runner without torch.
NO_TORCH = (
    "import sys; sys.modules['torch'] = None; from dflash_doctor.cli import main; "
    "sys.argv[0] = 'dflash-doctor'; main()"
)


def _project(root: Path, source: str) -> Path:
    root.mkdir(parents=True)
    (root / "train.py").write_text(source)
    (root / "requirements.txt").write_text("torch==2.13.0\n")
    return root


@pytest.fixture(scope="module")
def risky(tmp_path_factory):
    return _project(tmp_path_factory.mktemp("check") / "risky", RISKY)


@pytest.fixture(scope="module")
def risky_sarif(risky):
    proc = run_cli("check", ".", "--no-probes", "--format", "sarif", "--output", "out.sarif", cwd=risky, timeout=200)
    return proc, json.loads((risky / "out.sarif").read_text())


@pytest.fixture(scope="module")
def risky_json(risky):
    """The default path, live probes included (the other runs skip them to save their child processes)."""
    proc = run_cli("check", ".", "--format", "json", "--fail-on", "never", cwd=risky, timeout=200)
    return proc, json.loads(proc.stdout)


def test_risky_project_fails_with_sarif_github_accepts(risky_sarif):
    proc, document = risky_sarif
    assert proc.returncode == 1, proc.stderr
    assert_valid_sarif(document)
    results = document["runs"][0]["results"]
    scan_results = {(r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
                     r["locations"][0]["physicalLocation"]["region"]["startLine"]) for r in results
                    if r["ruleId"] < "DFD400"}
    assert scan_results == {("DFD102", "train.py", 10), ("DFD201", "train.py", 17)}
    for result in results:
        if result["ruleId"] >= "DFD600":  # environment findings: placed on the manifest
            location = result["locations"][0]["physicalLocation"]
            assert location["artifactLocation"]["uri"] == "requirements.txt"
            assert result["properties"]["environmentFinding"] is True


def test_risky_project_json_with_fail_on_never(risky_json, risky_sarif):
    proc, envelope = risky_json
    assert proc.returncode == 0, proc.stderr
    assert envelope["command"] == "check" and envelope["exit_code"] == 0
    assert envelope["facts"]["parts"] == ["scan", "guards"]
    assert envelope["facts"]["environment_findings"] == "as reported"
    assert {"scan", "guards", "seconds"} <= set(envelope["facts"])
    scan_ids = sorted(r["ruleId"] for r in risky_sarif[1]["runs"][0]["results"] if r["ruleId"] < "DFD400")
    assert sorted(f["code"] for f in envelope["findings"] if f["code"] < "DFD400") == scan_ids == ["DFD102", "DFD201"]


def test_risky_project_junit_lists_each_finding_as_a_failure(risky, risky_sarif):
    proc = run_cli("check", ".", "--no-probes", "--format", "junit", "-o", "out.xml", cwd=risky, timeout=200)
    assert proc.returncode == 1, proc.stderr
    root = ET.parse(risky / "out.xml").getroot()
    results = risky_sarif[1]["runs"][0]["results"]
    at_or_above_warning = [r for r in results if r["level"] in ("error", "warning")]
    assert root.get("tests") == str(len(results)) and root.get("errors") == "0"
    assert root.get("failures") == str(len(at_or_above_warning))
    scan = next(s for s in root.findall("testsuite") if s.get("name") == "dflash-doctor check: scan")
    assert [(c.get("file"), c.get("line"), c.find("failure").get("message").split()[0])
            for c in scan.findall("testcase")] == [("train.py", "10", "DFD102"), ("train.py", "17", "DFD201")]


def test_clean_project_passes_and_environment_findings_become_info(tmp_path):
    project = _project(tmp_path / "clean", CLEAN)
    proc = run_cli("check", "--no-probes", "--format", "json", cwd=project, timeout=200)
    assert proc.returncode == 0, proc.stderr
    envelope = json.loads(proc.stdout)
    assert [f for f in envelope["findings"] if f["code"] < "DFD400"] == []
    assert {f["severity"] for f in envelope["findings"]} <= {"info"}
    assert envelope["facts"]["environment_findings"] == "downgraded to info (no DFD201)"


def test_without_torch_the_scan_still_runs_and_guards_are_a_problem(risky):
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH, "check", ".", "--format", "json"],
        capture_output=True, text=True, timeout=120, cwd=risky,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )
    envelope = json.loads(proc.stdout)
    assert proc.returncode == 5, proc.stderr
    assert sorted(f["code"] for f in envelope["findings"]) == ["DFD102", "DFD201"]
    assert [p["subject"] for p in envelope["problems"]] == ["guards"]
    assert "torch" in envelope["problems"][0]["reason"]
    assert envelope["facts"]["parts"] == ["scan"]
    assert "Traceback" not in proc.stderr


def test_a_missing_path_is_a_usage_error(tmp_path):
    proc = run_cli("check", str(tmp_path / "nope"), "--no-probes", timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
