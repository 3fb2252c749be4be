"""Data cut short and odd line endings (issue 28): a compressed log cut or damaged keeps the lines before the cut
and says where it was cut; a compressed file is never followed as text; CR-only line endings read like LF; two
thread tracebacks printed line by line at the same time are each their own thread's death."""
from __future__ import annotations

import bz2
import gzip
import lzma

import pytest

from dflash_doctor.logs.options import LogOptions
from dflash_doctor.logs.source import scan_log
from tests.conftest import REPO, run_cli, run_cli_json
from tests.logs.test_scan import scan_fixture, scan_text

FIXTURES = REPO / "fixtures" / "logs"
# bzip2 decompresses whole blocks (900 kB of text at its default level): a cut loses the block it falls in, so
# it is tested with 100 kB blocks, where the cut lies blocks after the deaths
COMPRESSORS = [("gzip", gzip.compress), ("bzip2", lambda data: bz2.compress(data, 1)), ("xz", lzma.compress)]
# (losses that vary, so that compressed bytes grow with the text, as real logs do)
PROGRESS = b"".join(b"[drafter-1] step=%d loss=%.6f 7.1 Ktok/s\n" % (n, (n * 7919 % 10007) / 5000)
                    for n in range(40_000))


def found(report):
    return [(f.code, f.evidence.get("thread"), f.line) for f in report.findings if f.code != "DFD503"]


def cut_log(tmp_path, compress, data, keep):
    packed = compress(data)
    path = tmp_path / "train.log.cmp"
    path.write_bytes(packed[:int(len(packed) * keep)])
    return path


@pytest.mark.parametrize("kind, compress", COMPRESSORS)
def test_a_log_cut_early_keeps_the_deaths_before_the_cut(tmp_path, kind, compress):
    # cut inside the first block read (where the whole file used to be dropped)
    data = (FIXTURES / "fx_patcher_race.log").read_bytes() + PROGRESS
    report = scan_log(str(cut_log(tmp_path, compress, data, 0.3)), LogOptions())
    assert found(report)[:3] == [("DFD518", "graph-probe", 27), ("DFD518", "drafter-0", 45),
                                 ("DFD518", "drafter-2", 54)]
    assert report.facts["lines"] > 1000 and report.facts["compression"] == kind
    [problem] = report.problems
    assert problem.reason.startswith(f"read stopped after line {report.facts['lines']:,}: the {kind} data is cut "
                                     "short: it ends after ")
    assert problem.reason.endswith("compressed bytes, before its end marker")


@pytest.mark.parametrize("kind, compress", COMPRESSORS)
def test_a_death_late_in_a_cut_log_is_found_and_every_line_before_the_cut_is_counted(tmp_path, kind, compress):
    later = PROGRESS.replace(b"drafter-1", b"drafter-2")  # (not a repeat, which xz would store in a few bytes)
    data = PROGRESS + (FIXTURES / "seed003_grep.log").read_bytes() + later
    whole = compress(data)
    path = tmp_path / "train.log.cmp"
    path.write_bytes(whole[:len(whole) * 3 // 4])
    report = scan_log(str(path), LogOptions())
    assert [(f.code, f.line) for f in report.findings if f.code == "DFD501"] == [("DFD501", 40_003)]
    decompressed_lines = data.count(b"\n")
    assert 40_003 < report.facts["lines"] < decompressed_lines
    assert len(report.problems) == 1


@pytest.mark.parametrize("kind, compress", COMPRESSORS)
def test_damaged_data_is_read_up_to_the_damage(tmp_path, kind, compress):
    packed = bytearray(compress((FIXTURES / "seed003_grep.log").read_bytes() + PROGRESS))
    packed[len(packed) // 2] ^= 0xFF
    path = tmp_path / "train.log.cmp"
    path.write_bytes(bytes(packed))
    report = scan_log(str(path), LogOptions())
    # (deflate decodes damaged data into garbage until its checksum at the end: what follows the damage may add
    # findings of its own, never remove those before it)
    assert [(f.code, f.line) for f in report.findings][0] == ("DFD501", 3)
    assert f"the {kind} data is damaged" in report.problems[0].reason


@pytest.mark.parametrize("kind, compress", COMPRESSORS)
def test_concatenated_members_are_read_like_zcat_reads_them(tmp_path, kind, compress):
    path = tmp_path / "train.log.cmp"
    path.write_bytes(compress(PROGRESS) + compress((FIXTURES / "seed003_grep.log").read_bytes()))
    report = scan_log(str(path), LogOptions())
    assert [(f.code, f.line) for f in report.findings if f.code != "DFD503"] == [("DFD501", 40_003)]
    assert report.problems == [] and report.facts["lines"] == 40_003


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind, compress", COMPRESSORS)
def test_follow_refuses_a_compressed_file_in_one_line(tmp_path, kind, compress):
    path = tmp_path / "train.log"
    path.write_bytes(compress((FIXTURES / "seed003_grep.log").read_bytes()))
    proc = run_cli("logs", "--follow", "--max-seconds", "5", path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and f"it is {kind}-compressed" in proc.stderr


@pytest.mark.parametrize("name", ["full_run.log", "split_thread_headers.log", "torchrun_summary.log",
                                  "fx_patcher_race.log"])
@pytest.mark.parametrize("ending", [b"\r", b"\r\n"])
def test_cr_only_and_crlf_line_endings_give_the_findings_of_lf(tmp_path, name, ending):
    lf = scan_fixture(name)
    path = tmp_path / name
    path.write_bytes((FIXTURES / name).read_bytes().replace(b"\n", ending))
    other = scan_log(str(path), LogOptions())
    assert [f.to_dict() | {"path": None} for f in other.findings] == [f.to_dict() | {"path": None}
                                                                      for f in lf.findings]
    assert other.facts["lines"] == lf.facts["lines"]


def test_cr_only_from_stdin(tmp_path):
    data = (FIXTURES / "seed003_grep.log").read_bytes().replace(b"\n", b"\r")
    proc, doc = run_cli_json("logs", "-", input=data.decode())
    assert [(f["code"], f["line"]) for f in doc["findings"]] == [("DFD501", 3)]


INTERLEAVED = {
    # every line of the two tracebacks alternating, headers first (CPython's excepthook writes line by line)
    "alternating": ("Exception in thread drafter-0:\n"
                    "Exception in thread drafter-1:\n"
                    "Traceback (most recent call last):\n"
                    "Traceback (most recent call last):\n"
                    '  File "/srv/train.py", line 10, in run_a\n'
                    '  File "/srv/train.py", line 20, in run_b\n'
                    "    a()\n"
                    "    b()\n"
                    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                    "KeyError: 'input_ids'\n"),
    # the second header and traceback start inside the first traceback, the frames then alternate
    "second inside the first": ("Exception in thread drafter-0:\n"
                                "Traceback (most recent call last):\n"
                                "Exception in thread drafter-1:\n"
                                '  File "/srv/train.py", line 10, in run_a\n'
                                "Traceback (most recent call last):\n"
                                "    a()\n"
                                '  File "/srv/train.py", line 20, in run_b\n'
                                "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                                "    b()\n"
                                "KeyError: 'input_ids'\n"),
}


@pytest.mark.parametrize("shape", INTERLEAVED)
def test_two_tracebacks_printed_at_once_are_two_deaths_of_the_right_threads(shape):
    report = scan_text(INTERLEAVED[shape])
    assert sorted(found(report)) == [("DFD508", "drafter-1", 10), ("DFD511", "drafter-0", 8 + (shape == "alternating"))]
    threads = report.facts["threads"]
    assert (threads["drafter-0"]["died"]["exception"], threads["drafter-1"]["died"]["exception"]) == (
        "RuntimeError", "KeyError")
    assert threads["drafter-0"]["died"]["last_frame"] == "/srv/train.py:10 in run_a"
    assert threads["drafter-1"]["died"]["last_frame"] == "/srv/train.py:20 in run_b"
