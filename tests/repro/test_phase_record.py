"""The phase record's codec (repro/phase_record.py): what a real phase child writes reads back whole, and what is
not a record of this version (a field missing or renamed, another version, a set-up key it has no field for) is
refused by name, and reaches the user as a trial without a verdict, never as a default or a traceback."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_doctor import mitigations as registry
from dflash_doctor.outcomes import ThreadOutcome
from dflash_doctor.repro import phase_record
from dflash_doctor.repro.classify import phase_facts
from dflash_doctor.repro.harness import EXIT_HARNESS_FAILURE
from dflash_doctor.repro.phase_record import PhaseRecordError, SetupReport
from dflash_doctor.repro.runner import ChildExit, read_phase_result, write_spec
from dflash_doctor.repro.spec import PhaseSpec, ReproSpec
from tests.repro.test_harness import EVERYTHING_RUNS, FakeRunner, ok

pytest.importorskip("torch")


def _spec(phase: str, mode: str, mitigation: list) -> PhaseSpec:
    workers = [] if phase == "disturb" else ["drafter-0", "drafter-1"]
    return PhaseSpec(phase=phase, threads=len(workers), devices=["cpu"], backward=False, checkpoint="none",
                     shape_indices=[0] * len(workers), steps=1, hang_after_s=30.0, mode=mode, mitigation=mitigation,
                     amplify_ms=0.0, preset="tiny", model=None, thread_names=workers, disturb_hold_s=0.0)


def _run_child(folder: Path, spec: PhaseSpec, timeout_s: float) -> Path:
    """A real phase child, started as the harness starts one, to its end; the path of what it wrote."""
    spec_path = write_spec(folder, spec)
    result = folder / "result.json"
    done = subprocess.run([sys.executable, "-m", "dflash_doctor.repro.child", str(spec_path), str(result)],
                          capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-2000:]
    return result


def _round_trips(path: Path) -> phase_record.PhaseRecord:
    """Reads what the child wrote, and checks that writing the record again gives the same document."""
    record = phase_record.read(path)
    assert json.loads(phase_record.encode(record)) == json.loads(path.read_bytes())
    assert phase_record.decode(phase_record.encode(record)) == record
    return record


@pytest.mark.timeout(120)
def test_a_real_disturbance_childs_record_reads_back_whole(tmp_path):
    """The `processes` disturber alone (no compile): the set-up report of a real mitigation and the stress's
    words cross the process boundary typed."""
    record = _round_trips(_run_child(tmp_path, _spec("disturb", "forced", ["non-lazy-backward"]), 100))
    assert (record.phase, record.outcome, record.threads) == ("disturb", ThreadOutcome.OK, ())
    assert record.setup.non_lazy_backward_was is False  # the set-up hook's own report, typed
    assert record.disturbance and "FX flag" in record.disturbance
    assert record.torch_version and record.pid and record.python == sys.version.split()[0]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_real_forced_trials_record_reads_back_whole_with_its_blame_and_events(tmp_path):
    """A forced trial's two workers meet the held FX flag: threads, blame with frames, events and the
    threads' names all cross typed, and the facts read from them are what the report shows."""
    result = _run_child(tmp_path, _spec("multi", "forced", []), 200)
    record = _round_trips(result)
    assert record.outcome == ThreadOutcome.ERROR and {t.name for t in record.threads} == {"drafter-0", "drafter-1"}
    assert all(t.autograd_multithreading is not None and t.switches == {} for t in record.threads)
    assert record.blame and all(b.holder for b in record.blame) and record.blame[0].victim_stack
    assert any(e.kind == "fx-trace" for e in record.events)
    names = phase_record.read_thread_names(tmp_path / "threads.json")
    assert sorted(names.values()) == ["drafter-0", "drafter-1"]
    facts = phase_facts(record)
    assert [t["outcome"] for t in facts["threads"]] == ["error", "error"] and facts["disturbance"]


def _document() -> dict:
    return json.loads(phase_record.encode(ok({"phase": "multi", "thread_names": ["drafter-0"]})))


@pytest.mark.parametrize("path", [("outcome",), ("threads", 0, "steps"), ("setup",), ("setup", "shim"),
                                  ("events", 0, "detail"), ("timed_out_busy",)])
def test_a_missing_field_is_refused_by_name(path):
    document = _document()
    holder = document
    for key in path[:-1]:
        holder = holder[key]
    del holder[path[-1]]
    with pytest.raises(PhaseRecordError, match=repr(path[-1])):
        phase_record.decode(json.dumps(document).encode())


def test_a_renamed_field_is_refused_not_defaulted():
    document = _document()
    document["threads"][0]["step_count"] = document["threads"][0].pop("steps")
    with pytest.raises(PhaseRecordError, match="no field 'steps'"):
        phase_record.decode(json.dumps(document).encode())


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_another_version_is_refused(version):
    document = dict(_document(), version=version)
    with pytest.raises(PhaseRecordError, match="version"):
        phase_record.decode(json.dumps(document).encode())


@pytest.mark.parametrize("change", [{"outcome": "finished"}, {"seconds": "1.0"}, {"phase": "double"},
                                    {"run_s": float("inf")}])
def test_a_word_or_number_out_of_its_type_is_refused(change):
    document = dict(_document(), **change)
    with pytest.raises(PhaseRecordError):
        phase_record.decode(json.dumps(document).encode())


def test_half_a_file_and_deep_nesting_are_refused():
    data = phase_record.encode(ok({"phase": "multi", "thread_names": ["drafter-0"]}))
    with pytest.raises(PhaseRecordError, match="not JSON"):
        phase_record.decode(data[: len(data) // 2])
    with pytest.raises(PhaseRecordError, match="nested"):
        phase_record.decode(b"[" * 200 + b"]" * 200)


def test_a_set_up_hook_reporting_a_key_the_record_lacks_fails_in_the_child():
    with pytest.raises(PhaseRecordError, match="shim_state"):
        SetupReport.from_setups({"shim_state": "installed"})
    assert SetupReport.from_setups({"non_lazy_backward_was": True}).non_lazy_backward_was is True


def test_thread_names_round_trip_and_refuse_another_version(tmp_path):
    path = tmp_path / "threads.json"
    phase_record.write_thread_names(path, {140001: "drafter-0", 140002: "drafter-1"})
    assert phase_record.read_thread_names(path) == {140001: "drafter-0", 140002: "drafter-1"}
    path.write_text(json.dumps({"140001": "drafter-0"}))  # the unversioned layout of before
    with pytest.raises(PhaseRecordError, match="no field 'version'"):
        phase_record.read_thread_names(path)


def test_a_result_the_parent_cannot_read_is_a_crash_that_says_why(tmp_path):
    document = _document()
    del document["threads"][0]["outcome"]
    (tmp_path / "result.json").write_text(json.dumps(document))
    spec = _spec("multi", "natural", [])
    record = read_phase_result(tmp_path, ChildExit(0, False, 2.0), spec)
    assert record.outcome == ThreadOutcome.ERROR and record.crash
    assert "cannot read" in record.crash and "'outcome'" in record.crash
    assert [t.outcome for t in record.threads] == [ThreadOutcome.ERROR, ThreadOutcome.ERROR]


class _Renamed:
    """A child of another version: its result names a field differently."""

    def __init__(self, result_path: Path, document: dict) -> None:
        self.result_path, self.document = result_path, document

    def poll(self, timeout_s):
        self.result_path.write_text(json.dumps(self.document))
        return ChildExit(0, False, 1.0)

    def stop(self):
        return self.poll(0)

    def kill(self):
        pass


def test_a_trial_whose_result_cannot_be_read_has_no_verdict_and_says_so(tmp_path):
    from dflash_doctor.repro.harness import run_repro

    class RenamingRunner(FakeRunner):
        def start(self, spec_path, result_path, env, log_path, user_code=False):
            child = super().start(spec_path, result_path, env, log_path, user_code)
            document = json.loads(phase_record.encode(child.result))
            if document["phase"] == "multi":
                document = copy.deepcopy(document)
                document["state"] = document.pop("outcome")
            return _Renamed(Path(result_path), document)

    report = run_repro(ReproSpec(mode="natural", trials=1), runner=RenamingRunner(ok), workdir=tmp_path,
                       capabilities=EVERYTHING_RUNS, poll_s=0.001)
    assert report.facts["verdict"] is None and report.exit_code_override == EXIT_HARNESS_FAILURE
    [unreadable] = [p for p in report.problems if "cannot read" in p.reason]
    assert unreadable.subject == "natural trial 1 (none)" and "no field 'outcome'" in unreadable.reason


@pytest.mark.slow  # a fresh torch process per hook, as tests/test_mitigation_registry.py's: `pytest -m slow`
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", [entry.name for entry in registry.REGISTRY if entry.setup])
def test_what_each_set_up_hook_reports_crosses_to_the_parent(name, tmp_path):
    """Generated from the registry: each mitigation's real set-up, in a fresh process as in a phase child, reports
    only keys the record has a field for, and every one of them reads back in the parent."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from dflash_doctor import mitigations as registry\n"
        "from dflash_doctor.outcomes import ThreadOutcome\n"
        "from dflash_doctor.repro import phase_record\n"
        f"reported = registry.get({name!r}).setup()\n"
        "setup = phase_record.SetupReport.from_setups(reported)\n"
        "record = phase_record.PhaseRecord('single', ThreadOutcome.OK, 0.1, setup=setup)\n"
        "phase_record.write(Path(sys.argv[1]), record)\n"
        "print(','.join(sorted(reported)))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "result.json")], capture_output=True,
                          text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = done.stdout.strip().splitlines()
    # a set-up that reports nothing failed here with an IndexError: say what is wrong instead
    assert printed and printed[-1], f"{name}'s set-up reported nothing: a set-up hook returns what it did"
    keys = printed[-1].split(",")
    setup = phase_record.read(tmp_path / "result.json").setup
    assert keys and all(getattr(setup, key) is not None for key in keys), (keys, setup)


def test_the_phase_spec_a_child_is_given_is_as_strict_the_other_way():
    spec = _spec("multi", "forced", ["threadlocal-flag"])
    document = json.loads(json.dumps(spec.to_dict()))
    assert PhaseSpec.from_dict(document) == spec
    for change in ({"version": 2}, {"hang_after": document["hang_after_s"]}):
        with pytest.raises(ValueError, match="version|missing|unknown"):
            PhaseSpec.from_dict({**document, **change})
    dropped = dict(document)
    del dropped["timing_free"]  # a field with a default is no less required
    with pytest.raises(ValueError, match=r"missing \['timing_free'\]"):
        PhaseSpec.from_dict(dropped)
