"""The verdict and the fixes it ranks for each layout."""
from __future__ import annotations

import pytest

from dflash_doctor.guards.verdict import (
    GLOBAL_LOCK, NON_LAZY_BACKWARD, PROCESSES, RESTART, RESTORE_CONFIG, UPGRADE, WARM_UP, decide_verdict, rank_fixes,
)

DEFAULTS = {"error_on_nested_fx_trace": True, "force_compile_during_fx_trace": False}


@pytest.mark.parametrize("storage, probes, flag_now, verdict", [
    ("module-global", {}, None, "vulnerable"),
    ("module-global", {"cross_thread_leak": "not-reproduced", "stuck_flag": "not-reproduced"}, False, "vulnerable"),
    ("thread-local", {"cross_thread_leak": "not-reproduced", "is_compiling_leak": "reproduced"}, False, "safe"),
    ("thread-local", {"stuck_flag": "reproduced"}, False, "vulnerable"),
    ("thread-local", {}, True, "vulnerable"),
    ("unknown", {"cross_thread_leak": "error"}, None, "unknown"),
    ("unknown", {"cross_thread_leak": "reproduced"}, None, "vulnerable"),
])
def test_verdict(storage, probes, flag_now, verdict):
    assert decide_verdict(storage, probes, flag_now) == verdict


def _fixes(*entries):
    return [dict(rank=rank, **entry) for rank, entry in enumerate(entries, start=1)]


@pytest.mark.parametrize("verdict, storage, flag_now, config, expected", [
    ("vulnerable", "module-global", False, DEFAULTS, _fixes(WARM_UP, UPGRADE, GLOBAL_LOCK, PROCESSES)),
    ("vulnerable", "module-global", True, {"error_on_nested_fx_trace": False}, _fixes(
        RESTART, RESTORE_CONFIG, WARM_UP, UPGRADE, GLOBAL_LOCK, PROCESSES)),
    ("safe", "thread-local", False, DEFAULTS, _fixes(WARM_UP, NON_LAZY_BACKWARD)),
    ("vulnerable", "thread-local", False, {"force_compile_during_fx_trace": True}, _fixes(
        RESTORE_CONFIG, WARM_UP, NON_LAZY_BACKWARD, PROCESSES)),
    ("unknown", "unknown", None, {"error_on_nested_fx_trace": None}, _fixes(WARM_UP, GLOBAL_LOCK, PROCESSES)),
])
def test_fixes_fit_the_layout(verdict, storage, flag_now, config, expected):
    assert rank_fixes(verdict, storage, flag_now, config) == expected
    assert all(fix["cost"] for fix in expected)
