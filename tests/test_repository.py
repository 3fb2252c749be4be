"""The repository holds source, tests, fixtures, docs and benchmark scripts with their summaries: no binary, no empty
file, no raw stream of a device call (those stay in the history: benchmarks/gpu/results/README.md)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Raw streams and packed binaries: a fixture log is a stand-in written for a test, anything else is a dump.
DUMP_SUFFIXES = (".stdout", ".stderr", ".log", ".whl", ".gz", ".zip", ".tar", ".so", ".pyc", ".pt", ".bin")


def _tracked() -> list:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing says which files are tracked")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=30)
    return [REPO / name for name in listed.stdout.decode().split("\0") if name]


def test_no_raw_dump_or_packed_binary_is_tracked_outside_the_fixtures():
    dumps = [p.relative_to(REPO).as_posix() for p in _tracked()
             if p.suffix in DUMP_SUFFIXES and p.relative_to(REPO).parts[0] != "fixtures"]
    assert dumps == []


def test_no_tracked_file_is_binary():
    binary = [p.relative_to(REPO).as_posix() for p in _tracked() if p.is_file() and b"\0" in p.read_bytes()[:65536]]
    assert binary == []


def test_no_tracked_file_is_empty_but_a_package_marker():
    empty = [p.relative_to(REPO).as_posix() for p in _tracked()
             if p.is_file() and p.stat().st_size == 0 and p.name != "__init__.py"]
    assert empty == []
