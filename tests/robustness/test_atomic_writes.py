"""The one writer every output goes through (dflash_doctor.outputs) and the fallbacks in commands.common, on
real files: a failed write leaves the old file and no temporary file, modes behave like a redirect's, a FIFO
nobody reads is given up on, and a report or artifact that cannot go where it was asked goes somewhere else."""
from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
import threading
import time

import pytest

from dflash_doctor.commands.common import finish, write_artifact, write_document
from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Report
from dflash_doctor.outputs import atomic_file, check_output, write_atomically
from dflash_doctor.render import OutputFormat


def _leftovers(folder):
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_failure_inside_the_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_file(target) as stream:
            stream.write("half a rep")
            raise RuntimeError("disk went away")
    assert target.read_text() == "old" and _leftovers(tmp_path) == []


def test_a_new_file_gets_the_umask_and_an_existing_one_keeps_its_mode(tmp_path):
    old_umask = os.umask(0o027)
    try:
        write_atomically(tmp_path / "new.txt", "x")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(tmp_path / "new.txt").st_mode) == 0o640
    existing = tmp_path / "existing.txt"
    existing.write_text("old")
    existing.chmod(0o604)
    write_atomically(existing, "new")
    assert existing.read_text() == "new" and stat.S_IMODE(existing.stat().st_mode) == 0o604


def test_bytes_and_missing_folders(tmp_path):
    write_atomically(tmp_path / "a" / "b" / "weights.bin", b"\x00\xff")
    assert (tmp_path / "a" / "b" / "weights.bin").read_bytes() == b"\x00\xff"


def test_a_fifo_nobody_reads_is_given_up_on(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(OSError) as raised:
        with atomic_file(fifo, fifo_wait_s=0.3) as stream:
            stream.write("x")
    assert raised.value.errno == errno.ENXIO and time.monotonic() - started < 5
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_with_a_late_reader_gets_the_data(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received = []

    def late_reader():
        time.sleep(0.3)
        received.append(fifo.read_text())

    reader = threading.Thread(target=late_reader)
    reader.start()
    write_atomically(fifo, "report\n")
    reader.join(5)
    assert received == ["report\n"]


def test_check_output_refuses_a_folder_and_a_path_below_a_file(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="is a folder"):
        check_output(tmp_path / "folder")
    with pytest.raises(UsageError, match="is not a folder"):
        check_output(tmp_path / "file" / "out.json")


def test_check_output_refuses_inputs_through_links_and_folders(tmp_path):
    source = tmp_path / "train.py"
    source.write_text("x = 1\n")
    (tmp_path / "alias.py").symlink_to(source)
    with pytest.raises(UsageError, match="same file as"):
        check_output(tmp_path / "alias.py", [source])
    with pytest.raises(UsageError, match="reads in"):
        check_output(source, [tmp_path], read_suffixes=(".py",))
    check_output(tmp_path / "report.sarif", [tmp_path], read_suffixes=(".py",))  # a new file beside them is fine
    check_output(tmp_path / "new.py", [tmp_path], read_suffixes=(".py",))  # not there yet: nothing to lose
    assert _leftovers(tmp_path) == [] and not list(tmp_path.glob(".dflash-doctor-probe*"))


def _blocked_path(tmp_path):
    (tmp_path / "blocker").write_text("")
    return tmp_path / "blocker" / "report.json"


def test_finish_falls_back_to_a_temporary_file_and_says_so(tmp_path, capsys):
    report = Report("scan", facts={"files": 1})
    code = finish(report, OutputFormat.JSON, output=_blocked_path(tmp_path))
    err = capsys.readouterr().err
    fallback = next(word.rstrip(")") for word in err.split() if "dflash-doctor-scan-" in word)
    document = json.loads(open(fallback, encoding="utf-8").read())
    os.unlink(fallback)
    assert code == 4 and document["exit_code"] == 4 and fallback.endswith(".json")
    assert document["problems"][0]["subject"] == f"--output {_blocked_path(tmp_path)}"


def test_finish_falls_back_to_stdout_when_no_temporary_file_can_be_made(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "blocker"))  # gettempdir(): a regular file
    report = Report("repro", facts={"verdict": "reproduced"}, exit_code_override=1)
    code = finish(report, OutputFormat.JSON, output=_blocked_path(tmp_path))
    out = capsys.readouterr().out
    assert code == 5 and json.loads(out)["problems"][0]["hint"] == "it is in stdout instead"


def test_an_artifact_that_cannot_be_written_goes_to_a_temporary_file(tmp_path):
    report = Report("repro", exit_code_override=0)
    write_artifact(report, "--trace", _blocked_path(tmp_path), lambda path: write_atomically(path, "{}"))
    problem = report.problems[0]
    fallback = problem.hint.split(" ")[3]  # "it is in PATH instead"
    assert problem.subject == f"--trace {_blocked_path(tmp_path)}" and open(fallback).read() == "{}"
    os.unlink(fallback)
    assert report.exit_code() == 4


def test_a_document_that_cannot_be_written_goes_to_a_temporary_file(tmp_path):
    code, line = write_document(_blocked_path(tmp_path).with_suffix(".md"), "# report\n", "--out", "report", ".md")
    fallback = line.split(" it is in ")[1].split(" ")[0]
    assert code == 4 and open(fallback).read() == "# report\n"
    os.unlink(fallback)


def test_finish_writes_stderr_once_when_the_output_succeeds(tmp_path, capsys):
    assert finish(Report("scan"), OutputFormat.TEXT, output=tmp_path / "out.txt") == 0
    assert capsys.readouterr().err.count("scan: no findings") == 1
    assert (tmp_path / "out.txt").read_text() == ""
