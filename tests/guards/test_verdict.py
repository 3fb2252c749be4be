"""A verdict per hazard, the headline, and the fixes ranked for each release from the mitigation registry."""
from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.guards import read_layout
from dflash_doctor.guards.ranking import rank_fixes, upgrade
from dflash_doctor.guards.probes import PROBES
from dflash_doctor.mitigations import RESTART, RESTORE_CONFIG, fix_text
from dflash_doctor.guards.releases import TABLE, corroborate, later_rows, row_for
from dflash_doctor.guards.state import CONFIG_DEFAULTS
from dflash_doctor.guards.verdict import (
    ABSENT, PRESENT, UNKNOWN, advised_hazards, advised_present, decide_hazards, evidence_of_row, headline,
    present_hazards, release_of, source_states,
)
from dflash_doctor.hazards import Hazard
from dflash_doctor.mitigations import BY_NAME

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "guards"
F, S, I, D = Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG, Hazard.IS_COMPILING_LEAK, Hazard.DEADLOCK
P = Hazard.PATCHER_RACE
PROBE_OF = {probe.hazard: probe.name for probe in PROBES}  # the probe that tests each hazard


def _states(folder, probes=None, flag_now=None):
    verdicts = decide_hazards(read_layout(FIXTURES / folder), probes or {}, flag_now)
    return {v.hazard: v.state for v in verdicts}, headline(verdicts)


@pytest.mark.parametrize("folder, states, verdict, worst", [
    ("torch-2.4", {F: PRESENT, S: PRESENT, I: ABSENT, D: ABSENT, P: PRESENT}, "vulnerable", S),
    ("torch-2.6", {F: PRESENT, S: PRESENT, I: ABSENT, D: PRESENT, P: PRESENT}, "vulnerable", D),
    ("torch-2.13", {F: PRESENT, S: PRESENT, I: PRESENT, D: PRESENT, P: PRESENT}, "vulnerable", D),
    # the FX flag is thread-local, but the lazy backward still takes compile_lock: not safe
    ("torch-2.14", {F: ABSENT, S: ABSENT, I: PRESENT, D: PRESENT, P: PRESENT}, "vulnerable", D),
    ("torch-unknown", {F: UNKNOWN, S: UNKNOWN, I: UNKNOWN, D: UNKNOWN, P: UNKNOWN}, "unknown", None),
])
def test_hazards_from_the_source(folder, states, verdict, worst):
    assert _states(folder) == (states, (verdict, worst))


def test_probes_settle_what_the_source_leaves_unknown_and_add_to_what_it_says():
    probes = {PROBE_OF[F]: "not-reproduced", PROBE_OF[S]: "reproduced", PROBE_OF[I]: "error"}
    states, (verdict, worst) = _states("torch-unknown", probes)
    assert states == {F: ABSENT, S: PRESENT, I: UNKNOWN, D: UNKNOWN, P: UNKNOWN} and (verdict, worst) == (
        "vulnerable", S)
    # a reproduction overrides a thread-local reading (a patched build, a backport)
    states, _ = _states("torch-2.14", {PROBE_OF[F]: "reproduced"})
    assert states[F] == PRESENT


def test_a_flag_stuck_now_makes_the_stuck_flag_present_whatever_the_source_says():
    states, _ = _states("torch-2.14", flag_now=True)
    assert states[S] == PRESENT


def test_safe_only_when_every_hazard_is_absent():
    verdicts = decide_hazards(read_layout(FIXTURES / "torch-2.14"),
                              {PROBE_OF[F]: "not-reproduced", PROBE_OF[I]: "not-reproduced"}, False)
    assert {v.hazard: v.state for v in verdicts}[I] == PRESENT  # the source says a compile sets it for all
    assert headline(verdicts)[0] == "vulnerable"
    assert headline([v for v in verdicts if v.state == ABSENT]) == ("safe", None)


def test_the_conditional_patcher_race_is_decided_but_stays_out_of_the_headline_and_the_ranking():
    verdicts = decide_hazards(read_layout(FIXTURES / "torch-2.14"), {PROBE_OF[I]: "not-reproduced"}, False)
    by_hazard = {v.hazard: v for v in verdicts}
    assert by_hazard[P].state == PRESENT and by_hazard[P].to_dict()["condition"] == P.condition
    assert [c.what for c in by_hazard[P].cited] == ["__getattr__", "__call__", "CURRENT_PATCHER"]
    only_patcher = [v for v in verdicts if v.state == ABSENT or v.hazard is P]
    assert headline(only_patcher) == ("safe", None)
    assert P not in advised_hazards(verdicts)


@pytest.mark.parametrize("row", TABLE, ids=lambda row: row.release)
def test_table_rows_decide_like_the_source(row):
    states = source_states(evidence_of_row(row))
    assert states[D] == (PRESENT if row.release not in ("2.4", "2.5") else ABSENT)
    assert states[F] == states[S] == (ABSENT if row.release in ("2.14", "2.15") else PRESENT)
    assert states[I] == (PRESENT if row.release in ("2.13", "2.14", "2.15") else ABSENT)


@pytest.mark.parametrize("folder", ["torch-2.4", "torch-2.6", "torch-2.11", "torch-2.13", "torch-2.14"])
def test_every_stand_in_agrees_with_its_release_row(folder):
    assert corroborate(read_layout(FIXTURES / folder))["agrees"] is True


def test_a_release_outside_the_table_is_not_consulted():
    row = corroborate(read_layout(FIXTURES / "torch-unknown"))
    assert (row["release"], row["consulted"], row["table_row"], row["table_releases"]) == ("9.9", False, None,
                                                                                           "2.4-2.15")


def _ranked(folder, flag_now=False, config=CONFIG_DEFAULTS):
    layout = read_layout(FIXTURES / folder)
    needed = advised_hazards(decide_hazards(layout, {}, flag_now))
    advice = upgrade(needed, later_rows(layout.torch_version), lambda r: advised_present(evidence_of_row(r)))
    fixes = rank_fixes(needed, release_of(layout), flag_now, config, CONFIG_DEFAULTS, advice)
    assert [f["rank"] for f in fixes] == list(range(1, len(fixes) + 1))
    return fixes


def _labels(fixes):
    return [f.get("mitigation") or f["kind"] for f in fixes]


@pytest.mark.parametrize("folder, labels", [
    # no deadlock on 2.4/2.5: the shim alone is complete, and upgrading trades hazards, so it comes last
    ("torch-2.4", ["threadlocal-flag", "warmup", "global-lock", "processes", "upgrade"]),
    # 2.6-2.9: no non-lazy switch: single-threaded autograd with the shim is the only concurrent fix, and the
    # shim alone leaves the deadlock
    ("torch-2.6", ["threadlocal-flag,single-thread-autograd", "warmup", "global-lock", "processes",
                   "threadlocal-flag", "upgrade"]),
    # 2.10-2.12: the shim with non-lazy backward is complete and keeps the workers concurrent
    ("torch-2.11", ["threadlocal-flag,non-lazy-backward", "threadlocal-flag,single-thread-autograd", "warmup",
                    "global-lock", "processes", "upgrade"]),
    # 2.13: the concurrent pairs still rank first: they leave only the minor is-compiling leak open
    ("torch-2.13", ["threadlocal-flag,non-lazy-backward", "threadlocal-flag,single-thread-autograd", "warmup",
                    "global-lock", "processes", "upgrade"]),
    # 2.14: no shim (the flag is thread-local), no upgrade (no later release fixes the deadlock); single-threaded
    # autograd alone is enough for the deadlock and the flag there
    ("torch-2.14", ["non-lazy-backward", "single-thread-autograd", "warmup", "global-lock", "processes"]),
])
def test_fixes_are_ranked_for_the_release(folder, labels):
    assert _labels(_ranked(folder)) == labels


def test_mitigation_entries_are_the_registrys_own_words():
    for fix in _ranked("torch-2.11"):
        if fix["kind"] == "mitigation":
            names = fix["mitigation"].split(",")
            assert fix["api"] == [BY_NAME[name].api for name in names]
            assert fix["fix"] == "; ".join(f"{name}: {BY_NAME[name].summary}" for name in names)


def test_the_shim_on_2_4_carries_no_deadlock_caveat_but_on_2_6_it_does():
    [on_24] = [f for f in _ranked("torch-2.4") if f.get("mitigation") == "threadlocal-flag"]
    [on_26] = [f for f in _ranked("torch-2.6") if f.get("mitigation") == "threadlocal-flag"]
    pairing = [BY_NAME["threadlocal-flag"].pairing_caveat()]
    assert pairing and not set(pairing) & set(on_24["caveats"]) and set(pairing) <= set(on_26["caveats"])
    assert (on_24["gaps"], on_26["gaps"]) == ([], ["deadlock"])


@pytest.mark.parametrize("folder, removes, adds, keeps", [
    ("torch-2.4", ["fx-flag-leak", "stuck-flag"], {"deadlock": "2.6", "is-compiling-leak": "2.13"}, []),
    ("torch-2.6", ["fx-flag-leak", "stuck-flag"], {"is-compiling-leak": "2.13"}, ["deadlock"]),
    ("torch-2.13", ["fx-flag-leak", "stuck-flag"], {}, ["is-compiling-leak", "deadlock"]),
])
def test_upgrade_advice_is_true_for_the_release_it_starts_from(folder, removes, adds, keeps):
    [advice] = [f for f in _ranked(folder) if f["kind"] == "upgrade"]
    assert (advice["to"], advice["removes"], advice["adds"], advice["keeps"]) == ("2.14.1", removes, adds, keeps)
    assert advice["then"] == ["non-lazy-backward", "single-thread-autograd", "warmup", "global-lock", "processes"]


def test_no_upgrade_is_offered_from_a_thread_local_release_or_past_the_table():
    assert upgrade(frozenset({D, I}), later_rows("2.14.1"), lambda r: advised_present(evidence_of_row(r))) is None
    assert upgrade(frozenset({F, S}), later_rows("2.16.0"), lambda r: advised_present(evidence_of_row(r))) is None
    assert later_rows(None) == () and row_for("2.15.0").read_from == "2.15.0"


def test_restart_and_restored_config_come_before_any_fix():
    fixes = _ranked("torch-2.13", flag_now=True, config={"error_on_nested_fx_trace": False})
    assert fixes[0]["fix"] == RESTART.fix and fixes[1]["fix"] == RESTORE_CONFIG.fix
    assert _labels(fixes)[:3] == ["restart", "restore-config", "threadlocal-flag,non-lazy-backward"]


def test_rule_fix_texts_come_from_the_registry():
    from dflash_doctor.rules import lookup

    assert lookup("DFD601").fix == fix_text(F, S)
    assert lookup("DFD609").fix == fix_text(D)
    # the deadlock's fix keeps the leak shut too: non-lazy backward comes paired, never alone
    assert lookup("DFD609").fix.startswith("One of, best first: threadlocal-flag,non-lazy-backward (")
    assert all(f"{name} ({BY_NAME[name].summary}" in lookup("DFD609").fix
               for name in ("global-lock", "warmup", "processes"))
    # a fix that leaves the conditional patcher race open says so; one that stops it does not
    assert "warmup (" + BY_NAME["warmup"].summary + "; leaves open: the FX patcher race" in lookup("DFD609").fix
    assert "global-lock (" + BY_NAME["global-lock"].summary + ")" in lookup("DFD609").fix
    assert "first-call-lock" not in lookup("DFD601").fix and "first-call-lock" not in lookup("DFD609").fix
    assert lookup("DFD602").fix.startswith(RESTART.fix) and lookup("DFD603").fix == RESTORE_CONFIG.fix
