"""`dflash-doctor run -- COMMAND` on real programs: real torch on the CPU, real compiles, threads, processes and
signals. Each program lives in tests/run/programs and never imports dflash_doctor."""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from dflash_doctor import mitigations as registry
from tests.run.helpers import gone, program, read_line_with, start_cli


def _report(path):
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(240)
def test_forced_leak_names_the_victim_and_the_holder_with_its_stack(cli, tmp_path):
    out, trace = tmp_path / "run.json", tmp_path / "trace.json"
    proc = cli("run", "--expect", "clean", "-f", "json", "-o", out, "--trace", trace, "--",
               sys.executable, program("fx_leak_trainer.py"), timeout=220)
    # the command's stdout is the command's alone; --expect clean turns its exit 0 into 1 because of the finding
    assert proc.stdout.startswith('{"drafter-0": "error: Detected that you are using FX'), proc.stdout
    assert proc.stdout.count("\n") == 1
    assert proc.returncode == 1, proc.stderr
    doc = _report(out)
    assert [f["code"] for f in doc["findings"]] == ["DFD901"]
    evidence = doc["findings"][0]["evidence"]
    assert (evidence["worker"], evidence["holder"], evidence["blame_kind"]) == ("drafter-0", "fx-holder",
                                                                                 "fx-flag-leak")
    assert any("fx_leak_trainer.py" in line and " in forward" in line for line in evidence["holder_stack"])
    assert "fx_leak_trainer.py" in doc["findings"][0]["message"]
    assert "--fix threadlocal-flag" in evidence["next"]
    assert doc["facts"]["trials"][0]["exit_code"] == 0
    names = {e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["name"] == "thread_name"}
    assert {"drafter-0", "fx-holder"} <= names


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(240)
def test_fix_threadlocal_flag_stops_the_forced_leak(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "--fix", "threadlocal-flag", "--no-baseline", "--expect", "clean", "-f", "json", "-o", out, "--",
               sys.executable, program("fx_leak_trainer.py"), timeout=220)
    assert json.loads(proc.stdout) == {"drafter-0": "ok"}, proc.stderr
    assert proc.returncode == 0, proc.stderr
    doc = _report(out)
    assert doc["findings"] == [] and doc["problems"] == []
    assert doc["facts"]["fixes"] == ["threadlocal-flag"]


@pytest.mark.parametrize("entry", [m for m in registry.REGISTRY if not m.applies_without_code_change],
                         ids=lambda m: m.name)
def test_a_fix_that_needs_the_users_code_is_refused_with_how_to_apply_it(cli, entry):
    proc = cli("run", "--fix", entry.name, "--", sys.executable, "-c", "print('never')", timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and entry.api in lines[0], proc.stderr


def test_the_commands_exit_code_and_stdout_pass_through(cli):
    proc = cli("run", "--", sys.executable, "-c", "print('hello'); import sys; sys.exit(7)", timeout=60)
    assert (proc.returncode, proc.stdout) == (7, "hello\n"), proc.stderr


def test_the_users_import_path_sitecustomize_and_lazy_torch_are_untouched(cli, tmp_path):
    import os
    import subprocess

    from tests.conftest import REPO

    user_site = tmp_path / "user-site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
    script = ("import json, os, sys; print(json.dumps([sys.path, 'torch' in sys.modules, "
              "os.environ.get('USER_SITECUSTOMIZE'), os.getcwd(), sys.argv]))")
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{user_site}"}
    plain = subprocess.run([sys.executable, "-c", script, "a b"], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path, env={**os.environ, **env})
    under = cli("run", "--", sys.executable, "-c", script, "a b", cwd=tmp_path, env=env, timeout=60)
    assert under.returncode == 0, under.stderr
    assert json.loads(under.stdout) == json.loads(plain.stdout)
    assert json.loads(under.stdout)[1:] == [False, "ran", str(tmp_path), ["-c", "a b"]]


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(90)
def test_a_lock_order_deadlock_is_named_and_killed_on_request(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "--on-hang", "kill", "-f", "json", "-o", out, "--", sys.executable,
               program("lock_cycle.py"), timeout=80)
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    assert "DFD903 live-lock-deadlock" in proc.stderr and "--on-hang kill" in proc.stderr
    finding, = _report(out)["findings"]
    assert finding["code"] == "DFD903"
    assert sorted(finding["evidence"]["threads"]) == ["loader", "trainer"]
    assert any("LOAD_LOCK" in step and "STEP_LOCK" in step for step in finding["evidence"]["chain"])


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(90)
def test_on_hang_report_keeps_the_run_alive_until_sigterm(tmp_path):
    proc = start_cli("run", "-f", "json", "-o", tmp_path / "run.json", "--", sys.executable,
                     program("lock_cycle.py"))
    try:
        line = read_line_with(proc.stderr, "DFD903")
        assert "live-lock-deadlock" in line
        assert "kept alive" in proc.stderr.readline()
        assert proc.poll() is None  # still running: the user decides
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert _report(tmp_path / "run.json")["facts"]["trials"][0]["signals_forwarded"] == ["SIGTERM"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sent, marker, code", [(signal.SIGTERM, "SIGTERM", 143), (signal.SIGINT, "SIGINT", 130)])
def test_signals_reach_the_command_and_no_orphan_is_left(tmp_path, sent, marker, code):
    seen = tmp_path / "seen.txt"
    proc = start_cli("run", "--", sys.executable, program("signals_child.py"), seen)
    try:
        child, grandchild = map(int, read_line_with(proc.stdout, "pids").split()[1:])
        proc.send_signal(sent)
        assert proc.wait(60) == code, proc.stderr.read()
    finally:
        proc.kill()
    assert seen.read_text() == marker
    assert gone(child) and gone(grandchild)


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(300)
def test_torchrun_gives_one_report_naming_each_rank(cli, tmp_path):
    out, trace = tmp_path / "run.json", tmp_path / "trace.json"
    proc = cli("run", "-f", "json", "-o", out, "--trace", trace, "--", sys.executable, "-m",
               "torch.distributed.run", "--standalone", "--nproc-per-node", "2", program("torchrun_ranks.py"),
               timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes = sorted(json.loads(line)["rank"] for line in proc.stdout.splitlines() if line.startswith("{"))
    assert outcomes == [0, 1]
    doc = _report(out)
    finding, = doc["findings"]
    assert finding["code"] == "DFD901" and finding["evidence"]["rank"] == 1
    assert (finding["evidence"]["worker"], finding["evidence"]["holder"]) == ("drafter-1", "fx-holder")
    assert "rank 1" in finding["message"]
    ranks = sorted(p["rank"] for p in doc["facts"]["trials"][0]["processes"] if p["rank"] is not None)
    assert ranks == [0, 1]
    for rank in (0, 1):
        rows = json.loads((tmp_path / f"trace.rank{rank}.json").read_text())["traceEvents"]
        assert any(e["name"] == "process_name" and f"rank {rank}" in e["args"]["name"] for e in rows)


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(120)
def test_a_per_thread_fix_is_entered_by_every_thread_started_after_torch(tmp_path):
    import os
    import subprocess

    from tests.conftest import REPO

    proc = subprocess.run([sys.executable, program("thread_fix_probe.py")], capture_output=True, text=True,
                          timeout=100, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"early": False, "plain": True, "subclass": True, "main": True}


def test_trials_give_the_rate_and_the_session_folder_goes_unless_kept(cli, tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = tmp_path / "run.json"
    # a process that starts a thread (or imports torch) is watched and recorded; one that does neither is not
    # (the bootstrap starts the agent only then: docs/run.md, "How the tool gets into the user's processes")
    threaded = "import threading; t = threading.Thread(target=print, args=('step',)); t.start(); t.join()"
    proc = cli("run", "--trials", "2", "-f", "json", "-o", out, "--", sys.executable, "-c", threaded,
               env={"TMPDIR": str(scratch)}, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "step\nstep\n"), proc.stderr
    progress = [line.split(" (")[0] for line in proc.stderr.splitlines() if line.startswith("dflash-doctor: trial")]
    assert progress == ["dflash-doctor: trial 1/2: exit 0, no findings", "dflash-doctor: trial 2/2: exit 0, no findings"]
    facts = _report(out)["facts"]
    assert facts["rate"] == {"trials": 2, "with_findings": 0, "exit_nonzero": 0}
    assert [len(t["processes"]) for t in facts["trials"]] == [1, 1]
    assert list(scratch.iterdir()) == []
    kept = cli("run", "--keep", "--", sys.executable, "-c", threaded, env={"TMPDIR": str(scratch)}, timeout=60)
    folder, = scratch.iterdir()
    assert f"session kept in {folder}" in kept.stderr
    assert len(list(folder.glob("proc-*.json"))) == 1


def test_a_command_that_does_not_exist_is_one_line(cli):
    proc = cli("run", "--", "no-such-command-here", timeout=60)
    assert proc.returncode == 127  # the shell's code for it
    assert proc.stderr.strip().splitlines() == ["dflash-doctor: error: command not found: no-such-command-here"]


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(90)
def test_sarif_of_a_run_validates_and_points_at_the_users_line(cli, tmp_path):
    from tests.render.sarif_schema import assert_valid_sarif

    out = tmp_path / "run.sarif"
    proc = cli("run", "--on-hang", "kill", "-f", "sarif", "-o", out, "--", sys.executable, program("lock_cycle.py"),
               timeout=80)
    assert proc.returncode == 137, proc.stderr
    document = json.loads(out.read_text())
    assert_valid_sarif(document)
    result, = document["runs"][0]["results"]
    location = result["locations"][0]["physicalLocation"]
    assert result["ruleId"] == "DFD903"
    assert location["artifactLocation"]["uri"] == "tests/run/programs/lock_cycle.py"
    source = Path(program("lock_cycle.py")).read_text().splitlines()
    waits = {number for number, line in enumerate(source, 1) if line.startswith("        with ")}
    assert len(waits) == 2  # the inner `with` of each thread: where it waits for the other's lock
    assert location["region"]["startLine"] in waits


def test_cache_cold_gives_each_trial_a_fresh_inductor_cache_and_removes_it(cli, tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    script = "import os; print(os.environ['TORCHINDUCTOR_CACHE_DIR'])"
    proc = cli("run", "--cache", "cold", "--trials", "2", "--", sys.executable, "-c", script,
               env={"TMPDIR": str(scratch), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "warm")}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.split()
    assert first != second and all(path.startswith(str(scratch)) for path in (first, second))
    assert list(scratch.iterdir()) == []
    warm = cli("run", "--", sys.executable, "-c", script, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "warm")},
               timeout=60)
    assert warm.stdout.strip() == str(tmp_path / "warm")  # --cache warm (the default) leaves the user's as it is


def _graph_inspector_line(text: str) -> int:
    source = Path(program("graph_inspector.py")).read_text().splitlines()
    return next(number for number, line in enumerate(source, 1) if text in line)


@pytest.mark.timeout(120)
def test_a_thread_killed_by_the_patcher_race_is_named_with_the_tracing_thread_despite_its_own_excepthook(
        cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "--expect", "clean", "-f", "json", "-o", out, "--", sys.executable,
               program("graph_inspector.py"), timeout=110)
    assert "Exception in thread worker-0: NameError" in proc.stderr  # the trainer's own logger still logs it
    assert proc.returncode == 1, proc.stderr  # the trainer exits 0; --expect clean makes the finding count
    finding, = _report(out)["findings"]
    evidence = finding["evidence"]
    assert finding["code"] == "DFD905"
    assert (evidence["worker"], evidence["error_type"], evidence["tracing"]) == (
        "worker-0", "NameError", ["graph-inspector"])
    assert finding["path"].endswith("graph_inspector.py")
    assert finding["line"] == _graph_inspector_line("torch.fx.symbolic_trace(Probe())")  # the line to change
    assert "isolate-fx-patches" in evidence["next"]


@pytest.mark.timeout(120)
def test_isolate_fx_patches_under_run_lets_that_worker_live(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "--fix", "isolate-fx-patches", "--no-baseline", "--expect", "clean", "-f", "json", "-o", out,
               "--", sys.executable, program("graph_inspector.py"), timeout=110)
    assert proc.returncode == 0, proc.stderr
    assert "worker: step=1" in proc.stderr and _report(out)["findings"] == []


@pytest.mark.timeout(120)
def test_any_other_thread_death_is_reported_with_its_traceback(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "-f", "json", "-o", out, "--", sys.executable, program("graph_inspector.py"), "--die",
               timeout=110)
    assert proc.returncode == 0, proc.stderr  # the command's own exit code
    finding, = _report(out)["findings"]
    assert finding["code"] == "DFD906" and finding["evidence"]["error_type"] == "KeyError"
    assert finding["line"] == _graph_inspector_line('batch["input_ids"]')


@pytest.mark.timeout(120)
def test_a_pool_workers_patcher_race_re_raised_in_the_main_thread_is_named_too(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "-f", "json", "-o", out, "--", sys.executable, program("pool_inspector.py"), timeout=110)
    assert proc.returncode == 1, proc.stderr  # the trainer's own exit: future.result() raised in the main thread
    finding, = _report(out)["findings"]
    assert finding["code"] == "DFD905" and finding["evidence"]["worker"] == "MainThread"
    assert finding["evidence"]["last_tracer"] == "MainThread" and "re-raised here" in finding["message"]
