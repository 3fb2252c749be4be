"""`.pre-commit-hooks.yaml` works in a scratch repository: findings fail the commit, no Python file staged is
a skip, a clean file passes. Uses the `language: system` variant (the installed dflash-doctor) so the test
needs no network and no environment build; the isolated `language: python` hook differs only in who installs
the tool."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("pre_commit", reason="pre-commit is not installed (pip install pre-commit)")

HOOK = "dflash-doctor-scan-system"
RISKY = "import torch.utils.checkpoint as tuc\n\n\ndef f(fn, x):\n    return tuc.checkpoint(fn, x)\n"
CLEAN = (
    "import torch.utils.checkpoint as tuc\n\n\ndef f(fn, x):\n"
    "    return tuc.checkpoint(fn, x, use_reentrant=False)\n"
)


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PRE_COMMIT_HOME"] = str(tmp_path / "pre-commit-home")
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com")
    return env


def _scratch(tmp_path: Path, files: dict) -> Path:
    repo = tmp_path / "scratch"
    repo.mkdir(parents=True)
    for name, text in files.items():
        (repo / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, timeout=30)
    subprocess.run(["git", "add", "."], cwd=repo, check=True, timeout=30)
    return repo


def _try_repo(repo: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = _env(tmp_path)
    if shutil.which("dflash-doctor", path=env["PATH"]) is None:
        pytest.skip("the dflash-doctor console script is not installed next to this Python")
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "try-repo", str(REPO), HOOK, *args],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120,
    )


def _hook_lines(proc) -> list:
    return [line for line in proc.stdout.splitlines() if line.startswith("dflash-doctor scan")]


@pytest.mark.timeout(150)
def test_a_risky_file_fails_and_names_the_rule(tmp_path):
    proc = _try_repo(_scratch(tmp_path, {"train.py": RISKY, "clean.py": CLEAN}), tmp_path, "--all-files")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert [line.rsplit(".", 1)[-1] for line in _hook_lines(proc)] == ["Failed"]
    finding_lines = [line for line in proc.stdout.splitlines() if line.startswith("train.py:")]
    assert [line.split()[1] for line in finding_lines] == ["DFD102"]


@pytest.mark.timeout(150)
def test_no_python_file_is_a_skip_and_a_clean_file_passes(tmp_path):
    proc = _try_repo(_scratch(tmp_path, {"README.md": "# notes\n"}), tmp_path, "--all-files")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _hook_lines(proc) and _hook_lines(proc)[0].endswith("(no files to check)Skipped")
    proc = _try_repo(_scratch(tmp_path / "clean", {"clean.py": CLEAN}), tmp_path, "--all-files")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _hook_lines(proc)[0].endswith("Passed")
