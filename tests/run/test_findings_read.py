"""What a person reads of a `run` finding: every death and FX error once each, each at the user's own line, and
laid out for 80 columns (real torch, real threads, real `run`)."""
from __future__ import annotations

import json
import sys
import threading

import pytest

from tests.run.helpers import program


def _line_of(script: str, text: str) -> int:
    source = open(program(script)).read().splitlines()
    return next(number for number, line in enumerate(source, 1) if text in line)


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(200)
def test_a_thread_that_survives_the_fx_error_and_dies_of_the_patcher_race_is_reported_for_both(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "-f", "json", "-o", out, "--", sys.executable, program("retrying_worker.py"), timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    findings = json.loads(out.read_text())["findings"]
    assert sorted((f["code"], f["evidence"]["worker"]) for f in findings) == [("DFD901", "worker-0"),
                                                                             ("DFD905", "worker-0")]
    trace_line = _line_of("retrying_worker.py", "torch.fx.symbolic_trace(Probe())")
    for finding in findings:  # both point at the monitor's line that started the trace: the line to change
        assert finding["path"].endswith("retrying_worker.py") and finding["line"] == trace_line, finding
    fx, = [f for f in findings if f["code"] == "DFD901"]
    assert "retrying_worker.py" in fx["evidence"]["victim_at"] and " in work" in fx["evidence"]["victim_at"]


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(200)
def test_a_finding_reads_at_80_columns_facts_first_fix_as_a_list(cli):
    proc = cli("run", "--", sys.executable, program("graph_inspector.py"), env={"COLUMNS": "80"}, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    rule = next(index for index, line in enumerate(lines) if line.endswith("DFD905 run-fx-patcher-race"))
    if lines[rule] == "DFD905 run-fx-patcher-race":  # a location too long for the line stands alone above it
        rule -= 1
    report = [line for line in lines[rule:] if not line.startswith("run")]
    assert "graph_inspector.py:" in report[0]
    first = report[2] if report[1] == "DFD905 run-fx-patcher-race" else report[1]
    assert first.startswith("  worker-0 died of the FX patcher race at ")
    assert any(line.startswith("  to blame: graph-inspector") for line in report)
    fix = report.index("  fix:")
    assert report[fix + 1].startswith("    - ")
    for line in report:  # short lines; a longer one is a single path or command that is never broken
        assert len(line) <= 80 or " " not in line.strip()[6:], line
    words = {word for line in report for word in line.split()}
    assert "torch.fx.symbolic_trace(Probe())" in words  # the tracer's own line, quoted whole


@pytest.mark.timeout(120)
def test_the_holder_is_located_at_the_line_that_started_its_trace_not_in_the_tool():
    """A real recorder on real torch: the holder's stack when its trace began, taken by the holder itself."""
    import torch

    from dflash_doctor.runtime import recorder as flight
    from dflash_doctor.supervise.findings import findings_from_records
    from dflash_doctor.supervise.records import BlameRecord, ProcessRecord

    entered, release = threading.Event(), threading.Event()

    class Waits(torch.nn.Module):
        def forward(self, x):
            entered.set()
            release.wait(30)
            return x

    def hold():
        torch.fx.symbolic_trace(Waits())  # HOLDER LINE

    active = flight.install()
    try:
        holder = threading.Thread(target=hold, name="inspector")
        holder.start()
        entered.wait(30)
        blame = active.blame_for(RuntimeError(flight.FX_ERROR_PREFIX))
        release.set()
        holder.join(30)
    finally:
        flight.uninstall()
    record = ProcessRecord(pid=1, ppid=0, argv=("t.py",), rank=None, local_rank=None, torch_version="2.13.0",
                           fx_flag_thread_local=False, fixes=(), problems=(), events=(),
                           blames=(BlameRecord.from_dict(blame.to_dict()),), hang=None, deaths=(), ended="exit",
                           started_at=0.0)
    finding, = findings_from_records([record])
    source = open(__file__).read().splitlines()
    assert finding.path == __file__ and "# HOLDER LINE" in source[finding.line - 1]
    assert "dflash_doctor" not in finding.message
    assert finding.evidence["victim_at"].startswith(__file__)
