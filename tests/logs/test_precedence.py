"""The declared precedence of the log rules (dflash_doctor/rules/logs/precedence.py) is what decides which rule takes a
text several rules match. The cases are generated from the declaration: every `contested` line a place gives, and
every line of the rules' own examples that two rules match, each given to the rule placed first; reversing the order
(in a child process, before the scanner is imported) hands every one of them to another rule."""
from __future__ import annotations

import importlib
import json
import pkgutil
import re
import subprocess
import sys
from typing import List, Tuple

import pytest

from dflash_doctor.logs.examples import example_findings
from dflash_doctor.rules import logs as logs_package
from dflash_doctor.rules.logs import DECLARED, LOG_RULES
from dflash_doctor.rules.logs.model import LogRule
from dflash_doctor.rules.logs.precedence import PRECEDENCE, Place, resolve
from tests.conftest import REPO

ORDER = [place.code for place in PRECEDENCE]
# A traceback of the main thread around an exception line, as Python prints it.
TRACEBACK = ('Traceback (most recent call last):\n  File "/srv/job/train.py", line 88, in <module>\n'
             "    loss = step(batch)\n{line}\n")
EXCEPTION_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): ")


def _claims(entry: LogRule, text: str) -> bool:
    """Whether `entry` could take `text` as the scanner reads a line: one of its trigger words, then its pattern."""
    return (entry.pattern is not None and any(word in text for word in entry.triggers)
            and entry.pattern.search(text) is not None)


def claimants(text: str, fatal_only: bool = False) -> List[str]:
    """The rules that match `text`, in the declared order (read from PRECEDENCE, not from LOG_RULES)."""
    return [code for code in ORDER if _claims(DECLARED[code], text) and (DECLARED[code].fatal or not fatal_only)]


def _contests() -> List[Tuple[str, str]]:
    """(where it comes from, the line) of every line two rules match: the places' own, then the examples'."""
    found = [(f"{place.code} contested", line) for place in PRECEDENCE for line in place.contested]
    for code in ORDER:
        rule = DECLARED[code].rule
        for which, example in (("bad", rule.bad), ("good", rule.good)):
            found += [(f"{code} {which}", line) for line in example.splitlines() if len(claimants(line)) >= 2]
    return found


CONTESTS = _contests()


def test_log_rules_are_the_declared_rules_in_the_declared_order():
    assert list(LOG_RULES) == ORDER
    assert set(ORDER) == set(DECLARED)


def test_every_family_module_is_loaded_with_the_package():
    # A family module the package does not import would declare its rules only when something else imports it:
    # import them all, and the rules declared must be those LOG_RULES holds.
    for module in pkgutil.iter_modules(logs_package.__path__):
        importlib.import_module(f"{logs_package.__name__}.{module.name}")
    assert set(DECLARED) == set(LOG_RULES)


def test_a_rule_without_a_place_or_placed_twice_is_refused():
    extra = dict(DECLARED, DFD599=DECLARED["DFD501"])
    with pytest.raises(ValueError, match=r"declared without a place \['DFD599'\]"):
        resolve(extra)
    with pytest.raises(ValueError, match=r"placed but not declared \['DFD501'\]"):
        resolve({code: entry for code, entry in DECLARED.items() if code != "DFD501"})
    with pytest.raises(ValueError, match=r"placed twice \['DFD513'\]"):
        resolve(DECLARED, PRECEDENCE + (Place("DFD513", "again"),))


def test_the_declared_contests_exist():
    # Both the precedence and its tests would mean nothing if no text were claimed by two rules.
    assert {source.split()[1] for source, _ in CONTESTS} >= {"contested", "bad"}
    assert len({tuple(claimants(line)) for _, line in CONTESTS}) >= 10


@pytest.mark.parametrize("place", [p for p in PRECEDENCE if p.contested], ids=lambda p: p.code)
def test_each_contested_line_is_matched_by_its_rule_first_and_by_a_later_one(place):
    for line in place.contested:
        claiming = claimants(line)
        assert claiming[:1] == [place.code], (line, claiming)
        assert len(claiming) >= 2, f"{place.code}: no rule placed after it matches {line!r}"


@pytest.mark.parametrize("source, line", CONTESTS, ids=[source for source, _ in CONTESTS])
def test_a_line_two_rules_match_goes_to_the_rule_placed_first(source, line):
    winner, *losers = claimants(line)
    codes = {finding.code for finding in example_findings(line + "\n")}
    assert winner in codes, (line, codes)
    assert not codes & set(losers), (line, codes)


# Exception lines ('SomeError: message') that two fatal rules match: inside a traceback they name the death.
TRACEBACK_CONTESTS = [(source, line) for source, line in CONTESTS
                      if EXCEPTION_LINE.match(line) and len(claimants(line, fatal_only=True)) >= 2]


@pytest.mark.parametrize("source, line", TRACEBACK_CONTESTS, ids=[source for source, _ in TRACEBACK_CONTESTS])
def test_an_exception_two_fatal_rules_match_is_the_death_of_the_rule_placed_first(source, line):
    winner, *losers = claimants(line, fatal_only=True)
    codes = {finding.code for finding in example_findings(TRACEBACK.format(line=line))}
    assert winner in codes, (line, codes)
    assert not codes & set(losers), (line, codes)


# Run in a child: LOG_RULES resolved again in the reversed order before the scanner (which reads it) is imported.
REVERSED = """
import json, sys
from dflash_doctor.rules import logs
from dflash_doctor.rules.logs.precedence import PRECEDENCE, resolve
reordered = resolve(logs.DECLARED, tuple(reversed(PRECEDENCE)))
logs.LOG_RULES.clear()
logs.LOG_RULES.update(reordered)
from dflash_doctor.logs.examples import example_findings
from dflash_doctor.rules import logs as logs_package
texts = json.load(sys.stdin)
print(json.dumps([sorted({f.code for f in example_findings(text)}) for text in texts]))
"""


def test_the_reversed_order_gives_every_contested_line_to_another_rule():
    lines = [line for _, line in CONTESTS]
    texts = [line + "\n" for line in lines] + [TRACEBACK.format(line=line) for _, line in TRACEBACK_CONTESTS]
    proc = subprocess.run([sys.executable, "-c", REVERSED], input=json.dumps(texts), capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout)
    expected = [claimants(line) for line in lines] + [claimants(line, True) for _, line in TRACEBACK_CONTESTS]
    for text, codes, claiming in zip(texts, found, expected):
        # reversed, the rule placed last among those matching comes first and takes the text
        assert claiming[-1] in codes and claiming[0] not in codes, (text, codes, claiming)
