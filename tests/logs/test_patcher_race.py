"""The FX patcher race (DFD518): torch.fx's Tracer.trace patches nn.Module for every thread while it traces, so
another thread's eager module call raises NameError and overlapping traces end in an AssertionError. Read from a
stand-in shaped like a real threaded trainer's output, and from what torch 2.13 really prints in the minimal case."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from dflash_doctor.hazards import Hazard
from dflash_doctor.mitigations import fix_text
from tests.logs.test_scan import scan_fixture, scan_text
from tests.logs.test_wordings import findings

FX = "/opt/venv/lib/python3.12/site-packages/torch/fx/_symbolic_trace.py"


def test_the_trainer_stand_in_names_every_thread_the_race_killed():
    report = scan_fixture("fx_patcher_race.log")
    assert [(f.code, f.evidence["thread"], f.line) for f in report.findings if f.code != "DFD503"] == [
        ("DFD518", "graph-probe", 27), ("DFD518", "drafter-0", 45), ("DFD518", "drafter-2", 54),
        ("DFD518", "drafter-1", 58)]
    threads = report.facts["threads"]
    assert {name: (t["died"] or {}).get("code") for name, t in threads.items()} == {
        "graph-probe": "DFD518", "drafter-0": "DFD518", "drafter-2": "DFD518", "drafter-1": None}
    assert threads["drafter-0"]["died"]["last_step"] == 3
    assert not any(f.code == "DFD501" for f in report.findings)  # no FX RuntimeError in this log


def test_the_next_steps_are_the_rules_and_the_fix_comes_from_the_mitigation_registry():
    steps = scan_fixture("fx_patcher_race.log").facts["next_steps"]
    assert steps[0].startswith("dflash-doctor scan <trainer dir>: the torch.fx.symbolic_trace")
    assert fix_text(Hazard.PATCHER_RACE) in steps[1]


@pytest.mark.parametrize("line,symptom", [
    ("AssertionError: CURRENT_PATCHER is None in finally block\n", "two traces overlapped"),
    ("AssertionError: CURRENT_PATCHER was changed during a revert_all_patches\n", "two traces overlapped"),
    ("NameError: module is not installed as a submodule\n", "a module call went through another thread's tracer"),
])
def test_each_wording_alone_is_the_race_and_a_death(line, symptom):
    assert findings(line) == [("DFD518", "main", None, None)]
    report = scan_text(line)
    assert report.findings[0].evidence["symptom"] == symptom
    assert report.facts["threads"]["main"]["died"]["code"] == "DFD518"


def test_the_main_thread_tracing_a_module_kept_in_a_list_is_not_the_race():
    text = ("Traceback (most recent call last):\n"
            '  File "/srv/dflash/export.py", line 12, in <module>\n'
            "    gm = torch.fx.symbolic_trace(model)\n"
            f'  File "{FX}", line 1417, in symbolic_trace\n'
            "    graph = tracer.trace(root, concrete_args)\n"
            f'  File "{FX}", line 516, in path_of_module\n'
            '    raise NameError("module is not installed as a submodule")\n'
            "NameError: module is not installed as a submodule\n")
    assert findings(text) == [("DFD513", "main", None, None)]


def test_a_thread_that_traced_for_itself_and_lost_the_race_is_still_the_race():
    text = ("Exception in thread profiler-1:\n"
            "Traceback (most recent call last):\n"
            f'  File "{FX}", line 1417, in symbolic_trace\n'
            "    graph = tracer.trace(root, concrete_args)\n"
            "NameError: module is not installed as a submodule\n")
    assert findings(text) == [("DFD518", "profiler-1", None, None)]


MINIMAL = textwrap.dedent("""
    import threading
    import torch
    import torch.fx

    entered, release = threading.Event(), threading.Event()

    class Waits(torch.nn.Module):
        def forward(self, x):
            entered.set()
            release.wait(30)
            return x + 1

    tracer = threading.Thread(target=torch.fx.symbolic_trace, args=(Waits(),), name="graph-probe")
    tracer.start()
    entered.wait(30)
    worker = threading.Thread(target=lambda: torch.nn.Linear(4, 4)(torch.randn(2, 4)), name="drafter-0")
    worker.start()
    worker.join(30)
    release.set()
    tracer.join(30)
""")


@pytest.mark.timeout(180)
def test_what_torch_prints_in_the_minimal_case_is_read_as_the_race(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "minimal.py"
    script.write_text(MINIMAL)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150,
                          cwd=tmp_path)
    assert "Exception in thread drafter-0" in proc.stderr, proc.stderr[-2000:]
    report = scan_text(proc.stderr)
    assert [(f.code, f.evidence["thread"]) for f in report.findings] == [("DFD518", "drafter-0")]
    assert report.facts["threads"]["drafter-0"]["died"]["code"] == "DFD518"
