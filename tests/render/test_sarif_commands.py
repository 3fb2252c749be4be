"""Every command that reports findings writes SARIF that validates against the official schema and that GitHub
would accept (a location on every result, repo-relative URIs), run through the real CLI on the repo's fixtures.
`repro` is covered in-process by test_sarif.py (one finding of every registered rule): a real repro takes
minutes on this machine, and its findings carry no path, like the gpus/logs ones placed here."""
from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.render.sarif_schema import assert_valid_sarif

COMMANDS = {
    "scan": (["scan", "fixtures/scan"], "DFD1"),
    "gpus": (["gpus", "--from", "fixtures/gpus/seed003_snapshot.csv", "--roles", "target=0-4,drafter=5-7"], "DFD4"),
    "logs": (["logs", "fixtures/logs/full_run.log"], "DFD5"),
    "status": (["status", "--log", "fixtures/logs/seed003_grep.log", "--from", "fixtures/gpus/seed003_snapshot.csv",
                "--roles", "target=0-4,drafter=5-7"], "DFD4"),
    "guards": (["guards", "--no-probes", "--torch-root", "fixtures/guards/torch-2.13"], "DFD6"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_command_sarif_validates_and_locates_every_result(command):
    args, code_prefix = COMMANDS[command]
    proc = run_cli(*args, "--format", "sarif", timeout=100)
    assert proc.returncode in (1, 5), proc.stderr
    document = json.loads(proc.stdout)
    assert_valid_sarif(document)
    run = document["runs"][0]
    assert run["properties"]["command"] == command
    results = run["results"]
    assert any(r["ruleId"].startswith(code_prefix) for r in results), [r["ruleId"] for r in results]
    for result in results:
        uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        assert uri.startswith("fixtures/") or result["properties"].get("environmentFinding") is True, uri
