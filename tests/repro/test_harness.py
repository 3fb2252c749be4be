"""The harness's bookkeeping with a fake process runner (the real one is exercised by test_cli_repro.py): the
matrix rows, trials and reproduction rate, the `processes` layout, and harness failures."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor.repro.harness import EXIT_HARNESS_FAILURE, run_repro, trace_phases
from dflash_doctor.repro.runner import ChildExit
from dflash_doctor.repro.spec import MATRIX, ReproSpec

FX = "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function."


class FakeChild:
    def __init__(self, result_path: Path, result) -> None:
        self.result_path, self.result = result_path, result

    def wait(self, timeout_s):
        if self.result is not None:
            self.result_path.write_text(json.dumps(self.result))
        return ChildExit(0 if self.result is not None else -9, self.result is None, 1.0)

    def stop(self):
        return self.wait(0)


class FakeRunner:
    """Decides each child's result from its spec with `behaviour(spec) -> result dict or None (hang)`."""

    def __init__(self, behaviour) -> None:
        self.behaviour = behaviour
        self.specs = []

    def start(self, spec_path, result_path, env, log_path):
        spec = json.loads(Path(spec_path).read_text())
        self.specs.append(spec)
        return FakeChild(Path(result_path), self.behaviour(spec))


def ok(spec, steps=2):
    return {"phase": spec["phase"], "outcome": "ok", "seconds": 1.0, "run_s": 0.5, "torch_version": "2.13.0+cpu",
            "threads": [{"name": n, "outcome": "ok", "error": None, "steps": steps} for n in spec["thread_names"]],
            "events": [{"t": 0.1, "thread": n, "tid": i, "kind": "step", "phase": "I", "detail": {}}
                       for i, n in enumerate(spec["thread_names"])]}


def leak(spec):
    result = ok(spec)
    result.update(outcome="error", threads=[{"name": n, "outcome": "error", "error": FX, "steps": 0}
                                            for n in spec["thread_names"]],
                  blame=[{"victim": n, "holder": "fx-holder", "at_s": 0.2, "kind": "fx-flag-leak"}
                         for n in spec["thread_names"]])
    return result


def shim_fixes_it(spec):
    if spec["phase"] == "single" or "threadlocal-flag" in spec["mitigation"] or "global-lock" in spec["mitigation"]:
        return ok(spec)
    return leak(spec)


def test_the_matrix_has_one_row_per_mitigation_and_the_headline_is_the_requested_one(tmp_path):
    runner = FakeRunner(shim_fixes_it)
    report = run_repro(ReproSpec(mode="forced"), matrix=True, runner=runner, workdir=tmp_path)
    facts = report.facts
    rows = {row["mitigation"]: (row["verdict"], row["outcome"], row["kind"]) for row in facts["matrix"]}
    assert list(rows) == [",".join(m) for m in MATRIX]
    assert rows["none"] == ("reproduced", "error", "fx-flag-leak")
    assert rows["global-lock"] == rows["threadlocal-flag"] == rows["threadlocal-flag,non-lazy-backward"] == (
        "not-reproduced", "ok", None)
    assert (facts["verdict"], facts["kind"], report.exit_code_override) == ("reproduced", "fx-flag-leak", 1)
    assert [s["phase"] for s in runner.specs].count("single") == 1  # one control for the whole matrix
    assert next(r for r in facts["matrix"] if r["mitigation"] == "global-lock")["steps_per_s"] == 12.0
    assert list(tmp_path.iterdir()) == []  # the run's scratch folder is gone


def test_trials_give_a_rate_and_the_first_reproducing_trial_is_reported(tmp_path):
    outcomes = iter([ok, leak, ok])

    def behaviour(spec):
        return ok(spec) if spec["phase"] == "single" else next(outcomes)(spec)

    report = run_repro(ReproSpec(trials=3), runner=FakeRunner(behaviour), workdir=tmp_path)
    facts = report.facts
    assert [t["kind"] for t in facts["trials"]] == [None, "fx-flag-leak", None]
    assert facts["reproduction_rate"] == pytest.approx(1 / 3, abs=1e-3)
    assert (facts["verdict"], facts["multi_thread"]["outcome"]) == ("reproduced", "error")


def test_processes_run_one_child_per_worker_plus_a_disturbance_child(tmp_path):
    runner = FakeRunner(ok)
    report = run_repro(ReproSpec(threads=3, mode="stuck", mitigation=("processes",), shapes="per-thread",
                                 devices=("cuda:0", "cuda:1")), runner=runner, workdir=tmp_path)
    multi_specs = [s for s in runner.specs if s["phase"] == "multi"]
    assert [(s["thread_names"], s["shape_indices"], s["devices"], s["mode"]) for s in multi_specs] == [
        (["drafter-0"], [0], ["cuda:0"], "natural"), (["drafter-1"], [1], ["cuda:1"], "natural"),
        (["drafter-2"], [2], ["cuda:0"], "natural")]
    assert [s["mode"] for s in runner.specs if s["phase"] == "disturb"] == ["stuck"]
    assert report.facts["verdict"] == "not-reproduced" and report.exit_code_override == 0
    phases = trace_phases(report.facts)
    assert [name for name, _ in phases] == ["single-thread", "process drafter-0", "process drafter-1",
                                            "process drafter-2"]


def test_a_failing_single_thread_control_is_a_harness_failure(tmp_path):
    def behaviour(spec):
        result = ok(spec)
        result.update(outcome="error", threads=[{"name": "drafter-0", "outcome": "error", "steps": 0,
                                                 "error": "NotImplementedError: no CPU backward"}])
        return result

    report = run_repro(ReproSpec(), runner=FakeRunner(behaviour), workdir=tmp_path)
    assert report.exit_code_override == EXIT_HARNESS_FAILURE
    assert report.facts["multi_thread"] is None and report.facts["verdict"] == "not-reproduced"
    assert [p.subject for p in report.problems] == ["single-thread phase"]
    assert "NotImplementedError: no CPU backward" in report.problems[0].reason


def test_a_shim_that_could_not_be_installed_is_a_harness_failure(tmp_path):
    def behaviour(spec):
        result = ok(spec)
        result["problems"] = [{"subject": "threadlocal-flag", "reason": "unknown layout", "hint": "h"}]
        return result

    report = run_repro(ReproSpec(mitigation=("threadlocal-flag",)), runner=FakeRunner(behaviour), workdir=tmp_path)
    assert report.exit_code_override == EXIT_HARNESS_FAILURE
    assert {p.subject for p in report.problems} == {"threadlocal-flag"}


def test_a_child_killed_at_the_timeout_without_a_stack_dump_gives_no_verdict(tmp_path):
    # No dump means the child kept showing progress (it re-arms its faulthandler while it does): too slow, not hung.
    def behaviour(spec):
        return ok(spec) if spec["phase"] == "single" else None

    report = run_repro(ReproSpec(timeout_s=100.0), runner=FakeRunner(behaviour), workdir=tmp_path)
    facts = report.facts
    assert facts["multi_thread"]["outcome"] == "hung"
    assert [t["outcome"] for t in facts["multi_thread"]["threads"]] == ["hung"] * 3
    assert (facts["verdict"], facts["kind"], report.findings) == ("not-reproduced", None, [])
    assert report.exit_code_override == EXIT_HARNESS_FAILURE
    [problem] = report.problems
    assert problem.subject == "3-thread phase (none)"
    assert problem.reason == "still making progress when --timeout (100 s) ended it: no verdict"
