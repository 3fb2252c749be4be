"""The 'next:' lines after a verdict come from the mitigation registry, for the release the run read, so repro's
advice, guards' ranking and the README cannot disagree."""
from __future__ import annotations

from dflash_doctor import mitigations as registry
from dflash_doctor.hazards import Release
from dflash_doctor.repro.next_steps import fix_line, next_steps
from tests.repro.example_facts import capabilities, repro_facts

GLOBAL_FLAG = repro_facts(capabilities=capabilities("module-global"), torch_version="2.11.0")
THREAD_LOCAL = repro_facts(capabilities=capabilities("thread-local"), torch_version="2.14.1")


def test_the_fix_line_is_the_registrys_first_complete_recommendation_for_the_release():
    for facts in (GLOBAL_FLAG, THREAD_LOCAL):
        storage = facts["capabilities"]["fx_flag_storage"]
        release = Release(version=facts["torch_version"], fx_flag_thread_local=storage == "thread-local")
        best = registry.recommend(release.hazards(), release)[0]
        assert fix_line(facts).startswith(f"fix: {best.label} (")
    assert fix_line(GLOBAL_FLAG).startswith("fix: threadlocal-flag,non-lazy-backward")
    assert fix_line(THREAD_LOCAL).startswith("fix: non-lazy-backward")  # no shim where the flag is per thread


def test_a_reproduced_race_gets_the_fix_and_the_matrix():
    [line] = next_steps({**GLOBAL_FLAG, "mitigation": "none", "verdict": "reproduced", "kind": "deadlock"})
    assert line.startswith("fix: threadlocal-flag,non-lazy-backward") and "`--matrix`" in line


def test_a_failed_mitigation_says_why_and_what_it_leaves_open_then_the_fix():
    steps = next_steps({**GLOBAL_FLAG, "mitigation": "non-lazy-backward", "verdict": "reproduced",
                        "outcome": "fails", "outcome_reason": "fx-flag-leak under natural stress (1 of 1)"})
    assert steps[0] == "--mitigation non-lazy-backward fails: fx-flag-leak under natural stress (1 of 1)"
    assert steps[1] == f"it leaves open: {registry.get('non-lazy-backward').pairing_caveat()}"
    assert steps[-1].startswith("fix: threadlocal-flag,non-lazy-backward")


def test_a_holding_combination_lists_its_caveats_but_not_the_pairing_it_meets():
    steps = next_steps({**GLOBAL_FLAG, "mitigation": "threadlocal-flag,non-lazy-backward", "outcome": "holds",
                        "outcome_reason": "no reproduction in 3 natural trials", "verdict": "not-reproduced"})
    assert steps[0].startswith("--mitigation threadlocal-flag,non-lazy-backward holds")
    assert not any("pair it with" in step for step in steps)
    assert not any(step.startswith("fix:") for step in steps)


def test_not_reproduced_is_not_called_safe_and_points_at_what_could_show_it():
    steps = next_steps({**GLOBAL_FLAG, "mitigation": "none", "verdict": "not-reproduced", "shapes": "same",
                        "backward": True, "levels": {"natural": {"ran": 3, "reproduced": 0, "kinds": {}}}})
    assert steps[0].startswith("not reproduced at any stress that ran (natural 0/3)")
    assert "not proof of safety" in steps[0]
    assert any("--shapes per-thread" in step for step in steps)
    assert steps[-1].startswith("`dflash-doctor guards`")


def test_the_matrix_lists_holds_fails_and_inconclusive_and_what_to_apply():
    rows = [{"mitigation": "none", "outcome": "reproduced"},
            {"mitigation": "warmup", "outcome": "holds", "reason": "r1"},
            {"mitigation": "first-call-lock", "outcome": "fails", "reason": "r2"},
            {"mitigation": "processes", "outcome": "inconclusive", "reason": "r3"}]
    assert next_steps(repro_facts(matrix=rows)) == [
        "holds: warmup (r1)", "fails: first-call-lock (r2)", "inconclusive: processes (r3)",
        "apply in your trainer: warmup (each is a call in dflash_doctor.runtime; README: 'Fix it in your own "
        "trainer')"]
