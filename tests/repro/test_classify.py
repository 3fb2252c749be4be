"""Verdict, kind and blame from phase results (the typed records the children write, repro/phase_record.py), and
the parent's reading of a child that crashed or hung without reporting."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from dflash_doctor.outcomes import BlameKind, FailureKind, ThreadOutcome
from dflash_doctor.repro.classify import classify_phase, merge_process_results, phase_facts
from dflash_doctor.repro.phase_record import PhaseRecord, ThreadRecord, TracingThreadRecord
from dflash_doctor.repro.runner import ChildExit, ChildProcess, read_phase_result
from dflash_doctor.mitigations import parse as parse_mitigation
from dflash_doctor.repro.spec import PhaseSpec
from dflash_doctor.runtime.deadlock import HangDiagnosis
from dflash_doctor.runtime.recorder import Blame, Event
from tests.conftest import REPO

FX = "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function. This is..."
OK, ERROR, HUNG = ThreadOutcome.OK, ThreadOutcome.ERROR, ThreadOutcome.HUNG


def thread(name, outcome=OK, error=None, steps=1, **more):
    return ThreadRecord(name, outcome, error, steps, **more)


def phase(outcome, *threads, **more):
    return PhaseRecord(phase="multi", outcome=outcome, seconds=more.pop("seconds", 1.0), threads=threads, **more)


def blamed(victim, holder, kind):
    return Blame(victim, holder, 1.0, kind, FX)


def test_an_all_ok_phase_is_not_reproduced():
    assert classify_phase(phase(OK, thread("a"))) == (None, [])


def test_fx_errors_with_a_holder_are_a_leak_and_keep_the_blame():
    blame = blamed("a", "fx-holder", BlameKind.FX_FLAG_LEAK)
    result = phase(ERROR, thread("a", ERROR, FX, 0), blame=(blame,))
    assert classify_phase(result) == ("fx-flag-leak", [blame])


def test_fx_errors_after_a_stuck_exit_are_a_stuck_flag():
    result = phase(ERROR, thread("a", ERROR, FX, 0), blame=(blamed("a", "fx-trace-b", BlameKind.STUCK_FLAG),))
    assert classify_phase(result)[0] == "stuck-flag"


def test_other_errors_and_hangs_without_a_lock_cycle_are_other_errors():
    assert classify_phase(phase(ERROR, thread("a", ERROR, "KeyError: 'x'")))[0] == "other-error"
    no_cycle = HangDiagnosis(FailureKind.OTHER_ERROR, "no-cycle", ())
    assert classify_phase(phase(HUNG, hang=no_cycle))[0] == "other-error"
    cycle = HangDiagnosis(FailureKind.DEADLOCK, "lock-cycle", ("a waits for b", "b waits for a"))
    assert classify_phase(phase(HUNG, hang=cycle))[0] == "deadlock"


def test_phase_facts_keep_the_contract_keys_and_steps_per_second():
    facts = phase_facts(phase(OK, thread("a", steps=3, traceback="tb", seconds=0.4), thread("b", steps=2),
                              seconds=2.0, run_s=0.5))
    assert facts["threads"] == [{"name": "a", "outcome": "ok", "error": None, "steps": 3},
                                {"name": "b", "outcome": "ok", "error": None, "steps": 2}]
    assert (facts["outcome"], facts["seconds"], facts["steps_per_s"]) == ("ok", 2.0, 10.0)
    # the keys a child fills only sometimes are left out where it did not
    assert list(facts) == ["outcome", "seconds", "threads", "run_s", "steps_per_s", "events"]


def test_process_results_merge_to_the_worst_outcome():
    step = Event(0.0, "drafter-0", 1, "step", "I")
    merged = merge_process_results([
        phase(OK, thread("drafter-0"), run_s=1.0, events=(step,)),
        phase(ERROR, thread("drafter-1", ERROR, "boom", 0), run_s=2.0),
    ])
    assert merged.outcome == "error" and [t.name for t in merged.threads] == ["drafter-0", "drafter-1"]
    facts = phase_facts(merged)
    assert facts["run_s"] == 2.0 and facts["events"] == []
    assert facts["processes"][0] == {"threads": ["drafter-0"], "events": [step.to_dict()]}


def test_mitigations_parse_in_a_stable_order():
    assert parse_mitigation("non-lazy-backward,threadlocal-flag") == ("threadlocal-flag", "non-lazy-backward")
    assert parse_mitigation("none") == ()


def spec(names=("drafter-0",)):
    return PhaseSpec(phase="multi", threads=len(names), devices=["cpu"], backward=False, checkpoint="none",
                     shape_indices=[0] * len(names), steps=1, hang_after_s=1.0, mode="natural", mitigation=[],
                     amplify_ms=0.0, preset="tiny", model=None, thread_names=list(names))


def test_a_crashed_child_without_a_result_is_an_error_naming_the_signal(tmp_path):
    (tmp_path / "log.txt").write_text("Fatal Python error: Segmentation fault\n")
    result = read_phase_result(tmp_path, ChildExit(-signal.SIGSEGV, False, 3.0), spec())
    assert result.outcome == "error" and result.crash == "killed by signal SIGSEGV"
    assert result.threads == (ThreadRecord("drafter-0", ERROR, "child process killed by signal SIGSEGV", 0),)
    assert "Segmentation fault" in (result.log_tail or "")


HUNG_CHILD = '''
import sys, threading
from pathlib import Path
from dflash_doctor.repro.phase_record import write_thread_names
from dflash_doctor.runtime.watchdog import arm_faulthandler

out = Path(sys.argv[1])
lock_a, lock_b = threading.Lock(), threading.Lock()
both = threading.Barrier(2)

def take_ab():
    with lock_a:
        both.wait()
        with lock_b:
            pass

def take_ba():
    with lock_b:
        both.wait()
        with lock_a:
            pass

workers = [threading.Thread(target=take_ab, name="drafter-0"), threading.Thread(target=take_ba, name="drafter-1")]
for worker in workers:
    worker.start()
write_thread_names(out / "threads.json", {w.ident: w.name for w in workers})  # as the phase child does
handle = arm_faulthandler(out / "faulthandler.txt", 0.5)
for worker in workers:
    worker.join()
'''


@pytest.mark.timeout(60)
def test_a_child_that_never_reports_is_killed_and_its_faulthandler_dump_classified(tmp_path):
    script = tmp_path / "hung_child.py"
    script.write_text(HUNG_CHILD)
    log = open(tmp_path / "log.txt", "wb")
    popen = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=log, stderr=subprocess.STDOUT,
                             cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                             start_new_session=True)
    began = time.monotonic()
    exit = ChildProcess(popen, log, time.monotonic).wait(3.0)
    assert exit.timed_out and exit.returncode == -signal.SIGKILL and time.monotonic() - began < 15
    result = read_phase_result(tmp_path, exit, spec(("drafter-0", "drafter-1")))
    assert result.outcome == "hung" and not result.timed_out_busy and result.problems == ()
    assert [t.outcome for t in result.threads] == ["hung", "hung"]
    assert result.hang is not None and result.hang.cycle == "lock-cycle"
    assert set(result.hang.threads) == {"drafter-0", "drafter-1"}  # named from threads.json, not by ident
    assert json.dumps(phase_facts(result))  # what the parent reports stays JSON


# The errors a worker's compile printed under repro's foreign-trace stress on the 2-core box (torch 2.13): the
# tracer swapped nn.Module.__call__ while Dynamo built the compile's guards.
GUARD_BREAKS = ("InternalTorchDynamoError: AttributeError: 'builtin_function_or_method' object has no attribute "
                "'__closure__'\n",
                "InternalTorchDynamoError: TypeError: 'NoneType' object is not subscriptable\n",
                "AssertionError: Guard failed on the same frame it was created. This is a bug - please create an "
                "issue.")


@pytest.mark.parametrize("error", GUARD_BREAKS)
def test_a_compile_whose_guards_broke_beside_a_tracing_thread_is_the_patcher_race(error):
    tracer = TracingThreadRecord("fx-profiler", OK, None, 3)
    result = phase(ERROR, thread("a", ERROR, error, 0), tracing_thread=tracer)
    assert classify_phase(result)[0] == "fx-patcher-race"
    # without a thread that traced, the same words are not evidence of the race
    assert classify_phase(phase(ERROR, thread("a", ERROR, error, 0)))[0] == "other-error"


@pytest.mark.parametrize("error", GUARD_BREAKS)
def test_a_compile_whose_guards_broke_beside_the_forced_holders_trace_is_the_patcher_race(error):
    """The forced stress's holder keeps the FX flag up inside a real torch.fx trace, so it patches nn.Module as a
    profiler's trace does: beside it (the shim on, so no leak) a broken guard is the patcher race too."""
    events = (Event(0.1, "fx-holder", 2, "fx-trace", "B"), Event(0.2, "a", 1, "fx-trace", "B"))
    result = phase(ERROR, thread("a", ERROR, error, 0), events=events)
    assert classify_phase(result)[0] == "fx-patcher-race"
    # a worker's own traces (Dynamo's and AOT's, inside its compile) are not a trace beside it
    own = phase(ERROR, thread("a", ERROR, error, 0), events=events[1:])
    assert classify_phase(own)[0] == "other-error"


LINGERING_CHILD = '''
import sys, time
from pathlib import Path
from dflash_doctor.outcomes import ThreadOutcome
from dflash_doctor.repro import phase_record
out = Path(sys.argv[1])
# atomically, as the phase child writes it
phase_record.write(out / "result.json", phase_record.PhaseRecord("multi", ThreadOutcome.OK, 0.5))
time.sleep(60)  # an interpreter shutdown that takes its time (torch's atexit hooks, compile workers)
'''


@pytest.mark.timeout(60)
def test_a_child_whose_result_is_written_is_ended_without_waiting_for_its_shutdown(tmp_path):
    script = tmp_path / "lingering_child.py"
    script.write_text(LINGERING_CHILD)
    log = open(tmp_path / "log.txt", "wb")
    popen = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=log, stderr=subprocess.STDOUT,
                             cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                             start_new_session=True)
    child = ChildProcess(popen, log, time.monotonic, tmp_path / "result.json")
    began = time.monotonic()
    ended = None
    while ended is None and time.monotonic() - began < 30:
        ended = child.poll(timeout_s=300.0)
        time.sleep(0.01)
    assert ended is not None and not ended.timed_out
    assert time.monotonic() - began < 15  # not the 60 s of its shutdown
    assert popen.poll() is not None  # the process is gone, not left running
    assert read_phase_result(tmp_path, ended, spec(())).outcome == "ok"


@pytest.mark.timeout(60)
def test_without_a_result_file_a_running_child_is_left_alone(tmp_path):
    script = tmp_path / "slow_child.py"
    script.write_text("import time; time.sleep(60)\n")
    log = open(tmp_path / "log.txt", "wb")
    popen = subprocess.Popen([sys.executable, str(script)], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                             env={"PATH": "/usr/bin:/bin"}, start_new_session=True)
    child = ChildProcess(popen, log, time.monotonic, tmp_path / "result.json")
    try:
        time.sleep(0.5)
        assert child.poll(timeout_s=300.0) is None and popen.poll() is None
    finally:
        child.kill()


def test_a_cold_cache_keeps_the_compile_threads_share_of_trials_side_by_side(tmp_path):
    from dflash_doctor.repro.runner import child_env

    env = child_env(tmp_path, cold_cache=True, base={"PATH": "/usr/bin"}, compile_threads=4)
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "4"  # was dropped when the cache dirs were set
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor-cache")
    user_set = child_env(tmp_path, cold_cache=True, base={"TORCHINDUCTOR_COMPILE_THREADS": "1"}, compile_threads=4)
    assert user_set["TORCHINDUCTOR_COMPILE_THREADS"] == "1"  # the user's own setting wins
