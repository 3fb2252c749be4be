"""Shared test plumbing: run the real CLI in a subprocess, bounded in time."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args, timeout: float = 120, cwd=None, env=None, input=None) -> subprocess.CompletedProcess:
    """`python -m dflash_doctor ARGS` exactly as a user runs it; never inherits a hang (timeout)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("COLUMNS", "200")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "dflash_doctor", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, cwd=cwd or REPO, env=full_env, input=input,
    )


def run_cli_json(*args, **kwargs):
    proc = run_cli(*args, "--format", "json", **kwargs)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:  # show what the CLI said instead of a bare decode error
        raise AssertionError(f"not JSON (rc={proc.returncode}): {proc.stdout[:2000]}\n{proc.stderr[:2000]}") from exc
    return proc, doc


@pytest.fixture
def cli():
    return run_cli
