"""`run --fix` proved against a baseline in the same invocation, and `--amplify`: real processes, real threads,
real torch.fx traces (tests/run/programs)."""
from __future__ import annotations

import json
import sys

import pytest

from dflash_doctor.hazards import Hazard
from dflash_doctor.supervise.proof import LUCK, OTHER, Verdict, baseline_rate, judge_hazard
from tests.run.helpers import program


def _proof(cli, tmp_path, *args):
    """`run OPTIONS -f json -o FILE -- COMMAND`: the options before the command's `--`."""
    out = tmp_path / "run.json"
    split = args.index("--")
    proc = cli("run", *args[:split], "-f", "json", "-o", out, *args[split:], timeout=240)
    assert out.exists(), proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    return proc, doc, {row["hazard"]: row for row in (doc["facts"]["proof"] or {}).get("hazards", [])}


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(240)
def test_a_fix_that_does_not_stop_the_race_the_baseline_reproduced_fails(cli, tmp_path):
    # threadlocal-flag does not touch torch.fx's patches: the worker dies of the patcher race in both arms
    proc, doc, rows = _proof(cli, tmp_path, "--fix", "threadlocal-flag", "--trials", "1", "--",
                             sys.executable, program("graph_inspector.py"))
    proof = doc["facts"]["proof"]
    race = rows[Hazard.PATCHER_RACE.value]
    assert (race["baseline"], race["baseline_trials"], race["fix"], race["fix_trials"]) == (1, 1, 1, 1)
    assert race["verdict"] == proof["verdict"] == "fails"
    # what the fix claims and neither arm showed reads inconclusive, never holds
    assert rows[Hazard.FX_FLAG_LEAK.value]["verdict"] == "inconclusive"
    # the advice covers the race the baseline reproduced
    [advice] = proof["advice"]
    assert "isolate-fx-patches" in advice.split("covers every one: ")[1].split(":")[0]
    arms = {finding["evidence"]["arm"] for finding in doc["findings"]}
    assert arms == {"baseline", "fix"}
    assert proc.returncode == 0  # the command's own exit code (the fix arm's): the trainer logs its dead worker


@pytest.mark.slow  # three pairs of a torch program: about a minute on two cores
@pytest.mark.timeout(400)
def test_a_fix_that_stops_the_race_holds_with_both_rates(cli, tmp_path):
    proc, doc, rows = _proof(cli, tmp_path, "--fix", "isolate-fx-patches", "--", sys.executable,
                             program("graph_inspector.py"))
    race = rows[Hazard.PATCHER_RACE.value]
    assert (race["baseline"], race["baseline_trials"], race["fix"], race["fix_trials"]) == (3, 3, 0, 3)
    assert race["verdict"] == doc["facts"]["proof"]["verdict"] == "holds"
    assert "baseline 3 of 3, with the fix 0 of 3" in race["reason"]


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(240)
def test_a_command_in_which_the_race_never_showed_reads_inconclusive_with_the_next_steps(cli, tmp_path):
    proc, doc, rows = _proof(cli, tmp_path, "--fix", "threadlocal-flag", "--trials", "1", "--", sys.executable,
                             "-c", "import torch; torch.nn.Linear(2, 2)(torch.zeros(1, 2))")
    proof = doc["facts"]["proof"]
    assert proof["verdict"] == "inconclusive" and proc.returncode == 0
    assert set(rows) == {Hazard.FX_FLAG_LEAK.value, Hazard.STUCK_FLAG.value}  # what the fix claims
    for row in rows.values():
        assert row["verdict"] == "inconclusive" and row["baseline"] == row["fix"] == 0
        assert any("--amplify switch-interval" in step for step in row["next"])
        assert any("--cache cold" in step for step in row["next"])
    assert (proof["baseline"]["trials"], proof["fix"]["trials"]) == (1, 1)
    assert "inconclusive" in proc.stderr.splitlines()[-1]


def test_no_baseline_runs_the_fix_alone_and_needs_a_fix(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "--fix", "threadlocal-flag", "--no-baseline", "-f", "json", "-o", out, "--", sys.executable,
               "-c", "pass")
    assert proc.returncode == 0 and json.loads(out.read_text())["facts"]["proof"] is None
    proc = cli("run", "--no-baseline", "--", sys.executable, "-c", "pass")
    assert proc.returncode == 2 and "--no-baseline applies to --fix" in proc.stderr


def test_the_switch_interval_amplifier_is_in_place_before_the_users_first_thread(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "--amplify", "switch-interval", "-f", "json", "-o", out, "--", sys.executable,
               program("switch_interval.py"))
    assert float(proc.stdout) == pytest.approx(0.0002)
    assert json.loads(out.read_text())["facts"]["amplifiers"] == ["switch-interval"]
    plain = cli("run", "--", sys.executable, program("switch_interval.py"))
    assert float(plain.stdout) == pytest.approx(0.005)


@pytest.mark.timeout(240)
def test_the_foreign_trace_amplifier_makes_an_eager_run_meet_the_patcher_race_and_is_named(cli, tmp_path):
    out = tmp_path / "run.json"
    # the foreign trace alone was decisive on a loaded box and not on a quieter one; with the switch interval the
    # tracer is preempted inside its traces (benchmarks/results/run_amplifiers.md)
    cli("run", "--amplify", "foreign-trace,switch-interval", "-f", "json", "-o", out, "--", sys.executable,
        program("eager_workers.py"), timeout=200)
    doc = json.loads(out.read_text())
    races = [f for f in doc["findings"] if f["code"] == "DFD905"]
    assert races, doc["findings"]
    assert all(f["evidence"]["tracing"] == ["dflash-doctor-foreign-trace"] or f["evidence"]["last_tracer"] ==
               "dflash-doctor-foreign-trace" for f in races)


@pytest.mark.parametrize("value", ["loud", "switch-interval,nope", ","])
def test_an_unknown_amplifier_is_one_line_and_exit_2(cli, value):
    proc = cli("run", "--amplify", value, "--", sys.executable, "-c", "pass")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "switch-interval, foreign-trace" in proc.stderr


# -- the verdicts, pure ----------------------------------------------------------------------------------------
def test_holds_needs_the_baseline_and_enough_trials_that_luck_is_unlikely():
    race = Hazard.PATCHER_RACE.value
    assert judge_hazard(race, 0, 5, 0, 5).verdict is Verdict.INCONCLUSIVE
    assert judge_hazard(race, 3, 3, 1, 3).verdict is Verdict.FAILS
    assert judge_hazard(race, 0, 3, 1, 3).verdict is Verdict.FAILS  # it showed with the fix: never holds
    assert judge_hazard(race, 1, 1, 0, 1).verdict is Verdict.INCONCLUSIVE  # one pair is never enough
    assert judge_hazard(race, 3, 3, 0, 3).verdict is Verdict.HOLDS
    for shown, trials in ((1, 4), (2, 4), (3, 6), (4, 8), (6, 6)):
        verdict = judge_hazard(race, shown, trials, 0, trials).verdict
        luck = (1 - baseline_rate(shown, trials)) ** trials
        assert (verdict is Verdict.HOLDS) == (luck <= LUCK)
    rare = judge_hazard(race, 1, 4, 0, 4)
    assert any(step.startswith("`--trials ") for step in rare.next)


def test_an_error_that_is_no_race_never_reads_holds():
    assert judge_hazard(OTHER, 2, 2, 2, 2).verdict is Verdict.INCONCLUSIVE
    assert judge_hazard(OTHER, 0, 2, 1, 2).verdict is Verdict.FAILS  # it appeared only with the fix


def test_the_advice_of_a_run_with_two_races_covers_both():
    from dflash_doctor import mitigations as registry
    from dflash_doctor.rules import live as rules
    from dflash_doctor.supervise.proof import hazards_in, run_advice
    from dflash_doctor.supervise.supervisor import TrialResult

    leak = rules.RUN_FX_FLAG_ERROR.finding("a leak", evidence={"blame_kind": "fx-flag-leak", "holder": "inspect"})
    race = rules.RUN_PATCHER_RACE.finding("a death")
    assert hazards_in([leak, race]) == {Hazard.FX_FLAG_LEAK.value, Hazard.PATCHER_RACE.value}
    trial = TrialResult(0, 0, 1.0, (), (leak, race), (), (), False, None)
    [advice] = run_advice([trial])
    best = advice.split("covers every one: ")[1].split(":")[0]
    assert {Hazard.FX_FLAG_LEAK, Hazard.PATCHER_RACE, Hazard.DEADLOCK} <= registry.covers(registry.parse(best))
    assert advice.startswith("reproduced: fx-flag-leak, fx-patcher-race;")


def test_the_proof_holds_for_the_races_shown_and_keeps_untested_claims_inconclusive():
    from dflash_doctor.rules import live as rules
    from dflash_doctor.supervise.proof import prove
    from dflash_doctor.supervise.supervisor import TrialResult

    race = rules.RUN_PATCHER_RACE.finding("a death")
    died = [TrialResult(i, 0, 1.0, (), (race,), (), (), False, None) for i in range(3)]
    clean = [TrialResult(i, 0, 1.0, (), (), (), (), False, None) for i in range(3)]
    facts = prove(died, clean, ("threadlocal-flag", "isolate-fx-patches"))
    verdicts = {row["hazard"]: row["verdict"] for row in facts["hazards"]}
    assert verdicts == {"fx-flag-leak": "inconclusive", "stuck-flag": "inconclusive", "fx-patcher-race": "holds"}
    assert facts["verdict"] == "holds"
    assert prove(clean, clean, ("threadlocal-flag", "isolate-fx-patches"))["verdict"] == "inconclusive"
    assert prove(died, died, ("threadlocal-flag", "isolate-fx-patches"))["verdict"] == "fails"
