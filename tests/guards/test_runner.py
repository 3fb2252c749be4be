"""Probe children: real processes that hang are killed at their timeout; crashes and garbage become errors."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from dflash_doctor.children import python_argv
from dflash_doctor.guards.host_document import HostDocument, HostSeconds, ProbeResult, encode
from dflash_doctor.guards.isolation import run_forked
from dflash_doctor.guards.probes import PROBE_NAMES as NAMES
from dflash_doctor.guards.runner import ChildResult, host_argv, run_child, run_probes
from dflash_doctor.guards.state import LiveState
from dflash_doctor.outcomes import ProbeOutcome


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(30)
def test_a_hanging_child_and_its_own_children_are_killed_at_the_timeout():
    script = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "print(child.pid, flush=True)\n"
              "time.sleep(60)\n")
    began = time.monotonic()
    result = run_child([sys.executable, "-c", script], timeout=1.5)
    assert result.timed_out and result.returncode == -signal.SIGKILL
    assert time.monotonic() - began < 10
    grandchild = int(result.stdout.split()[0])
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(30)
def test_a_hanging_probe_host_reports_every_probe_as_error():
    def sleeping_host(argv, timeout):
        return run_child([sys.executable, "-c", "import time; time.sleep(60)"], timeout)

    run = run_probes(NAMES, timeout=1.0, runner=sleeping_host, fork=True)
    assert set(run.results) == set(NAMES) and run.state is None
    for result in run.results.values():
        assert result.outcome == ProbeOutcome.ERROR
        assert result.error.startswith("the probe process ran past ")
        assert result.error.endswith(" s and was killed")
        assert result.seconds < 10


@pytest.mark.timeout(30)
def test_forked_tasks_time_out_crash_or_report_each_on_its_own():
    def hangs():
        time.sleep(60)

    def fails():
        raise ValueError("no such probe state")

    tasks = {"hangs": hangs, "reports": lambda: ProbeResult(ProbeOutcome.NOT_REPRODUCED, detail="ran"),
             "dies": lambda: os._exit(3), "fails": fails}
    began = time.monotonic()
    results = run_forked(tasks, timeout=1.0)
    assert time.monotonic() - began < 5
    assert results["hangs"] == ProbeResult(ProbeOutcome.ERROR, 1.0,
                                           error="timed out after 1.0 s; the probe process was killed")
    reports = results["reports"]
    assert (reports.outcome, reports.detail, reports.error) == (ProbeOutcome.NOT_REPRODUCED, "ran", None)
    assert 0 <= reports.seconds < 1
    assert results["dies"] == ProbeResult(ProbeOutcome.ERROR, None,
                                          error="the probe process exited with status 3 without a result")
    assert results["fails"].outcome == ProbeOutcome.ERROR
    assert results["fails"].error == "ValueError: no such probe state"


def _host_result(stdout: str, returncode: int = 0, stderr: str = "") -> ChildResult:
    return ChildResult(returncode, stdout, stderr, 2.5)


@pytest.mark.parametrize("child, error", [
    (_host_result("", 1, "Traceback ...\nImportError: no torch\n"),
     "the probe process exited with status 1: ImportError: no torch"),
    (_host_result("warming up\n"), "the probe process printed no result"),
    (_host_result("warming up\n{not json\n", -9), "the probe process was killed by signal 9"),
    (_host_result("", -11), "the probe process was killed by signal 11"),
])
def test_a_host_without_a_result_makes_every_probe_an_error(child, error):
    run = run_probes(NAMES, timeout=5, runner=lambda argv, timeout: child, fork=True)
    assert run.results == dict.fromkeys(NAMES, ProbeResult(ProbeOutcome.ERROR, 2.5, error=error))
    assert run.state is None and run.seconds is None


def test_a_probe_missing_from_the_host_document_is_an_error():
    reported, *missing = NAMES
    state = LiveState({"error_on_nested_fx_trace": True, "force_compile_during_fx_trace": False}, False, 0)
    document = encode(HostDocument(state, {reported: ProbeResult(ProbeOutcome.REPRODUCED, 0.1, detail="seen")},
                                   HostSeconds(2.0, 2.4)))
    run = run_probes(NAMES, timeout=5, runner=lambda argv, timeout: _host_result("noise\n" + document), fork=True)
    assert run.results[reported] == ProbeResult(ProbeOutcome.REPRODUCED, 0.1, detail="seen")
    assert missing and {name: run.results[name].error for name in missing} == dict.fromkeys(
        missing, "the probe host reported nothing for this probe")
    assert run.state == state
    assert run.seconds == HostSeconds(2.0, 2.4)


def test_without_fork_each_probe_gets_its_own_host_and_the_timeout_plus_grace():
    calls = []

    def recording(argv, timeout):
        calls.append((list(argv), timeout))
        return _host_result("", 1)

    run_probes(NAMES, timeout=7, fx_flag="_flag", runner=recording, fork=False, python="py")
    assert sorted(calls) == sorted(
        (host_argv([name], 7, "_flag", "none", "py"), 10.0) for name in NAMES)
    argv = host_argv(["stuck_flag"], 7, "_flag", "none", "py")
    assert argv == python_argv("dflash_doctor.guards.probe_host", "--timeout", "7", "--isolation", "none",
                               "--fx-flag", "_flag", "stuck_flag", python="py")
    assert argv[:2] == ["py", "-c"]


@pytest.mark.timeout(120)
def test_a_real_host_without_fork_runs_its_probe_in_itself():
    run = run_probes(["stuck_flag"], timeout=90, fx_flag="_is_fx_tracing_flag", fork=False)
    assert run.results["stuck_flag"].outcome == ProbeOutcome.REPRODUCED, run.results
    assert "FX flag at rest: True" in run.results["stuck_flag"].detail
    assert run.state is not None and run.state.fx_flag_now is False


def test_the_probe_host_refuses_an_unknown_probe_before_importing_torch():
    result = run_child(host_argv(["stuck_flag", "bogus"], 5, None, "fork"), timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        f"python -m dflash_doctor.guards.probe_host: error: unknown probe(s) bogus; choose from {', '.join(NAMES)}")


@pytest.mark.timeout(120)
def test_the_fx_flag_name_is_asked_while_the_host_imports_torch_and_reaches_it():
    """guards reads the torch source beside the host's import: the name is asked for after the host started and
    before it said `imported`, and the host reads the flag with it (no name: fx_flag_now would be None)."""
    heard, asked = [], []

    def name_after_a_while():
        asked.append(list(heard))
        time.sleep(0.3)  # the source read
        return "_is_fx_tracing_flag"

    run = run_probes(["stuck_flag"], timeout=90, fork=False, fx_flag_from=name_after_a_while,
                     on_progress=lambda words: heard.append(list(words)))
    assert asked == [[]] and heard[0] == ["imported"]
    assert run.results["stuck_flag"].outcome == ProbeOutcome.REPRODUCED, run.results
    assert "FX flag at rest: True" in run.results["stuck_flag"].detail
    assert run.state is not None and run.state.fx_flag_now is False


@pytest.mark.timeout(60)
def test_a_failing_name_read_kills_the_hosts_and_reaches_the_caller():
    def broken():
        raise OSError("the torch source went away")

    began = time.monotonic()
    with pytest.raises(OSError, match="the torch source went away"):
        run_probes(NAMES, timeout=30, fork=True, fx_flag_from=broken)
    assert time.monotonic() - began < 20
    from dflash_doctor import children

    assert children.live() == []


@pytest.mark.timeout(60)
def test_a_host_whose_stdin_closes_before_the_name_says_so_and_exits_2():
    result = run_child(host_argv(["stuck_flag"], 30, None, "none", fx_flag_stdin=True), timeout=50)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines()[-1] == "probe host: stdin closed before the FX flag's name came"


def test_a_stand_in_runner_gets_the_name_in_the_argv():
    calls = []
    run_probes(["stuck_flag"], timeout=7, runner=lambda argv, timeout: calls.append(list(argv)) or _host_result(""),
               fork=False, python="py", fx_flag_from=lambda: "_flag")
    assert calls == [host_argv(["stuck_flag"], 7, "_flag", "none", "py")]
