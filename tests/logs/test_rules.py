"""The log rules as declared: each rule's examples are its tests, its trigger words can never hide its lines, and
the prefilter finds every line holding a trigger word whatever the block looks like."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_doctor.logs.prefilter import HIT_LIMIT, Prefilter, choose_anchors
from dflash_doctor.rules import all_rules
from dflash_doctor.rules.logs import LOG_RULES, trigger_words

LOG_RULE_LIST = [r for r in all_rules() if r.example_format == "log"]


def test_every_log_rule_is_declared_with_its_matcher():
    # A DFD5xx rule registered without a LogRule would never be matched by the scanner.
    assert {r.code for r in LOG_RULE_LIST} == set(LOG_RULES)


@pytest.mark.parametrize("entry", [e for e in LOG_RULES.values() if e.pattern is not None],
                         ids=lambda e: e.rule.code)
def test_every_line_a_pattern_matches_in_its_example_holds_a_trigger(entry):
    # The prefilter only parses lines holding a trigger word: a pattern that matched a line without one would
    # fire on small logs and silently not on large ones.
    matched = [line for line in entry.rule.bad.splitlines() if entry.pattern.search(line)]
    assert matched, entry.rule.code
    for line in matched:
        assert any(word in line for word in entry.triggers), (entry.rule.code, line)


def test_anchors_cover_every_trigger_word_with_one_of_its_own_bytes():
    anchors = choose_anchors(trigger_words())
    covered = {word for anchor in anchors for word, _ in anchor.words}
    assert covered == {w.encode() for w in trigger_words()}
    for anchor in anchors:
        for word, offset in anchor.words:
            assert word[offset:offset + 1] == anchor.byte
    assert len(anchors) <= 18  # each anchor is one memchr sweep per block (benchmarks/logs_bench.py measures them)


WORDS = ["Traceback (most recent call", "Killed", "OutOfResources", "FX to torch.jit.trace"]
NOISE = st.sampled_from([b"[drafter-0] step=12 loss=2.1 7.1 Ktok/s", b"INFO loader refilled 128 samples",
                         b"Kt Ki Kil Killed? no: Kill", b"", b"TTTT Traceback-ish", b"OutOf Resources",
                         b"\xff\xfe binary \x00"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(NOISE, st.sampled_from([w.encode() for w in WORDS]).map(lambda w: b"x " + w + b" y")),
                max_size=200), st.integers(0, 3))
def test_prefilter_finds_exactly_the_lines_holding_a_word(lines, repeat_k):
    # Repeating a line full of 'K' pushes the 'K' anchor over HIT_LIMIT, so the substring fallback runs too.
    lines = lines + [b"K" * 40] * (repeat_k * HIT_LIMIT)
    block = b"\n".join(lines) + b"\n"
    expected, offset = [], 0
    for line in lines:
        if any(w.encode() in line for w in WORDS):
            expected.append(offset)
        offset += len(line) + 1
    # trailing bytes after `end` (a reused read buffer) must never be read
    assert Prefilter(WORDS).line_starts(block + b"Killed Killed", len(block)) == expected
