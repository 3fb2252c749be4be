"""attach runs as root over another user's process: the files its frames name are read only as that user could,
never blocking and never unbounded; py-spy's own trouble is said plainly (real processes, real files, a real
second user, real signals; py-spy's own output stands in only where this machine cannot make it fail so)."""
from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import subprocess
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dflash_doctor.errors import MissingDependency
from dflash_doctor.supervise.attach import AttachSpec, attach, error_line, find_py_spy
from tests.run.helpers import read_line_with

# A worker whose code object names `path` as its file (as code compiled from any file name does), parked at a lock
# its sibling holds: attach reads the frame's file for the lock rule.
PARK = "def park(lock, other):\n    with lock:\n        ready.wait()\n        with other:\n            pass\n"
PARKED = r'''
import os, sys, threading
path = sys.argv[1]
code = "def park(lock, other):\n    with lock:\n        ready.wait()\n        with other:\n            pass\n"
namespace = {"ready": threading.Barrier(3)}
exec(compile(code, path, "exec"), namespace)
a, b = threading.Lock(), threading.Lock()
threads = [threading.Thread(target=namespace["park"], args=pair, name=name)
           for pair, name in (((a, b), "one"), ((b, a), "two"))]
for thread in threads:
    thread.start()
namespace["ready"].wait()
print("ready", os.getpid(), flush=True)
for thread in threads:
    thread.join()
'''


def _parked(path, user=None):
    def drop():
        if user is not None:
            os.setgid(user.pw_gid)
            os.setgroups([])
            os.setuid(user.pw_uid)

    # another user may not reach this interpreter (a pyenv under /root): the system's own then
    interpreter = sys.executable if user is None else "/usr/bin/python3"
    if not os.path.exists(interpreter):
        pytest.skip("no interpreter the second user can run")
    proc = subprocess.Popen([interpreter, "-c", PARKED, str(path)], stdout=subprocess.PIPE, text=True,
                            preexec_fn=drop, cwd="/")
    read_line_with(proc.stdout, "ready")
    return proc


def _attach_json(cli, pid, tmp_path, timeout=60):
    out = tmp_path / "attach.json"
    began = time.monotonic()
    proc = cli("attach", pid, "--interval", "0.2", "-f", "json", "-o", out, timeout=timeout)
    return proc, json.loads(out.read_text()), time.monotonic() - began


@pytest.mark.timeout(90)
def test_a_fifo_and_dev_zero_as_frame_files_neither_block_nor_grow(cli, tmp_path):
    fifo = tmp_path / "frames.py"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        proc = _parked(path)
        try:
            done, doc, took = _attach_json(cli, proc.pid, tmp_path)
        finally:
            proc.kill()
            proc.wait(30)
        assert done.returncode in (0, 1), done.stderr  # the cycle may or may not be named: no source to read
        assert took < 45
        assert "Traceback" not in done.stderr


@pytest.mark.timeout(90)
def test_a_deeply_nested_expression_in_a_frame_file_is_no_internal_error(cli, tmp_path):
    deep = tmp_path / "deep.py"
    # ast.parse gives up on it with RecursionError ('1+' chain) or MemoryError (a chain of unary minus)
    deep.write_text(PARK + "value = " + "1+" * 100_000 + "1\n")
    proc = _parked(deep)
    try:
        done, _, _ = _attach_json(cli, proc.pid, tmp_path)
    finally:
        proc.kill()
        proc.wait(30)
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


@pytest.fixture(scope="module")
def second_user():
    if os.geteuid() != 0:
        pytest.skip("needs root to make a second user")
    name = "dfdattach"
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                       capture_output=True, timeout=30)
        return pwd.getpwnam(name)


@pytest.mark.timeout(90)
def test_a_root_only_file_named_by_another_users_frame_is_never_quoted(cli, tmp_path, second_user):
    # the root-only file holds the worker's own lines with a secret beside each: quoted only if attach reads it
    folder = tempfile.mkdtemp(prefix="dfd-attach-")  # pytest's own folders are root's alone: not searchable
    os.chmod(folder, 0o755)
    secret = Path(folder) / "secret.py"
    secret.write_text("".join(f"{line}  # TOP_SECRET\n" for line in PARK.splitlines()))
    secret.chmod(0o600)  # root's alone
    proc = _parked(secret, second_user)
    try:
        done, doc, _ = _attach_json(cli, proc.pid, tmp_path)
    finally:
        proc.kill()
        proc.wait(30)
    assert "TOP_SECRET" not in json.dumps(doc) and "TOP_SECRET" not in done.stderr
    # the same file, readable by that user, is read: the check is the target's permission, not a blanket refusal
    secret.chmod(0o644)
    proc = _parked(secret, second_user)
    try:
        _, doc, _ = _attach_json(cli, proc.pid, tmp_path)
    finally:
        proc.kill()
        proc.wait(30)
    shutil.rmtree(folder)
    assert "TOP_SECRET" in json.dumps(doc)


@pytest.mark.timeout(60)
def test_a_stopped_process_is_said_to_be_stopped_not_refused(cli, tmp_path):
    proc = _parked(tmp_path / "absent.py")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        done = cli("attach", proc.pid, timeout=50)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(30)
    assert done.returncode == 4
    line, = done.stderr.strip().splitlines()
    assert "is stopped" in line and f"kill -CONT {proc.pid}" in line and "ptrace" not in line


@pytest.mark.timeout(60)
def test_py_spys_failure_is_quoted_by_its_error_line_even_with_a_rust_backtrace(cli):
    sleeper = subprocess.Popen(["sleep", "60"])  # not a Python process: py-spy fails on it
    try:
        done = cli("attach", sleeper.pid, env={"RUST_BACKTRACE": "1"}, timeout=50)
    finally:
        sleeper.kill()
        sleeper.wait(30)
    assert done.returncode == 4, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "Error" in line or "error" in line
    assert not line.rstrip().endswith(": main")
    # the picker itself, on the shape py-spy prints with RUST_BACKTRACE=1 (its frames numbered up to "main")
    said = ["Error: Failed to find python version from target process", "", "Stack backtrace:",
            "   0: std::backtrace::Backtrace::capture", "  10: main"]
    assert error_line(said) == "Error: Failed to find python version from target process"


def test_py_spy_beside_the_interpreter_is_found_when_not_on_path(tmp_path):
    beside = tmp_path / "bin" / "py-spy"
    beside.parent.mkdir()
    beside.write_text("#!/bin/sh\n")
    beside.chmod(beside.stat().st_mode | stat.S_IXUSR)
    assert find_py_spy(lambda name: None, lambda: [str(tmp_path / "nothing" / "py-spy"), str(beside)]) == str(beside)
    with pytest.raises(MissingDependency):
        find_py_spy(lambda name: None, lambda: [str(tmp_path / "nothing" / "py-spy")])


@pytest.mark.timeout(60)
def test_py_spy_output_this_tool_cannot_read_is_a_problem_not_a_clean_bill(tmp_path):
    proc = _parked(tmp_path / "absent.py")

    def changed_format(argv, timeout):  # a py-spy whose dump format changed: exit 0, nothing recognisable
        return subprocess.CompletedProcess(argv, 0, "{\"threads\": []}\n", "")

    try:
        report = attach(AttachSpec(proc.pid, samples=2, interval_s=0.1), runner=changed_format)
    finally:
        proc.kill()
        proc.wait(30)
    assert report.findings == []
    problem, = report.problems
    assert "no thread this tool could read" in problem.reason
