"""The 'next:' lines after a verdict: what this run could show, and what to run next."""
from __future__ import annotations

from dflash_doctor.repro.advice import next_steps

CPU_NATURAL = {"device": "cpu", "mitigation": "none", "mode": "natural", "backward": False,
               "verdict": "not-reproduced", "kind": None}


def test_natural_cpu_not_reproduced_says_what_could_not_form_and_points_at_forced_and_the_gpu():
    steps = next_steps(CPU_NATURAL)
    assert len(steps) == 3
    assert "flex_attention has no CPU backward" in steps[0] and "deadlock cannot form" in steps[0]
    assert "--mode forced" in steps[1] and "dflash-doctor guards" in steps[1]
    assert "--device cuda --shapes per-thread" in steps[2]


def test_gpu_natural_with_backward_only_warns_that_one_run_is_not_proof():
    steps = next_steps({**CPU_NATURAL, "device": "cuda", "backward": True})
    assert len(steps) == 1 and "not reproduced is not safe" in steps[0]


def test_reproduced_names_the_fixes_for_its_kind():
    [deadlock] = next_steps({**CPU_NATURAL, "verdict": "reproduced", "kind": "deadlock"})
    assert "threadlocal-flag,non-lazy-backward" in deadlock and "--matrix" in deadlock
    [stuck] = next_steps({**CPU_NATURAL, "verdict": "reproduced", "kind": "stuck-flag"})
    assert "processes" in stuck


def test_a_mitigation_is_judged_by_its_own_run():
    [failed] = next_steps({**CPU_NATURAL, "mitigation": "first-call-lock", "verdict": "reproduced",
                           "kind": "fx-flag-leak"})
    assert failed.startswith("--mitigation first-call-lock did not hold")
    [held] = next_steps({**CPU_NATURAL, "mitigation": "warmup"})
    assert held.startswith("--mitigation warmup held") and "--trials" in held


def test_matrix_lists_what_held_and_never_the_baseline():
    facts = {**CPU_NATURAL, "matrix": [
        {"mitigation": "none", "verdict": "not-reproduced"}, {"mitigation": "warmup", "verdict": "not-reproduced"},
        {"mitigation": "first-call-lock", "verdict": "reproduced"}]}
    assert next_steps(facts) == ["held on this install: warmup; each is a function in dflash_doctor.runtime "
                                 "(README: 'Fix it in your own trainer')"]
