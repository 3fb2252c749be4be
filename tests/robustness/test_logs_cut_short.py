"""Data cut short, through every command that reads a log (`logs`, `status`): a compressed log cut or damaged is
read up to the cut and the problem says where; a compressed file is never followed as text; a log whose lines end
in CR alone is not one giant line. Real files, real child processes, bounded in time and memory."""
from __future__ import annotations

import bz2
import functools
import gzip
import json
import lzma

import pytest

from tests.conftest import REPO
from tests.robustness.harness import assert_no_crash, assert_one_error_line, run

LOGS = REPO / "fixtures" / "logs"
GPUS = REPO / "fixtures" / "gpus"
# the fastest level of each: what is tested is reading a cut stream, not the ratio (xz's default level took
# 3 s per test here)
COMPRESSORS = {"gzip": lambda data: gzip.compress(data, 1), "bzip2": lambda data: bz2.compress(data, 1),
               "xz": lambda data: lzma.compress(data, preset=1)}
# (losses that vary: compressed bytes grow with the text, as in a real log)
PROGRESS = b"".join(b"[target-%d] step=%d loss=%.6f 7.1 Ktok/s\n" % (n % 5, n // 5, (n * 7919 % 10007) / 5000)
                    for n in range(60_000))


@functools.lru_cache(maxsize=None)
def _packed(kind: str) -> bytes:
    return COMPRESSORS[kind]((LOGS / "seed003_grep.log").read_bytes() + PROGRESS)  # once per kind, not per test


@pytest.fixture(params=sorted(COMPRESSORS))
def cut_log(request, tmp_path):
    """The seeds' dead drafter, then progress, compressed and cut at two thirds."""
    packed = _packed(request.param)
    path = tmp_path / f"train.log.{request.param}"
    path.write_bytes(packed[:len(packed) * 2 // 3])
    return request.param, path


class TestCompressedLogCutShort:
    def test_logs_reports_what_came_before_the_cut_and_where_it_was_cut(self, cut_log):
        kind, path = cut_log
        result = run("logs", path, "--format", "json", timeout=60)
        assert_no_crash(result)
        doc = json.loads(result.stdout)
        assert result.returncode == 5, result  # the death, and the problem
        assert [(f["code"], f["line"]) for f in doc["findings"] if f["code"] == "DFD501"] == [("DFD501", 3)]
        [problem] = doc["problems"]
        assert problem["reason"].startswith(f"read stopped after line {doc['facts']['lines']:,}: the {kind} data "
                                            "is cut short")
        assert doc["facts"]["lines"] > 10_000

    def test_status_shows_the_dead_worker_read_before_the_cut_and_the_problem(self, cut_log):
        kind, path = cut_log
        result = run("status", "--log", path, "--from", GPUS / "seed003_snapshot.csv", "--roles",
                     "target=0-4,drafter=5-7", "--format", "json", timeout=60)
        assert_no_crash(result)
        doc = json.loads(result.stdout)
        dead = [w for w in doc["facts"]["workers"] if w["state"] == "dead"]
        assert [(w["thread"], w["gpu"], w["cause"]["code"]) for w in dead] == [("drafter-0", 5, "DFD501")]
        assert any(f"the {kind} data is cut short" in p["reason"] for p in doc["problems"])
        assert result.returncode & 4

    def test_status_text_names_the_dead_worker_not_none(self, cut_log):
        kind, path = cut_log
        result = run("status", "--log", path, "--from", GPUS / "seed003_snapshot.csv", "--roles",
                     "target=0-4,drafter=5-7", timeout=60)
        assert_no_crash(result)
        assert result.stdout.splitlines()[:2][0] == "Dead workers"
        assert "drafter-0 died at log line 3" in result.stdout and "none in the log" not in result.stdout
        assert "cut short" in result.stderr


class TestFollowingACompressedFile:
    @pytest.mark.parametrize("kind", sorted(COMPRESSORS))
    def test_refused_in_one_line(self, tmp_path, kind):
        path = tmp_path / "train.log"
        path.write_bytes(COMPRESSORS[kind]((LOGS / "seed003_grep.log").read_bytes()))
        result = run("logs", "--follow", "--max-seconds", "5", path, timeout=30)
        assert_one_error_line(result, 2, "cannot follow", f"{kind}-compressed")


class TestCarriageReturnLines:
    def test_a_cr_only_log_gives_the_findings_of_its_lf_form(self, tmp_path):
        lf = run("logs", LOGS / "full_run.log", "--format", "json", timeout=60)
        path = tmp_path / "full_run.log"
        path.write_bytes((LOGS / "full_run.log").read_bytes().replace(b"\n", b"\r"))
        cr = run("logs", path, "--format", "json", timeout=60)
        assert_no_crash(cr)
        strip = [{k: v for k, v in f.items() if k != "path"} for f in json.loads(lf.stdout)["findings"]]
        assert [{k: v for k, v in f.items() if k != "path"} for f in json.loads(cr.stdout)["findings"]] == strip
        assert cr.returncode == lf.returncode == 1
