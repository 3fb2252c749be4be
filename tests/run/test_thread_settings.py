"""`run` and compile settings kept per thread (torch 2.12+): a switch set once in main is reported for every worker
it did not reach (DFD910), and `--fix non-lazy-backward` reaches them. Real torch on the CPU, real compiles, a
plain thread and a ThreadPoolExecutor worker; the program records when each thread's backward is compiled."""
from __future__ import annotations

import json
import sys

import pytest

from dflash_doctor.compile_settings import per_thread
from tests.run.helpers import program

WORKERS = ("drafter-0", "pool_0")
WITH_THE_FORWARD = ["fw", "bw", "forward-returned"]
LAZY = ["fw", "forward-returned", "bw"]


def _per_thread_release() -> bool:
    torch = pytest.importorskip("torch")
    return per_thread(tuple(int(p) for p in torch.__version__.split(".")[:2]))  # type: ignore[arg-type]


@pytest.mark.slow  # end to end: `pytest -m slow`
@pytest.mark.timeout(240)
def test_a_switch_set_once_in_main_is_reported_for_each_worker_it_did_not_reach(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "-f", "json", "-o", out, "--", sys.executable, program("settings_trainer.py"), "main",
               timeout=220)
    shown = json.loads(proc.stdout.strip().splitlines()[-1])
    doc = json.loads(out.read_text(encoding="utf-8"))
    gaps = [f for f in doc["findings"] if f["code"] == "DFD910"]
    if _per_thread_release():
        assert shown["reads"] == dict.fromkeys(WORKERS, False)
        assert all(shown["order"][w] == LAZY for w in WORKERS), shown  # the switch did nothing there
        assert sorted(f["evidence"]["thread"] for f in gaps) == sorted(WORKERS)
        assert {f["evidence"]["key"] for f in gaps} == {"torch._functorch.config.force_non_lazy_backward_lowering"}
        assert all(f["evidence"]["starter"] == "MainThread" for f in gaps)
    else:  # process-wide settings (2.11 and earlier): the assignment reached every worker, nothing to report
        assert all(shown["order"][w] == WITH_THE_FORWARD for w in WORKERS) and gaps == []


@pytest.mark.slow  # end to end: `pytest -m slow`
@pytest.mark.timeout(240)
def test_fix_non_lazy_backward_reaches_a_plain_thread_and_an_executor_worker(cli, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "run.json"
    proc = cli("run", "--fix", "non-lazy-backward", "-f", "json", "-o", out, "--", sys.executable,
               program("settings_trainer.py"), "none", timeout=220)
    shown = json.loads(proc.stdout.strip().splitlines()[-1])
    assert shown["reads"] == dict.fromkeys(WORKERS, True), shown
    assert all(shown["order"][w] == WITH_THE_FORWARD for w in WORKERS), shown
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["findings"] == [] and doc["problems"] == [], doc["findings"]
