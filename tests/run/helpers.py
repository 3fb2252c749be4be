"""Plumbing for the run tests: the CLI as a live child (to signal it mid-run), and the test programs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PROGRAMS = Path(__file__).resolve().parent / "programs"


def program(name: str) -> str:
    return str(PROGRAMS / name)


def start_cli(*args, cwd=None, env=None) -> subprocess.Popen:
    """`python -m dflash_doctor ARGS` started, not waited for: the test reads its pipes and signals it."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "dflash_doctor", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd or REPO, env=full_env)


def read_line_with(stream, needle: str, limit: int = 400) -> str:
    """The first line of `stream` containing `needle` (the test's own timeout bounds the wait)."""
    for _ in range(limit):
        line = stream.readline()
        if not line:
            break
        if needle in line:
            return line
    raise AssertionError(f"no line with {needle!r}")


def gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
