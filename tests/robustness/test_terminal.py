"""What reaches the terminal cannot lie or crash: a closed pipe ends quietly, an ASCII-only or zero-width
terminal still gets the report, a file name with a newline, an escape sequence, a bidi override or bytes
that are not UTF-8 cannot forge a line or break SARIF, JSON or JUnit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.render.sarif_schema import assert_valid_sarif
from tests.robustness.harness import cli_env, run

FINDING = b"import torch\ntorch.utils.checkpoint.checkpoint(f, x, use_reentrant=True)\n"
# File names an attacker can commit to a repository a CI job then scans.
FORGING = "x.py\nfake.py:1:1: DFD301 forged-finding\n.py"
ESCAPES = "\x1b[2J\x1b[31mred\x1b[0m.py"
BIDI = "admin\u202e\u2066yp.txt\u2069\u2066.py"
NOT_UTF8 = b"caf\xe9.py"


def _closed_stdout_run(*args):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte, as `| head -c 10` is after ten
    proc = subprocess.Popen([sys.executable, "-m", "dflash_doctor", *map(str, args)], stdout=write_end,
                            stderr=subprocess.PIPE, env=cli_env())
    os.close(write_end)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err.decode("utf-8", "replace")


@pytest.mark.parametrize("args", [["scan", "{repo}/fixtures/scan", "-f", "json"], ["explain", "--list"],
                                  ["--help"], ["scan", "--help"]])
def test_a_closed_pipe_ends_quietly_with_141(args):
    from tests.conftest import REPO

    code, stderr = _closed_stdout_run(*[a.format(repo=REPO) for a in args])
    assert (code, stderr) == (141, "")


def test_a_reader_that_stops_early_ends_it_quietly():
    proc = subprocess.Popen([sys.executable, "-m", "dflash_doctor", "explain", "--list", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    assert len(proc.stdout.read(10)) == 10  # `| head -c 10`
    proc.stdout.close()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode in (0, 141) and err == b"", err  # 0 when everything fit in the pipe before it closed


@pytest.fixture
def hostile_names(tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    for name in (FORGING, ESCAPES, BIDI):
        (folder / name).write_bytes(FINDING)
    (folder / os.fsdecode(NOT_UTF8)).write_bytes(FINDING)
    return folder


def test_text_output_shows_each_hostile_name_on_its_own_line_escaped(hostile_names):
    result = run("scan", hostile_names, cwd=hostile_names, timeout=30)
    assert result.returncode == 1, result
    lines = result.stdout.splitlines()
    assert len(lines) == 4 and all(" DFD101 " in line for line in lines), lines
    assert all(line.startswith(str(hostile_names)) for line in lines), lines  # no line forged by a name
    for stream in (result.stdout, result.stderr):
        assert "\x1b" not in stream and "\u202e" not in stream and "\u2066" not in stream
    for shown in ("/x.py\\nfake.py:1:1: DFD301 forged-finding\\n.py:2:1: DFD101", "/caf\\xe9.py:2:1: DFD101",
                  "/\\x1b[2J\\x1b[31mred\\x1b[0m.py:2:1: DFD101", "/admin\\u202e\\u2066yp.txt\\u2069\\u2066.py:2:1"):
        assert sum(shown in line for line in lines) == 1, (shown, lines)


def test_error_lines_escape_the_path_too(tmp_path):
    result = run("scan", str(tmp_path / "missing\nfake: error") + "\x1b[2J.py", timeout=30)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "\x1b" not in result.stderr, result


def test_json_keeps_every_name_exactly(hostile_names):
    result = run("scan", hostile_names, "-f", "json", cwd=hostile_names, timeout=30)
    paths = {finding["path"] for finding in json.loads(result.stdout)["findings"]}
    # Python's json gives the undecodable byte back as the surrogate os.fsencode turns into that byte again.
    assert {os.fsencode(os.path.basename(p)) for p in paths} == {
        os.fsencode(n) for n in (FORGING, ESCAPES, BIDI)} | {NOT_UTF8}


def test_sarif_is_valid_utf8_with_percent_encoded_uris(hostile_names):
    result = run("scan", ".", "-f", "sarif", cwd=hostile_names, timeout=30, binary_stdout=True)
    assert result.returncode == 1, result
    raw = result.stdout.encode("latin-1")
    document = json.loads(raw.decode("utf-8"))  # strict: every byte is valid UTF-8
    assert_valid_sarif(document)
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in document["runs"][0]["results"]}
    assert "caf%E9.py" in uris
    assert "x.py%0Afake.py:1:1:%20DFD301%20forged-finding%0A.py" in uris
    assert "\\ud" not in raw.decode("utf-8")  # no lone surrogate escapes for strict consumers to reject


def test_junit_is_well_formed_with_every_name(hostile_names):
    result = run("scan", ".", "-f", "junit", cwd=hostile_names, timeout=30, binary_stdout=True)
    root = ET.fromstring(result.stdout.encode("latin-1"))
    files = {case.get("file") for case in root.iter("testcase")}
    assert "caf\\xe9.py" in {os.path.basename(f) for f in files}, files
    assert len(files) == 4


@pytest.mark.parametrize("args", [["scan", "{d}"], ["explain", "DFD201"], ["explain", "--list"],
                                  ["report", "{d}", "--no-probes"], ["gpus", "--from", "{csv}"]])
def test_an_ascii_only_terminal_still_gets_the_whole_report(hostile_names, args):
    from tests.conftest import REPO

    csv = REPO / "fixtures" / "gpus" / "seed003_snapshot.csv"
    result = run(*[a.format(d=hostile_names, csv=csv) for a in args], cwd=hostile_names,
                 env={"PYTHONIOENCODING": "ascii", "LC_ALL": "C"}, timeout=60)
    assert result.returncode in (0, 1), result
    assert result.stdout.strip() and result.stdout.isascii(), result
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result


@pytest.mark.parametrize("columns", ["0", "-5", "abc", "1"])
@pytest.mark.parametrize("args, expect", [(["explain", "--list"], "DFD101"), (["scan", "{d}"], "DFD101"),
                                          (["gpus", "--from", "{csv}"], "DFD401")])
def test_a_nonsense_terminal_width_still_prints_the_report(hostile_names, columns, args, expect):
    from tests.conftest import REPO

    csv = REPO / "fixtures" / "gpus" / "seed003_snapshot.csv"
    result = run(*[a.format(d=hostile_names, csv=csv) for a in args], cwd=hostile_names,
                 env={"COLUMNS": columns}, timeout=30)
    assert expect in result.stdout, result
