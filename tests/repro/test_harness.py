"""The harness's bookkeeping with a fake process runner (the real one is exercised by test_cli_repro.py): the ladder
each kind of run climbs, the rate, fails / holds / inconclusive, the `processes` layout, and harness failures."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dflash_doctor import mitigations as registry
from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Problem
from dflash_doctor.hazards import Stress
from dflash_doctor.outcomes import BlameKind, FailureKind, ThreadOutcome
from dflash_doctor.repro import phase_record
from dflash_doctor.repro.capabilities import Capabilities
from dflash_doctor.repro.harness import EXIT_HARNESS_FAILURE, run_repro, trace_phases
from dflash_doctor.repro.phase_record import PhaseRecord, ThreadRecord
from dflash_doctor.repro.runner import ChildExit
from dflash_doctor.repro.spec import ReproSpec
from dflash_doctor.runtime.deadlock import HangDiagnosis
from dflash_doctor.runtime.recorder import Blame, Event

FX = "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function."
EVERYTHING_RUNS = Capabilities()


class FakeChild:
    def __init__(self, result_path: Path, result) -> None:
        self.result_path, self.result = result_path, result
        self.killed = False

    def poll(self, timeout_s):
        if self.result is not None:  # through the codec, as the phase child writes it
            phase_record.write(self.result_path, self.result)
        return ChildExit(0 if self.result is not None else -9, self.result is None, 1.0)

    def wait(self, timeout_s):
        return self.poll(timeout_s)

    def stop(self):
        return self.poll(0)

    def kill(self):
        self.killed = True


class FakeRunner:
    """Decides each child's result from its spec with `behaviour(spec) -> PhaseRecord or None (hang)`."""

    def __init__(self, behaviour) -> None:
        self.behaviour = behaviour
        self.specs = []

    def start(self, spec_path, result_path, env, log_path, user_code=False):
        spec = json.loads(Path(spec_path).read_text())
        spec["cache_dir"] = env.get("TORCHINDUCTOR_CACHE_DIR")  # where the child would have compiled
        spec["label"] = Path(spec_path).parent.name  # NNN-row-stress-tN[-procK]: the trial's stress
        self.specs.append(spec)
        return FakeChild(Path(result_path), self.behaviour(spec))

    def trials(self, mitigation=(), mode=None):
        return [s for s in self.specs if s["phase"] == "multi" and s["mitigation"] == list(mitigation)
                and (mode is None or s["mode"] == mode)]


def threads(spec, outcome=ThreadOutcome.OK, error=None, steps=0):
    return tuple(ThreadRecord(n, outcome, error, steps) for n in spec["thread_names"])


def ok(spec, steps=2):
    return PhaseRecord(phase=spec["phase"], outcome=ThreadOutcome.OK, seconds=1.0, run_s=0.5,
                       torch_version="2.13.0+cpu", threads=threads(spec, steps=steps),
                       events=tuple(Event(0.1, n, i, "step", "I") for i, n in enumerate(spec["thread_names"])))


def leak(spec):
    return replace(ok(spec), outcome=ThreadOutcome.ERROR, threads=threads(spec, ThreadOutcome.ERROR, FX),
                   blame=tuple(Blame(n, "fx-holder", 0.2, BlameKind.FX_FLAG_LEAK, FX) for n in spec["thread_names"]))


def deadlock(spec):
    return replace(ok(spec), outcome=ThreadOutcome.HUNG, threads=threads(spec, ThreadOutcome.HUNG),
                   hang=HangDiagnosis(FailureKind.DEADLOCK, "compile-lock-autograd", ("a", "b")))


def patcher_race(spec):
    return replace(ok(spec), outcome=ThreadOutcome.ERROR,
                   threads=threads(spec, ThreadOutcome.ERROR, "NameError: module is not installed as a submodule"))


def repro(spec: ReproSpec, behaviour, tmp_path, matrix=False, caps=EVERYTHING_RUNS):
    runner = FakeRunner(behaviour)
    report = run_repro(spec, matrix=matrix, runner=runner, workdir=tmp_path, capabilities=caps, poll_s=0.001)
    return report, runner


def like_the_h200(spec):
    """What the H200 showed: the baseline deadlocks naturally; threadlocal-flag alone deadlocks; non-lazy alone and
    the first-call lock leak the flag; the shim + non-lazy, warm-up, global lock and processes hold; single-threaded
    autograd leaks the flag when amplified unless the shim is on. A foreign trace (the 2.13 CPU runs) breaks every
    thread fix but isolate-fx-patches and the global lock (whose tracer takes the lock)."""
    mitigation, mode = set(spec["mitigation"]), spec["mode"]
    if spec["phase"] in ("single", "disturb") or spec["threads"] == 1:
        return ok(spec)
    if mode == "foreign-trace":
        return ok(spec) if mitigation & {"isolate-fx-patches", "global-lock"} else patcher_race(spec)
    concurrent = ({"threadlocal-flag", "non-lazy-backward"} <= mitigation
                  or {"threadlocal-flag", "single-thread-autograd"} <= mitigation)
    if concurrent or mitigation & {"warmup", "global-lock"}:
        return ok(spec)
    if "single-thread-autograd" in mitigation:
        return leak(spec) if mode == "amplified" else ok(spec)
    if mode in ("forced", "stuck"):
        return ok(spec) if "threadlocal-flag" in mitigation else leak(spec)
    if mitigation & {"non-lazy-backward", "first-call-lock"}:
        return leak(spec)
    return deadlock(spec)


def test_the_default_run_escalates_no_further_than_it_must_and_runs_every_trial_of_that_stress(tmp_path):
    report, runner = repro(ReproSpec(trials=3), like_the_h200, tmp_path)
    facts = report.facts
    assert (facts["verdict"], facts["kind"], facts["level"]) == ("reproduced", "deadlock", "natural")
    assert facts["levels"]["natural"] == {"ran": 3, "reproduced": 3, "kinds": {"deadlock": 3}}
    assert facts["levels"]["amplified"]["ran"] == 0 and facts["levels"]["forced"]["ran"] == 0
    assert facts["reproduction_rate"] == 1.0 and report.exit_code_override == 1
    assert [s["mode"] for s in runner.trials()] == ["natural"] * 3
    assert [s["phase"] for s in runner.specs].count("single") == 1


def test_the_ladder_climbs_to_the_first_stress_that_reproduces(tmp_path):
    def only_when_forced(spec):
        return leak(spec) if spec["phase"] == "multi" and spec["mode"] == "forced" else ok(spec)

    report, runner = repro(ReproSpec(trials=2), only_when_forced, tmp_path)
    facts = report.facts
    assert [s["mode"] for s in runner.trials()] == ["natural", "natural", "amplified", "forced"]
    assert (facts["verdict"], facts["level"], facts["kind"]) == ("reproduced", "forced", "fx-flag-leak")
    assert facts["levels"]["natural"] == {"ran": 2, "reproduced": 0, "kinds": {}}


def test_not_reproduced_anywhere_is_not_reproduced_with_the_counts(tmp_path):
    report, _ = repro(ReproSpec(trials=2), ok, tmp_path)
    facts = report.facts
    assert (facts["verdict"], facts["level"], report.exit_code_override) == ("not-reproduced", None, 0)
    assert {s: e["ran"] for s, e in facts["levels"].items()} == {"natural": 2, "amplified": 1, "forced": 1}
    assert facts["next_steps"][0].startswith("not reproduced at any stress that ran (natural 0/2, amplified 0/1, "
                                             "forced 0/1)")


def test_what_this_machine_cannot_show_is_skipped_and_no_control_runs_for_forced_alone(tmp_path):
    caps = Capabilities(skipped={Stress.NATURAL: "no backward", Stress.AMPLIFIED: "no backward"},
                        cannot_show=("no backward",))
    report, runner = repro(ReproSpec(), like_the_h200, tmp_path, caps=caps)
    assert [s["mode"] for s in runner.trials()] == ["forced"]
    assert [s["phase"] for s in runner.specs] == ["multi"]  # forced needs no single-thread control
    assert report.facts["single_thread"] is None and report.facts["level"] == "forced"
    assert report.facts["levels"]["natural"]["skipped"] == "no backward"


def test_a_pinned_mode_runs_even_what_the_machine_is_not_expected_to_show(tmp_path):
    caps = Capabilities(skipped={Stress.NATURAL: "no backward", Stress.AMPLIFIED: "no backward"})
    report, runner = repro(ReproSpec(mode="natural", trials=2), ok, tmp_path, caps=caps)
    assert [s["mode"] for s in runner.trials()] == ["natural", "natural"]
    assert report.facts["verdict"] == "not-reproduced"


def test_the_matrix_judges_every_row_against_one_baseline_like_the_h200(tmp_path):
    # one trial at a time, so "stops at its first reproduction" means no second trial started (with --jobs N,
    # up to N start together)
    report, runner = repro(ReproSpec(trials=2, jobs=1), like_the_h200, tmp_path, matrix=True)
    rows = {row["mitigation"]: row for row in report.facts["matrix"]}
    assert list(rows) == [registry.label(names) for names in registry.MATRIX]
    outcomes = {name: row["outcome"] for name, row in rows.items()}
    # what the H200 showed for the rows it ran (like_the_h200); a row the registry adds later ran on no H200, and
    # the fake treats it as no fix at all, so it fails
    measured = {
        "none": "reproduced", "first-call-lock": "fails", "global-lock": "holds", "warmup": "holds",
        "threadlocal-flag": "fails", "non-lazy-backward": "fails", "single-thread-autograd": "fails",
        "isolate-fx-patches": "fails", "processes": "holds", "threadlocal-flag,non-lazy-backward": "holds",
        "threadlocal-flag,single-thread-autograd": "holds"}
    assert {name: outcomes.get(name) for name in measured} == measured
    assert {name: outcome for name, outcome in outcomes.items() if name not in measured} == {
        name: "fails" for name in outcomes if name not in measured}
    # the fixes that claim the patcher race also face a foreign trace; the others do not
    assert rows["global-lock"]["stresses"]["foreign-trace"] == {"ran": 1, "reproduced": 0, "kinds": {}}
    assert "foreign-trace" not in rows["threadlocal-flag,non-lazy-backward"]["stresses"]
    assert rows["single-thread-autograd"]["kind"] == "fx-flag-leak"
    assert rows["isolate-fx-patches"]["kind"] == "deadlock"  # it stops the patcher race, not the deadlock
    assert rows["threadlocal-flag"]["kind"] == "deadlock" and rows["non-lazy-backward"]["kind"] == "fx-flag-leak"
    assert rows["threadlocal-flag,non-lazy-backward"]["stresses"] == {
        "natural": {"ran": 2, "reproduced": 0, "kinds": {}}, "amplified": {"ran": 1, "reproduced": 0, "kinds": {}},
        "forced": {"ran": 1, "reproduced": 0, "kinds": {}}, "stuck": {"ran": 1, "reproduced": 0, "kinds": {}}}
    assert rows["warmup"]["stresses"].keys() == {"natural", "amplified"}  # it claims no flag safety
    # a failing row stops at its first reproduction, and says how many of its planned trials it did not wait for
    assert len(runner.trials(("threadlocal-flag",))) == 1
    assert {stress: (t["ran"], t.get("stopped_early")) for stress, t in rows["threadlocal-flag"]["stresses"].items()
            } == {"natural": (1, 1), "amplified": (0, 1), "forced": (0, 1), "stuck": (0, 1)}
    from dflash_doctor.render.repro_view import stress_cells

    assert stress_cells(rows["threadlocal-flag"]["stresses"]).startswith("natural 1/1 deadlock +1 decided · amplified - +1")
    assert [s["phase"] for s in runner.specs].count("single") == 1
    assert report.facts["verdict"] == "reproduced" and report.exit_code_override == 1
    holds = next(step for step in report.facts["next_steps"] if step.startswith("holds: "))
    assert "global-lock" in holds and "first-call-lock" not in holds


@pytest.mark.parametrize("devices", [("cpu",), ("cuda:0",)])
def test_flag_held_trials_share_one_compile_cache_only_where_no_backward_can_deadlock(tmp_path, devices):
    report, runner = repro(ReproSpec(trials=2, devices=devices), like_the_h200, tmp_path, matrix=True)
    trials = [s for s in runner.specs if s["phase"] == "multi"]
    alone = [s["cache_dir"] for s in trials if "-processes-" in s["label"]]
    threads = [s for s in trials if "-processes-" not in s["label"]]
    held = [s["cache_dir"] for s in threads if "-forced-" in s["label"] or "-stuck-" in s["label"]]
    cold = [s["cache_dir"] for s in threads if not ("-forced-" in s["label"] or "-stuck-" in s["label"])]
    assert held and len(set(cold)) == len(cold)  # natural, amplified, foreign-trace: each its own cold cache
    # a worker alone in its process has no second thread to race with: every processes trial shares the cache,
    # with a backward too, and it is the one the flag-held trials share where they share one
    assert report.facts["shared_cache_fixes"] == ["processes"] and len(set(alone)) == 1
    assert not set(alone) & set(cold)
    if devices == ("cuda:0",):  # a backward: a compile's length can decide the deadlock, so every trial is cold
        assert report.facts["shared_cache"] == [] and len(set(held)) == len(held) and not set(held) & set(cold)
        assert not set(held) & set(alone)
    else:
        assert report.facts["shared_cache"] == ["forced", "stuck"]
        assert set(held) == set(alone) and not set(held) & set(cold)
    # what the rows report is the trials' own outcomes either way (the fake decides them from the stress alone)
    outcomes = {row["mitigation"]: row["outcome"] for row in report.facts["matrix"]}
    assert outcomes["threadlocal-flag,non-lazy-backward"] == "holds" and outcomes["none"] == "reproduced"


def test_a_warm_cache_shares_nothing_it_did_not_ask_for(tmp_path):
    report, runner = repro(ReproSpec(trials=2, cache="warm"), like_the_h200, tmp_path, matrix=True)
    assert report.facts["shared_cache"] == [] and report.facts["shared_cache_fixes"] == []


def test_nothing_is_held_against_a_baseline_that_never_reproduced(tmp_path):
    report, _ = repro(ReproSpec(trials=2), ok, tmp_path, matrix=True)
    outcomes = {row["mitigation"]: row["outcome"] for row in report.facts["matrix"]}
    assert outcomes.pop("none") == "not-reproduced"
    assert set(outcomes.values()) == {"inconclusive"}
    reason = next(r["reason"] for r in report.facts["matrix"] if r["mitigation"] == "warmup")
    assert "the baseline did not reproduce under it" in reason
    assert not any(step.startswith("holds") for step in report.facts["next_steps"])


def test_too_few_natural_trials_cannot_hold(tmp_path):
    report, _ = repro(ReproSpec(trials=1, mitigation=("global-lock",)), like_the_h200, tmp_path)
    assert report.facts["outcome"] == "inconclusive"
    assert "natural: 1 clean trial(s), 2 needed" in report.facts["outcome_reason"]
    assert report.facts["verdict"] == "not-reproduced" and report.exit_code_override == 0


def test_a_single_mitigation_run_is_judged_against_its_own_baseline(tmp_path):
    report, runner = repro(ReproSpec(trials=2, mitigation=("non-lazy-backward",)), like_the_h200, tmp_path)
    facts = report.facts
    assert (facts["outcome"], facts["verdict"], facts["kind"]) == ("fails", "reproduced", "fx-flag-leak")
    assert facts["next_steps"][0].startswith("--mitigation non-lazy-backward fails: fx-flag-leak under natural")
    assert any("pair it with threadlocal-flag" in step for step in facts["next_steps"])
    assert runner.trials(())  # the baseline ran to qualify it


def test_processes_run_one_child_per_worker_plus_a_disturbance_child(tmp_path):
    report, runner = repro(ReproSpec(threads=3, mode="stuck", mitigation=("processes",), shapes="per-thread",
                                     devices=("cuda:0", "cuda:1")), ok, tmp_path)
    workers = [s for s in runner.specs if s["phase"] == "multi" and s["threads"] == 1]
    assert [(s["thread_names"], s["shape_indices"], s["devices"], s["mode"]) for s in workers] == [
        (["drafter-0"], [0], ["cuda:0"], "natural"), (["drafter-1"], [1], ["cuda:1"], "natural"),
        (["drafter-2"], [2], ["cuda:0"], "natural")]
    assert [s["mode"] for s in runner.specs if s["phase"] == "disturb"] == ["stuck"]
    assert report.facts["verdict"] == "not-reproduced"
    phases = trace_phases(report.facts)
    assert [name for name, _ in phases] == ["single-thread", "process drafter-0", "process drafter-1",
                                            "process drafter-2"]


def test_a_failing_single_thread_control_is_a_harness_failure(tmp_path):
    def behaviour(spec):
        result = ok(spec)
        if spec["phase"] == "single":
            result = replace(result, outcome=ThreadOutcome.ERROR,
                             threads=threads(spec, ThreadOutcome.ERROR, "NotImplementedError: no CPU backward"))
        return result

    report, _ = repro(ReproSpec(jobs=1), behaviour, tmp_path)
    assert report.exit_code_override == EXIT_HARNESS_FAILURE
    assert report.facts["multi_thread"] is None and report.facts["verdict"] == "not-reproduced"
    assert [p.subject for p in report.problems] == ["single-thread phase"]
    assert "NotImplementedError: no CPU backward" in report.problems[0].reason


def test_a_mitigation_that_could_not_be_applied_is_a_harness_failure(tmp_path):
    def behaviour(spec):
        result = ok(spec)
        if "threadlocal-flag" in spec["mitigation"]:
            result = replace(result, problems=(Problem("threadlocal-flag", "unknown layout", "h"),))
        return result

    report, _ = repro(ReproSpec(mitigation=("threadlocal-flag",), mode="forced"), behaviour, tmp_path)
    assert report.exit_code_override == EXIT_HARNESS_FAILURE
    assert {p.subject for p in report.problems} == {"threadlocal-flag"}


def test_a_model_that_cannot_be_imported_is_one_usage_error(tmp_path):
    def behaviour(spec):
        return replace(ok(spec), outcome=ThreadOutcome.ERROR,
                       usage_error="--model m:f: cannot import m (No module named 'm')")

    with pytest.raises(UsageError, match="cannot import m"):
        repro(ReproSpec(), behaviour, tmp_path)
    assert list(tmp_path.iterdir()) == []  # the scratch folder is gone


def test_a_child_killed_at_the_timeout_without_a_stack_dump_gives_no_verdict(tmp_path):
    # No dump means the child kept showing progress (it re-arms its faulthandler while it does): too slow, not hung.
    def behaviour(spec):
        return ok(spec) if spec["phase"] == "single" else None

    report, _ = repro(ReproSpec(timeout_s=100.0, mode="natural", trials=1), behaviour, tmp_path)
    facts = report.facts
    assert (facts["verdict"], facts["kind"], report.findings) == (None, None, [])
    assert report.exit_code_override == EXIT_HARNESS_FAILURE
    reasons = [p.reason for p in report.problems]
    assert "still making progress when --timeout (100 s) ended it: no verdict" in reasons


class _TickingClock:
    """A run clock that advances one second each time the harness reads it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class _RunningChild(FakeChild):
    """A child that is still running when --max-time comes, unless its result is ready at once."""

    def poll(self, timeout_s):
        return super().poll(timeout_s) if self.result is not None else None


def _slow_after_the_baseline(spec):
    """The baseline reproduces at once; every mitigation's trial is still running at the limit."""
    if spec["phase"] == "single":
        return ok(spec)
    return like_the_h200(spec) if "-none-" in spec["label"] else None  # `processes` children run no mitigation


def test_max_time_keeps_a_verdict_found_in_time_and_never_calls_an_unfinished_row_held(tmp_path):
    runner = FakeRunner(_slow_after_the_baseline)
    runner_start = runner.start
    runner.start = lambda *a, **k: _RunningChild(runner_start(*a, **k).result_path, runner.behaviour(runner.specs[-1]))
    report = run_repro(ReproSpec(trials=2, max_time_s=40.0), matrix=True, runner=runner, workdir=tmp_path,
                       capabilities=EVERYTHING_RUNS, poll_s=0.0, clock=_TickingClock())
    facts = report.facts
    assert facts["partial"]["stopped_by"] == "max-time"
    assert facts["verdict"] == "reproduced" and report.exit_code_override == 1
    rows = {row["mitigation"]: row for row in facts["matrix"]}
    assert rows["none"]["outcome"] == "reproduced"
    assert all(row["outcome"] != "holds" for row in rows.values()), rows
    assert [p.reason for p in report.problems if "--max-time 40 s" in p.reason]
    assert "next_steps" not in facts  # no advice from a part-run


def test_max_time_before_any_verdict_is_a_harness_failure(tmp_path):
    runner = FakeRunner(lambda spec: ok(spec) if spec["phase"] == "single" else None)
    runner_start = runner.start
    runner.start = lambda *a, **k: _RunningChild(runner_start(*a, **k).result_path, runner.behaviour(runner.specs[-1]))
    report = run_repro(ReproSpec(trials=1, max_time_s=10.0), runner=runner, workdir=tmp_path,
                       capabilities=EVERYTHING_RUNS, poll_s=0.0, clock=_TickingClock())
    assert report.facts["verdict"] is None and report.exit_code_override == EXIT_HARNESS_FAILURE
    assert report.facts["partial"]["stopped_by"] == "max-time"


def test_the_cpu_floor_adds_up_what_the_children_that_ended_used(tmp_path):
    def costly(spec):
        return replace(like_the_h200(spec), cpu_s=3.0 if spec["phase"] == "multi" else 1.0)

    report, runner = repro(ReproSpec(trials=2, mitigation=("warmup",)), costly, tmp_path)
    cpu = report.facts["cpu"]
    ended = [s for s in runner.specs if s["phase"] in ("single", "multi")]
    assert cpu["children"] == len(ended) >= 3
    assert cpu["children_s"] == 1.0 + 3.0 * (len(ended) - 1)
    assert cpu["bound_s"] == round(cpu["children_s"] / cpu["cores"], 1)


class _Countdown(FakeChild):
    """A child that ends on its third look, so what else runs meanwhile can be seen."""

    def __init__(self, result_path, result, alive) -> None:
        super().__init__(result_path, result)
        self.looks, self.alive = 0, alive

    def poll(self, timeout_s):
        self.looks += 1
        if self.looks < 3:
            return None
        self.alive.discard(self.result_path.parent.name)
        return super().poll(timeout_s)

    def stop(self):  # a disturber is stopped, not waited for
        self.looks = 3
        return self.poll(0)


def _compiles(spec):
    """Every worker finishes a compile (what fills a shared cache); the race shows nowhere."""
    result = ok(spec)
    compiled = Event(0.2, spec["thread_names"][0] if spec["thread_names"] else "x", 9, "compile", "E")
    return replace(result, events=result.events + (compiled,))


def test_the_first_trial_into_an_empty_shared_cache_goes_alone_and_its_first_worker_first(tmp_path):
    """`processes` shares the run's cache: the first of its trials (the opener) starts its first worker alone,
    the other workers once that one ended, and no other sharing trial starts before a compile has filled it."""
    alive: set = set()
    starts = []
    runner = FakeRunner(_compiles)
    base_start = runner.start

    def start(spec_path, result_path, env, log_path, user_code=False):
        child = base_start(spec_path, result_path, env, log_path, user_code)
        name = Path(result_path).parent.name
        starts.append((name, set(alive)))
        alive.add(name)
        return _Countdown(Path(result_path), child.result, alive)

    runner.start = start
    # on a GPU (a backward) the flag-held trials compile cold, so processes is the one row that shares
    report = run_repro(ReproSpec(trials=2, jobs=4, mitigation=("processes",), devices=("cuda:0",)), runner=runner,
                       workdir=tmp_path, capabilities=EVERYTHING_RUNS, poll_s=0.0)
    assert report.facts["shared_cache_fixes"] == ["processes"]
    def trial(name: str) -> str:  # 012-processes-natural-t2-proc1 -> processes-natural-t2
        return name.split("-", 1)[1].rsplit("-proc", 1)[0]

    workers = [(name, running) for name, running in starts if "-processes-" in name and "-proc" in name]
    first, first_alive = workers[0]
    assert first.endswith("-proc0")
    # its other workers started only once its first had ended, and no other processes trial ran beside it
    later = [(name, running) for name, running in workers if trial(name) == trial(first) and name != first]
    assert len(later) == 2 and all(first not in running for _, running in later)
    assert not any("-processes-" in other for other in first_alive)
    assert all(first not in running for name, running in workers if trial(name) != trial(first))
    # once filled, the rest start together: a later processes trial ran its three workers side by side
    assert any(sum(1 for other in running if trial(other) == trial(name)) == 2
               for name, running in workers if name.endswith("-proc2") and trial(name) != trial(first))
