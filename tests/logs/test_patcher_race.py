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


# A trainer that routes threading.excepthook through logging ('%(asctime)s %(threadName)s %(message)s') writes each
# death as one record; Dynamo's error for a compiled call that met the patches goes on over several lines and names
# the NameError only inside them ("got NameError('...')"). A stand-in of that shape (as the H200 printed it).
LOGGED_DEATHS = textwrap.dedent("""\
    2026-12-01 23:46:32,425 set-up set-up: building drafter-2 on cuda:0
    2026-12-01 23:46:41,153 fx-tracer Exception in thread fx-tracer: AssertionError: CURRENT_PATCHER is None in finally block
    2026-12-01 23:46:45,489 drafter-1 Exception in thread drafter-1: NameError: module is not installed as a submodule
    2026-12-01 23:46:45,742 drafter-0 Exception in thread drafter-0: TorchRuntimeError: RuntimeError when making fake tensor call
      Explanation: Dynamo failed to run FX node with fake tensors: call_function flex_attention(*(FakeTensor(...,
                   grad_fn=<Error>), GraphModule(), 0.125), **{}): got NameError('module is not installed as a submodule')
      Hint: Your code may result in an error when running in eager.

    from user code:
       File "/srv/venv/lib/python3.12/site-packages/torch/nn/attention/flex_attention.py", line 1690, in flex_attention
        out, lse, max_scores = flex_attention_hop(

    2026-12-01 23:46:45,891 drafter-2 Exception in thread drafter-2: TorchRuntimeError: RuntimeError when making fake tensor call
      Explanation: Dynamo failed to run FX node with fake tensors: call_function flex_attention(*(FakeTensor(...,
                   grad_fn=<Error>)), **{}): got NameError('module is not installed as a submodule')
    2026-12-01 23:46:46,002 supervisor shutting down the other workers
    """)


def test_logged_one_line_deaths_are_each_threads_and_the_wrapped_name_error_is_the_race():
    report = scan_text(LOGGED_DEATHS)
    assert [(f.code, f.evidence["thread"], f.line) for f in report.findings] == [
        ("DFD518", "fx-tracer", 2), ("DFD518", "drafter-1", 3), ("DFD518", "drafter-0", 6),
        ("DFD518", "drafter-2", 15)]
    died = {name: (t["died"]["code"], t["died"]["exception"], t["died"]["kind"], t["died"]["line"])
            for name, t in report.facts["threads"].items() if t["died"]}
    assert died == {"fx-tracer": ("DFD518", "AssertionError", "thread", 2),
                    "drafter-1": ("DFD518", "NameError", "thread", 3),
                    "drafter-0": ("DFD518", "TorchRuntimeError", "thread", 4),
                    "drafter-2": ("DFD518", "TorchRuntimeError", "thread", 13)}
    assert "main" not in report.facts["threads"]


def test_a_logged_one_line_death_no_rule_explains_is_that_threads_and_ends_at_the_next_record():
    text = ("2026-12-01 10:00:00,001 loader Exception in thread loader: KeyError: 'input_ids'\n"
            "  while collating batch 12\n"
            "2026-12-01 10:00:01,002 main-loop NameError: module is not installed as a submodule\n")
    report = scan_text(text)
    assert [(f.code, f.evidence["thread"], f.line) for f in report.findings] == [
        ("DFD508", "loader", 1), ("DFD518", "main", 3)]  # the next record is not the loader's
    assert report.facts["threads"]["loader"]["died"]["exception"] == "KeyError"


def test_logged_deaths_read_the_same_in_a_large_sampled_log():
    padding = "".join(f"2026-12-01 23:40:{i % 60:02d},000 set-up writing corpus chunk {i}\n" for i in range(9000))
    dense = scan_text(LOGGED_DEATHS)
    sampled = scan_text(padding + LOGGED_DEATHS + padding)
    assert sampled.facts["progress_sampled"] is True
    shift = padding.count("\n")
    assert [(f.code, f.evidence["thread"], f.line - shift) for f in sampled.findings] == [
        (f.code, f.evidence["thread"], f.line) for f in dense.findings]
