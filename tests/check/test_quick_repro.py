"""check --repro asks the harness for the quick forced CPU run it promises, bounded by the check's timeout.

A recording runner stands in for the child processes (the real harness is tested with real children in the
repro tests; a real forced run costs 30-100 s here). The child it "starts" crashes at once, which the harness
must turn into a Problem, never an exception."""
from __future__ import annotations

import json

from dflash_doctor.check.quick_repro import QUICK_STEPS, quick_forced_repro
from dflash_doctor.repro.runner import ChildExit


class _CrashedChild:
    def poll(self, timeout_s):
        self.timeout_s = timeout_s
        return ChildExit(returncode=1, timed_out=False, seconds=0.01)

    def wait(self, timeout_s):
        return self.poll(timeout_s)

    def stop(self):
        return ChildExit(returncode=1, timed_out=False, seconds=0.01)

    def kill(self):
        pass


class _RecordingRunner:
    def __init__(self):
        self.specs, self.envs, self.children = [], [], []

    def start(self, spec_path, result_path, env, log_path, user_code=False):
        self.specs.append(json.loads(spec_path.read_text()))
        self.envs.append(env)
        log_path.write_text("child crashed on purpose\n")
        child = _CrashedChild()
        self.children.append(child)
        return child


def test_quick_repro_is_forced_on_the_cpu_with_a_warm_cache_and_bounded(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "warm-cache"))
    runner = _RecordingRunner()
    report = quick_forced_repro(timeout=42.0, runner=runner)
    # forced stress needs no single-thread control: the guard raises at the first compiled call
    [trial] = runner.specs
    assert (trial["phase"], trial["threads"], trial["devices"], trial["backward"], trial["steps"], trial["mode"]) == (
        "multi", 2, ["cpu"], False, QUICK_STEPS, "forced")
    assert trial["hang_after_s"] == 42.0 * 0.8
    assert runner.children[0].timeout_s == 42.0
    assert runner.envs[0]["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "warm-cache")
    assert report.command == "repro" and report.findings == []
    assert report.facts["verdict"] is None and report.exit_code_override == 3
    assert [p.subject for p in report.problems] == ["forced trial 1 (none)", "repro"]
    assert "exited with status 1 without a result" in report.problems[0].reason
