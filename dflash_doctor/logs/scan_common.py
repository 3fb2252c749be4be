"""What every part of a log scan reads alike: the name of the unnamed thread, the cap on quoted messages, the rule
views the parts try in LOG_RULES order, and the two small readings of an exception's text.

Kept apart from scan_context.py so that the death ledger, which the context holds, can use them too.
"""
from __future__ import annotations

from typing import Optional, Tuple

from dflash_doctor.logs import patterns
from dflash_doctor.rules.logs import LOG_RULES, UNNAMED, LogRule

MAIN = UNNAMED  # lines that name no thread
MESSAGE_CHARS = 300

# The views of the one registry the parts need. Declaration order is kept: which rule wins a match depends on it.
FATAL_RULES: Tuple[LogRule, ...] = tuple(entry for entry in LOG_RULES.values() if entry.fatal and entry.pattern)
LINE_RULES: Tuple[LogRule, ...] = tuple(entry for entry in LOG_RULES.values() if entry.pattern is not None)
FATAL_CODES = frozenset(entry.rule.code for entry in FATAL_RULES)


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def exception_type(line: str) -> Optional[str]:
    match = patterns.EXCEPTION_LINE.match(line.strip())
    return match.group("type") if match else None
