"""Every wording of a signal death (rules/logs/signal_wordings.py SIGNAL_WORDINGS) is found by the rule's one
pattern, read by its own decoder and reported as DFD514 with the signal its example names."""
from __future__ import annotations

import pytest

from dflash_doctor.rules.logs import LOG_RULES, SIGNAL_WORDINGS, signal_wording
from tests.logs.test_scan import scan_text

SIGNAL_RULE = LOG_RULES["DFD514"]


@pytest.mark.parametrize("index", range(len(SIGNAL_WORDINGS)),
                         ids=[wording.wording for wording in SIGNAL_WORDINGS])
def test_each_wording_is_read_by_its_own_decoder(index):
    wording = SIGNAL_WORDINGS[index]
    assert SIGNAL_RULE.pattern is not None
    match = SIGNAL_RULE.pattern.search(wording.example)
    assert match is not None
    assert SIGNAL_WORDINGS[signal_wording(match)].wording == wording.wording
    assert SIGNAL_RULE.details(match, wording.example)["signal"] == wording.signal


@pytest.mark.parametrize("index", range(len(SIGNAL_WORDINGS)),
                         ids=[wording.wording for wording in SIGNAL_WORDINGS])
def test_each_wording_alone_in_a_log_is_a_signal_death(index):
    wording = SIGNAL_WORDINGS[index]
    found = [(f.code, f.evidence.get("signal")) for f in scan_text(wording.example + "\n").findings]
    assert ("DFD514", wording.signal) in found


def test_the_details_of_one_wording_keep_its_pid_rank_and_meaning():
    line = "api.py:869] failed (exitcode: -11) local_rank: 2 (pid: 4244) of binary: /usr/bin/python3"
    match = SIGNAL_RULE.pattern.search(line) if SIGNAL_RULE.pattern is not None else None
    assert match is not None
    assert SIGNAL_RULE.details(match, line) == {
        "signal": "SIGSEGV", "pid": 4244, "local_rank": 2,
        "meaning": "a native crash (C++/CUDA extension, driver): run under faulthandler or gdb for its stack"}
