"""What a replay showed, said as what it was: a race the step's own threads produced (reproduced), a failure only
a trace of the tool's own caused (reproduced-if-traced, exit 5), and advice that covers every race reproduced."""
from __future__ import annotations

import itertools
import json

import pytest

from dflash_doctor import mitigations as registry
from dflash_doctor.hazards import Hazard, Release, Stress
from dflash_doctor.render.repro_view import verdict_words
from dflash_doctor.repro.capabilities import assess
from dflash_doctor.repro.harness import EXIT_REPRODUCED_IF_TRACED, verdict_exit_code
from dflash_doctor.repro.next_steps import next_steps
from tests.repro.example_facts import repro_facts

TORCH_2_13 = Release(version="2.13.0", fx_flag_thread_local=False)


def _level(ran: int, **kinds: int):
    return {"ran": ran, "reproduced": sum(kinds.values()), "kinds": {k.replace("_", "-"): n for k, n in kinds.items()}}


# A step with two races at once: its own graph-inspection thread killed a worker (the patcher race, natural) and
# the forced stress made a compiled call raise (the FX-flag leak).
TWO_RACES = [{"kind": "fx-patcher-race", "stress": "natural", "injected": False},
             {"kind": "fx-flag-leak", "stress": "forced", "injected": True}]


def _fix_of(line: str) -> tuple:
    return registry.parse(line.split("fix: ", 1)[1].split(" ", 1)[0])


def test_the_two_race_step_gets_a_fix_covering_both_as_the_last_line():
    facts = repro_facts(verdict="reproduced", kind="fx-patcher-race", level="natural", model="pkg:make_step",
                        levels={"natural": _level(3, fx_patcher_race=2)}, baseline_reproduced=TWO_RACES)
    fix = _fix_of(next_steps(facts)[-1])
    assert {Hazard.PATCHER_RACE, Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG} <= registry.covers(fix)


def test_a_mitigation_that_drops_the_patcher_fix_is_answered_with_one_that_keeps_it():
    # the case: the baseline reproduced the patcher race; the last line must not drop isolate-fx-patches
    facts = repro_facts(verdict="reproduced", kind="fx-flag-leak", level="natural", model="pkg:make_step",
                        mitigation="threadlocal-flag,non-lazy-backward", outcome="fails",
                        outcome_reason="fx-patcher-race under natural stress (1 of 1 finished trials)",
                        baseline_levels={"natural": _level(2, fx_patcher_race=1)}, baseline_reproduced=TWO_RACES)
    steps = next_steps(facts)
    assert any("does not stop fx-patcher-race" in step for step in steps)
    assert "isolate-fx-patches" in _fix_of(steps[-1])


def test_the_matrix_does_not_advise_a_holding_row_that_leaves_a_reproduced_race_open():
    rows = [{"mitigation": "none", "outcome": "reproduced", "stresses": {"natural": _level(3, fx_patcher_race=3)}},
            {"mitigation": "threadlocal-flag,non-lazy-backward", "outcome": "holds", "reason": "r",
             "stresses": {"natural": _level(2)}},
            {"mitigation": "isolate-fx-patches", "outcome": "fails", "reason": "r2",
             "stresses": {"forced": _level(1, fx_flag_leak=1)}}]
    steps = next_steps(repro_facts(matrix=rows, verdict="reproduced", kind="fx-patcher-race"))
    assert "reproduced here: fx-flag-leak, fx-patcher-race" in steps
    assert not any(step.startswith("apply in your trainer: threadlocal-flag,non-lazy-backward") for step in steps)
    covering = steps[-1].split("the combination that covers them: ")[1].split(" ")[0]
    assert {Hazard.PATCHER_RACE, Hazard.FX_FLAG_LEAK} <= registry.covers(registry.parse(covering))


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_covering_stops_every_hazard_it_is_given(size):
    severe = [h for h in Hazard if not h.minor]
    for hazards in itertools.combinations(severe, size):
        best = registry.covering(hazards, TORCH_2_13)
        assert best is not None and set(hazards) <= best.covers, hazards
        assert best.complete


def test_an_injected_only_reproduction_says_so_with_its_own_words_and_exit_code():
    facts = repro_facts(verdict="reproduced-if-traced", kind="fx-flag-leak", level="forced", model="pkg:make_step",
                        levels={"natural": _level(3), "amplified": _level(2), "forced": _level(1, fx_flag_leak=1)},
                        baseline_reproduced=[TWO_RACES[1]])
    words = verdict_words(facts)
    assert words.startswith("not reproduced by the step's own threads (natural 0/3, amplified 0/2)")
    assert "IF a thread traces with FX" in words
    steps = next_steps(facts)
    assert steps[0].startswith("the step's own threads did not race") and "fails IF a thread" in steps[0]
    assert steps[1].startswith("if one does, fix:")
    assert Hazard.PATCHER_RACE in registry.covers(_fix_of(steps[1]))  # a tracing thread brings the patcher race
    assert steps[2].startswith("if none does, nothing here needs a fix")
    assert verdict_exit_code("reproduced-if-traced") == EXIT_REPRODUCED_IF_TRACED == 5
    assert (verdict_exit_code("reproduced"), verdict_exit_code("not-reproduced")) == (1, 0)


def test_a_users_step_on_a_cpu_is_never_told_it_has_no_backward_and_may_race_naturally():
    traits = lambda: ("module-global", True, "2.13.0")  # noqa: E731 - torch 2.13's layout
    step = assess(backward=False, on_cpu=True, traits=traits, user_code=True)
    assert not any("no backward" in line for line in step.cannot_show)
    assert any("each backward runs on the thread that calls it" in line for line in step.cannot_show)
    assert Stress.NATURAL not in step.skipped and Stress.AMPLIFIED not in step.skipped
    reference = assess(backward=False, on_cpu=True, traits=traits)
    assert any("no backward in this run" in line for line in reference.cannot_show)
    assert Stress.NATURAL in reference.skipped


@pytest.mark.slow  # natural, amplified and forced trials of a real compiled step: minutes on two busy cores
@pytest.mark.timeout(900)
def test_repro_step_on_a_race_free_step_does_not_read_reproduced(cli, tmp_path):
    out = tmp_path / "r.json"
    proc = cli("repro", "--step", "tests.repro.step_modules:make_step", "--threads", "2", "--trials", "1",
               "--device", "cpu", "-f", "json", "-o", out, timeout=880)
    facts = json.loads(out.read_text())["facts"]
    assert facts["levels"]["natural"]["ran"] == 1 and facts["levels"]["natural"]["reproduced"] == 0
    assert facts["verdict"] == "reproduced-if-traced" and proc.returncode == 5, proc.stderr[-1500:]
    assert "reproduced (" not in proc.stderr.splitlines()[-1]


@pytest.mark.slow  # a real step with an eager and a compiled part, beside a foreign trace
@pytest.mark.timeout(900)
def test_repro_step_with_two_races_recommends_a_fix_for_both(cli, tmp_path):
    out = tmp_path / "r.json"
    proc = cli("repro", "--step", "tests.repro.two_part_step:make_step", "--threads", "2", "--trials", "1",
               "--device", "cpu", "--mitigation", "isolate-fx-patches", "-f", "json", "-o", out, timeout=880)
    facts = json.loads(out.read_text())["facts"]
    # without a fix the foreign trace's patches kill the eager block first; with isolate-fx-patches the block runs
    # and the compiled call meets the trace's module-global FX flag: two races in one step
    # (which a worker meets first in the one foreign-trace trial is timing: the eager block's patches, most runs, or
    # the compiled call's flag; and whether the fix's row then meets the flag: fails or inconclusive)
    shown = {entry["kind"] for entry in facts["baseline_reproduced"]}
    assert shown and shown <= {"fx-patcher-race", "fx-flag-leak", "stuck-flag"}, proc.stderr[-1500:]
    assert facts["outcome"] in ("fails", "inconclusive")
    if facts["outcome"] == "fails":
        assert facts["kind"] == "fx-flag-leak"
        assert any("does not stop fx-flag-leak" in step for step in facts["next_steps"])
    # the last line covers both: the race the baseline reproduced and the leak this torch has
    fix = _fix_of(facts["next_steps"][-1])
    assert {Hazard.PATCHER_RACE, Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG} <= registry.covers(fix)


def test_each_race_the_baseline_reproduced_is_a_finding_and_an_injected_one_a_warning():
    from dflash_doctor.repro.findings import findings_from_facts

    facts = repro_facts(verdict="reproduced", kind="fx-patcher-race", level="natural", model="pkg:make_step",
                        multi_thread={"outcome": "error", "seconds": 1.0, "steps_per_s": None, "events": [],
                                      "threads": [{"name": "drafter-0", "outcome": "error", "steps": 0,
                                                   "error": "NameError: module is not installed as a submodule"}]},
                        baseline_reproduced=TWO_RACES)
    codes = [(f.code, f.severity.value, f.evidence.get("injected")) for f in findings_from_facts(facts)]
    from dflash_doctor.rules import repro as rules

    assert codes == [(rules.FX_PATCHER_RACE.code, "error", None), (rules.FX_FLAG_LEAK.code, "warning", True)], codes


def test_a_run_that_put_a_foreign_trace_beside_the_step_advises_on_the_patcher_race_too():
    # the baseline met the FX flag first under the foreign trace: the trace was there, so its patches are a risk
    facts = repro_facts(verdict="not-reproduced", mitigation="isolate-fx-patches", outcome="inconclusive",
                        outcome_reason="r", model="pkg:make_step",
                        baseline_levels={"foreign-trace": _level(1, fx_flag_leak=1)},
                        baseline_reproduced=[{"kind": "fx-flag-leak", "stress": "foreign-trace", "injected": True}])
    fix = _fix_of(next_steps(facts)[-1])
    assert {Hazard.PATCHER_RACE, Hazard.FX_FLAG_LEAK} <= registry.covers(fix)
