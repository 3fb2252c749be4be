"""Threads dying at once, as CPython really prints them: headers, names, frames and caret lines of several threads
written into one another. The fixtures in fixtures/logs/interleaved/ are real output of
fixtures/logs/programs/three_deaths.py (torch 2.13.0+cpu, Python 3.11.7; paths renamed), picked from 80 runs for
the ways they interleave; the last test runs the program itself."""
from __future__ import annotations

import subprocess
import sys

import pytest

from dflash_doctor.logs.interleave import untangle
from tests.conftest import REPO
from tests.logs.test_scan import scan_fixture, scan_text

PROGRAM = REPO / "fixtures" / "logs" / "programs" / "three_deaths.py"
DRAFTERS = ["drafter-0", "drafter-1", "drafter-2"]


def dead(report):
    return sorted(name for name, facts in report.facts["threads"].items() if facts["died"])


@pytest.mark.parametrize("name", ["patcher_name_glued_to_source", "patcher_names_glued_together",
                                  "patcher_carets_cut_by_header", "patcher_header_cut_by_source",
                                  "patcher_carets_char_by_char", "patcher_late_name_indented",
                                  "patcher_exception_cut_by_carets", "patcher_header_then_source"])
def test_three_threads_killed_by_the_patcher_race_are_three_patcher_deaths(name):
    report = scan_fixture(f"interleaved/{name}.log")
    assert sorted((f.code, f.evidence["thread"]) for f in report.findings) == [("DFD518", d) for d in DRAFTERS]
    assert dead(report) == DRAFTERS


@pytest.mark.parametrize("name", ["mixed_three_late_names", "mixed_name_after_carets", "mixed_names_after_source",
                                  "mixed_three_at_once", "mixed_header_glued_to_name"])
def test_three_threads_dying_of_three_errors_are_three_deaths_with_three_causes(name):
    # (which traceback is whose cannot always be read from such a text: the causes and the names are checked)
    report = scan_fixture(f"interleaved/{name}.log")
    assert sorted(f.code for f in report.findings) == ["DFD501", "DFD508", "DFD518"]
    assert sorted(f.evidence["thread"] for f in report.findings) == DRAFTERS
    assert dead(report) == DRAFTERS


@pytest.mark.parametrize("line,late,lines,left", [
    ("Exception in thread Exception in thread drafter-1:", 0, ["Exception in thread drafter-1:"], 1),
    ("drafter-2    self.run()", 1, ["Exception in thread drafter-2:", "    self.run()"], 0),
    ("drafter-0drafter-2:", 2, ["Exception in thread drafter-0:", "Exception in thread drafter-2:"], 0),
    ("Exception in thread Exception in thread worker-2worker-1Exception in thread worker-0:", 0,
     ["Exception in thread worker-2:", "Exception in thread worker-1:", "Exception in thread worker-0:"], 0),
    ("drafter-0Traceback (most recent call last):", 1,
     ["Exception in thread drafter-0:", "Traceback (most recent call last):"], 0),
    ("           ^^^^^^^^^^^^^^^^^^^^^Exception in thread drafter-1:", 0, ["Exception in thread drafter-1:"], 0),
    ("NameError: ^^^^^module is not installed as a submodule^^", 0,
     ["NameError: module is not installed as a submodule"], 0),
    ("self.run()Traceback (most recent call last):", 0, ["    self.run()", "Traceback (most recent call last):"], 0),
    ("    self.run()drafter-1drafter-2:", 2,
     ["    self.run()", "Exception in thread drafter-1:", "Exception in thread drafter-2:"], 0),
    ("    ~~~^^^drafter-0", 1, ["Exception in thread drafter-0:"], 0),
    # (seen in a CI run: the late name after another's source line, its own traceback glued on, the colon later)
    ("    return self.call_module(mod, forward, args, kwargs)drafter-1Traceback (most recent call last):", 1,
     ["    return self.call_module(mod, forward, args, kwargs)", "Exception in thread drafter-1:",
      "Traceback (most recent call last):"], 0),
    ("           ^^^^^^^^^^:", 0, [], 0),
    ("Exception in thread Exception in thread     self.run()drafter-1:", 0,
     ["    self.run()", "Exception in thread drafter-1:"], 1),
    ("    Exception in thread self._target(*self._args, **self._kwargs)drafter-0:", 0,
     ["    self._target(*self._args, **self._kwargs)", "Exception in thread drafter-0:"], 0),
    # a source line ending in a name-like word with nothing glued on stays as it is
    ("    x = f(a)tail-1", 1, ["    x = f(a)tail-1"], 1),
    ("    Exception in thread self.run()", 0, ["    self.run()"], 1),
    (": module is not installed as a submodule  File \"/x.py\", line 3, in f", 0,
     [": module is not installed as a submodule", '  File "/x.py", line 3, in f'], 0),
    (":", 0, [], 0),
    ("    :", 1, [], 1),
    # not glued: a C++ traceback, a logged excepthook line, a Java thread
    ("C++ Traceback (most recent call last):", 0, ["C++ Traceback (most recent call last):"], 0),
    ('Exception in thread "main" java.lang.OutOfMemoryError: Java heap space', 0,
     ['Exception in thread "main" java.lang.OutOfMemoryError: Java heap space'], 0),
])
def test_each_glued_shape_seen_comes_back_as_the_lines_each_thread_wrote(line, late, lines, left):
    assert untangle(line, late) == (lines, left)


def test_the_issues_three_line_shape_names_three_threads():
    text = ("Exception in thread Exception in thread drafter-1:\n"
            "drafter-2:\n"
            "Exception in thread drafter-0Traceback (most recent call last):\n"
            '  File "/workspace/train.py", line 88, in run\n'
            "    out = self.drafter(batch)\n"
            "Traceback (most recent call last):\n"
            '  File "/workspace/train.py", line 88, in run\n'
            "    out = self.drafter(batch)\n"
            '  File "/usr/lib/python3.11/site-packages/torch/fx/_symbolic_trace.py", line 516, in path_of_module\n'
            "NameError: ^^^^^module is not installed as a submodule^^\n"
            '  File "/usr/lib/python3.11/site-packages/torch/fx/_symbolic_trace.py", line 516, in path_of_module\n'
            "NameError: module is not installed as a submodule\n"
            "Traceback (most recent call last):\n"
            '  File "/workspace/train.py", line 88, in run\n'
            "    out = self.drafter(batch)\n"
            '  File "/usr/lib/python3.11/site-packages/torch/fx/_symbolic_trace.py", line 516, in path_of_module\n'
            "NameError: module is not installed as a submodule\n")
    report = scan_text(text)
    assert sorted((f.code, f.evidence["thread"]) for f in report.findings) == [("DFD518", d) for d in DRAFTERS]
    assert "drafter-0Traceback (most recent call last)" not in report.facts["threads"]


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(120)
def test_real_threads_dying_together_are_each_read(tmp_path):
    """The program itself, three times: whatever the interleaving, three patcher-race deaths of the three names."""
    for attempt in range(3):
        out = subprocess.run([sys.executable, str(PROGRAM), "patcher"], capture_output=True, text=True, timeout=60)
        assert out.stderr.count("module is not installed as a submodule") >= 3, out.stderr
        report = scan_text(out.stderr)
        (tmp_path / f"run{attempt}.log").write_text(out.stderr)
        # Not every interleaving can be read back: on the 2-core box on 2026-12-06 all three names came back exactly in
        # 36 of 40 runs (34 of 40 before the header-source-name shape below was read); the other runs lost one name
        # to a write glued inside another's source line ('    self.run()drafter-1lin(x)'). What every run kept:
        # at least two of the drafters named, each dead of the patcher race. The exact names are asserted on the
        # recorded runs above, which do not change from one run to the next.
        named = [thread for thread in dead(report) if thread in DRAFTERS]
        assert len(named) >= 2, (attempt, out.stderr)
        assert sum(f.code == "DFD518" and f.evidence["thread"] in DRAFTERS for f in report.findings) >= 2, (
            attempt, out.stderr)
