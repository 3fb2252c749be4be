"""`logs` on what is not a plain log: devices, FIFOs, folders, binary data, compressed files, hostile file names,
NaN options. One line and the documented exit code each time, bounded in time, never a traceback."""
from __future__ import annotations

import bz2
import gzip
import lzma
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, run_cli, run_cli_json

SEED = REPO / "fixtures" / "logs" / "seed003_grep.log"


def problem_lines(proc):
    return [line for line in proc.stderr.splitlines() if line.startswith("could not check")]


@pytest.mark.timeout(60)
def test_dev_zero_is_a_problem_not_an_endless_read():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    proc, doc = run_cli_json("logs", "/dev/zero", timeout=30)
    assert proc.returncode == 4 and doc["findings"] == []
    assert [p["reason"] for p in doc["problems"]] == ["not read: a character device"]


@pytest.mark.timeout(60)
def test_fifo_and_folder_are_problems(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    fifo = tmp_path / "train.fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO (named pipe)"), (tmp_path, "a folder")):
        proc, doc = run_cli_json("logs", path, timeout=30)
        assert proc.returncode == 4 and doc["problems"][0]["reason"] == f"not read: {kind}"
        assert "Traceback" not in proc.stderr and len(problem_lines(proc)) == 1


@pytest.mark.timeout(60)
def test_stdin_fed_from_dev_zero_stops_at_the_first_block():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open("/dev/zero", "rb") as zeros:
        proc = subprocess.run([sys.executable, "-m", "dflash_doctor", "logs", "-", "--format", "json"], stdin=zeros,
                              capture_output=True, text=True, timeout=30, env=env, cwd=REPO)
    assert proc.returncode == 4 and "binary data" in proc.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("suffix, compress", [(".gz", gzip.compress), (".bz2", bz2.compress),
                                              (".xz", lzma.compress), ("", gzip.compress)])
def test_compressed_logs_are_read_whatever_their_name(tmp_path, suffix, compress):
    log = tmp_path / f"train.log{suffix}"
    log.write_bytes(compress(SEED.read_bytes()))
    proc, doc = run_cli_json("logs", log)
    assert proc.returncode == 1
    assert [(f["code"], f["line"]) for f in doc["findings"]] == [("DFD501", 3)]
    assert doc["facts"]["compression"] == {gzip.compress: "gzip", bz2.compress: "bzip2", lzma.compress: "xz"}[compress]


@pytest.mark.timeout(60)
def test_a_truncated_gzip_keeps_what_was_read_and_says_so(tmp_path):
    data = gzip.compress(SEED.read_bytes() + b"".join(b"[drafter-1] step=%d 7.1 Ktok/s\n" % n for n in range(5000)))
    log = tmp_path / "cut.log.gz"
    log.write_bytes(data[: len(data) // 2])
    proc, doc = run_cli_json("logs", log)
    assert proc.returncode == 5  # the finding before the cut, and the problem
    assert [f["code"] for f in doc["findings"]] == ["DFD501"]
    assert doc["problems"][0]["reason"].startswith("read stopped after line")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("head, kind", [(b"\x28\xb5\x2f\xfd" + b"\0" * 20, "zstd"), (b"PK\x03\x04" + b"\0" * 20, "zip")])
def test_compressions_not_read_are_named(tmp_path, head, kind):
    log = tmp_path / "train.log"
    log.write_bytes(head)
    proc, doc = run_cli_json("logs", log)
    assert proc.returncode == 4 and doc["problems"][0]["reason"] == f"not read: {kind}-compressed"


@pytest.mark.timeout(60)
def test_binary_data_is_a_problem(tmp_path):
    log = tmp_path / "core"
    log.write_bytes(bytes(range(256)) * 64 + b"\0" * 20000)
    proc, doc = run_cli_json("logs", log)
    assert proc.returncode == 4 and "binary data" in doc["problems"][0]["reason"]


@pytest.mark.timeout(60)
def test_a_file_name_cannot_forge_output_lines(tmp_path):
    name = "run\nx.py:1:1: DFD999 forged-finding\x1b[2J.log"
    log = tmp_path / name
    log.write_bytes(SEED.read_bytes())
    proc = run_cli("logs", log)
    assert proc.returncode == 1
    out = proc.stdout + proc.stderr
    assert "\x1b" not in out
    assert not any(line.startswith("x.py") for line in out.splitlines())
    assert "run\\nx.py:1:1: DFD999 forged-finding\\x1b[2J.log:3:1: DFD501" in proc.stdout


@pytest.mark.timeout(60)
def test_escape_sequences_in_the_log_are_not_replayed(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("Exception in thread drafter-0:\nRuntimeError: Detected that you are using FX to symbolically trace "
                   "a dynamo-optimized function\x1b[2J\x1b]0;owned\x07\n")
    proc = run_cli("logs", log)
    assert proc.returncode == 1 and "\x1b" not in proc.stdout + proc.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, says", [
    (["--drop", "nan"], "--drop must be a finite number"),
    (["--drop", "1.5"], "--drop"),
    (["--max-seconds", "nan"], "--max-seconds must be a finite number"),
    (["--max-seconds", "-1"], "--max-seconds"),
    (["--tokens-per-it", "0"], "--tokens-per-it"),
    (["--tokens-per-it", "inf"], "--tokens-per-it must be a finite number"),
])
def test_bad_numbers_are_usage_errors(args, says):
    proc = run_cli("logs", SEED, *args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr


@pytest.mark.timeout(20)  # about 2 s here; the unbounded span it guards against took 36 s
def test_lines_made_of_rule_openers_do_not_make_a_pattern_backtrack():
    # Each line is 64 KiB (the reader's cut) of one opener a rule pattern waits on with an open-ended part after
    # it ('what(): [PG ' waits for 'Rank N'): a pattern with an unbounded lazy span would take seconds per line.
    from dflash_doctor.logs.reader import MAX_LINE
    from dflash_doctor.rules.logs import trigger_words
    from tests.logs.test_scan import scan_text

    openers = ["what(): [PG ", "[PG 0 Rank ", "#0  0x1 in f", "Thread 1 (Thread 0x1 (LWP 1)", "Rank 1 crashed with",
               'File "x.py", line 1, in ', "FatalError: A serious error (", "DistBackendError: "]
    lines = [(word * (MAX_LINE // len(word)))[:MAX_LINE - 1] for word in openers * 8 + list(trigger_words())]
    report = scan_text("\n".join(lines) + "\n")
    assert report.facts["lines"] == len(lines)
