"""No lost data through an output option: -o never overwrites an input, never replaces a device, FIFO or
symlink with a regular file, is checked before any long work, and a report that cannot be written at the end
of a run goes to a temporary file named on stderr instead of vanishing."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading

import pytest

from tests.robustness.harness import (
    assert_one_error_line,
    cli_env,
    output_options,
    required_args,
    run,
    wait_for,
)
from tests.conftest import REPO

SOURCE = "import torch\ntorch.utils.checkpoint.checkpoint(f, x, use_reentrant=True)\n"
LOG = "drafter-0 step=1 loss=2.0 tok/s=100\n"
CSV = "0, 40000, 0\n1, 40000, 95\n"


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "train.py").write_text(SOURCE)
    (tmp_path / "run.log").write_text(LOG)
    (tmp_path / "smi.csv").write_text(CSV)
    return tmp_path


# (args with {d} for the folder, the input -o names) for every command that reads files.
OVERWRITES = [
    (["scan", "{d}/train.py", "-o", "{d}/train.py"], "train.py"),
    (["scan", "{d}", "-o", "{d}/train.py"], "train.py"),  # a file the scan of the folder reads
    (["check", "{d}/train.py", "--no-probes", "-o", "{d}/train.py"], "train.py"),
    (["logs", "{d}/run.log", "-o", "{d}/run.log"], "run.log"),
    (["gpus", "--from", "{d}/smi.csv", "-o", "{d}/smi.csv"], "smi.csv"),
    (["status", "--log", "{d}/run.log", "--from", "{d}/smi.csv", "-o", "{d}/run.log"], "run.log"),
    (["status", "--log", "{d}/run.log", "--from", "{d}/smi.csv", "-o", "{d}/smi.csv"], "smi.csv"),
    (["scan", "{d}/train.py", "-o", "{d}/hardlink.py"], "train.py"),  # the same file under another name
    (["scan", "{d}/train.py", "-o", "{d}/symlink.py"], "train.py"),
    (["repro", "--device", "cpu", "--trace", "{d}/out.json", "-o", "{d}/out.json"], "out.json"),
]


@pytest.mark.parametrize("args, victim", OVERWRITES, ids=[" ".join(a[:1] + a[-2:-1]) + f"={v}" for a, v in OVERWRITES])
def test_output_equal_to_an_input_is_refused_and_the_input_kept(inputs, args, victim):
    os.link(inputs / "train.py", inputs / "hardlink.py")
    (inputs / "symlink.py").symlink_to(inputs / "train.py")
    (inputs / "out.json").write_text("{}")
    before = (inputs / victim).read_bytes()
    result = run(*[a.format(d=inputs) for a in args], timeout=30)
    assert_one_error_line(result, 2, "refusing to overwrite an input")
    assert (inputs / victim).read_bytes() == before


def test_output_onto_a_fifo_is_written_through_it_and_the_fifo_stays(inputs):
    fifo = inputs / "report.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = run("scan", inputs / "train.py", "-f", "json", "-o", fifo, timeout=30)
    reader.join(10)
    assert result.returncode == 1, result
    assert json.loads(received[0])["findings"][0]["code"] == "DFD101"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_output_onto_a_symlink_replaces_its_target_and_keeps_the_link(inputs):
    target = inputs / "reports" / "scan.json"
    target.parent.mkdir()
    target.write_text("old")
    link = inputs / "latest.json"
    link.symlink_to(target)
    result = run("scan", inputs / "train.py", "-f", "json", "-o", link, timeout=30)
    assert result.returncode == 1, result
    assert os.path.islink(link) and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["findings"][0]["code"] == "DFD101"


def test_output_onto_dev_null_writes_in_place():
    result = run("scan", REPO / "fixtures" / "scan" / "clean_step.py", "-o", os.devnull, timeout=30)
    assert result.returncode == 0, result
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.parametrize("kind", ["folder", "socket"])
def test_output_onto_a_folder_or_socket_is_refused(inputs, kind):
    import socket

    path = inputs / kind
    server = None
    if kind == "folder":
        path.mkdir()
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
    try:
        result = run("scan", inputs / "train.py", "-o", path, timeout=30)
    finally:
        if server is not None:
            server.close()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result
    assert kind == "folder" and path.is_dir() or stat.S_ISSOCK(os.lstat(path).st_mode)


@pytest.mark.parametrize("command, option", output_options())
def test_an_unwritable_output_is_refused_before_any_work(inputs, command, option):
    # A regular file where a folder should be: no one, root included, can create a file below it.
    (inputs / "blocker").write_text("")
    suffix = ".md" if option == "--out" else ".json"
    args = [command, *required_args(command, inputs), option, inputs / "blocker" / f"report{suffix}"]
    result = run(*args, cwd=inputs, timeout=30)  # repro or pipeline would run for minutes if not refused first
    assert_one_error_line(result, 2, option)
    assert not list(inputs.glob("**/.*.tmp")), "a temporary file was left behind"


@pytest.mark.parametrize("command, option", output_options())
def test_a_dash_output_is_refused_and_makes_no_file_named_dash(inputs, command, option):
    args = [command, *required_args(command, inputs), option, "-"]
    result = run(*args, cwd=inputs, timeout=30)
    assert_one_error_line(result, 2, f"{option} -:")  # (report asks for a .md or .html name before that)
    assert not (inputs / "-").exists()


def _has_open(pid: int, path) -> bool:
    import psutil

    try:
        return any(f.path == str(path) for f in psutil.Process(pid).open_files())
    except psutil.NoSuchProcess:
        return True  # it ended: let the assertions below say why


def test_a_report_that_cannot_be_written_after_the_run_goes_to_a_temp_file(inputs):
    out = inputs / "out"
    out.mkdir()
    args = [sys.executable, "-m", "dflash_doctor", "logs", str(inputs / "run.log"), "--follow", "--max-seconds",
            "3", "-f", "json", "-o", str(out / "report.json")]
    proc = subprocess.Popen(args, env=cli_env(), cwd=inputs, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        # Once the log is open the options have been checked (out/ was writable); now the folder becomes a file.
        wait_for(lambda: _has_open(proc.pid, inputs / "run.log"), 20, "logs --follow to open the log")
        out.rmdir()
        out.write_text("not a folder any more")
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode & 4, (proc.returncode, stderr)
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    fallback = [word for word in stderr.split() if "dflash-doctor-logs-" in word]
    assert fallback, stderr
    path = fallback[0].rstrip(")").rstrip(",")
    document = json.loads(open(path, encoding="utf-8").read())
    os.unlink(path)
    assert document["exit_code"] == proc.returncode
    assert any(p["subject"] == f"--output {out / 'report.json'}" and "instead" in p["hint"]
               for p in document["problems"]), document["problems"]


def _input_output_pairs():
    """(declared input, output option) for every command with both: read from the app, like the rest."""
    from tests.robustness.harness import input_options

    outputs = output_options()
    return [(declared, option) for declared in input_options() if not declared.spec.folder
            for command, option in outputs if command == declared.command]


@pytest.mark.parametrize("how", ["same path", "hard link"])
@pytest.mark.parametrize("declared, output", _input_output_pairs(), ids=lambda p: str(p))
def test_no_output_option_ever_replaces_a_declared_input(tmp_path, declared, output, how):
    """`scan t.py --baseline b.json -f json -o b.json` and the like: inode, not path, so a hard link counts."""
    victim = tmp_path / "input.md"  # .md: report's --out takes nothing else
    victim.write_text('{"findings": []}\n', encoding="utf-8")
    target = victim
    if how == "hard link":
        target = tmp_path / "other-name.md"
        os.link(victim, target)
    before = victim.read_bytes()
    result = run(declared.command, *declared.argv(tmp_path, victim), output, target, cwd=tmp_path, timeout=30)
    assert_one_error_line(result, 2, "refusing to overwrite an input")
    assert victim.read_bytes() == before and victim.stat().st_nlink == (2 if how == "hard link" else 1)


def test_the_baseline_survives_being_named_as_the_output(inputs):
    first = run("scan", inputs / "train.py", "-f", "json", "-o", inputs / "b.json", cwd=inputs)
    assert first.returncode == 1, first
    before = (inputs / "b.json").read_bytes()
    again = run("scan", inputs / "train.py", "--baseline", inputs / "b.json", "-f", "json", "-o", inputs / "b.json",
                cwd=inputs)
    assert_one_error_line(again, 2, "b.json", "refusing to overwrite an input")
    assert (inputs / "b.json").read_bytes() == before
