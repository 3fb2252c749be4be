"""The scan rules as declared in rules/scan.py: each declaration is complete, and what the scanner derives from it
(the byte prefilter, the candidate lines, the checks it runs) lets the rule's bad example through the whole
`scan` path, not only through `scan_source`, which skips the prefilter."""
from __future__ import annotations

import pytest

from dflash_doctor.rules import all_rules
from dflash_doctor.rules import scan as table
from dflash_doctor.rules.registry import Rule
from dflash_doctor.rules.scan import SCAN_RULES
from dflash_doctor.scan import scan_paths
from dflash_doctor.scan.analysis import CHECKS
from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.source_file import triggered
from tests.scan.test_rules import marked_lines as marked

DECLARED = list(SCAN_RULES.values())
FOUND_BY_CHECKS = [entry for entry in DECLARED if not entry.after_files]


def test_every_rule_of_the_scan_table_is_declared_with_how_it_is_found():
    # A Rule registered with register() instead of declare() would be explained, but never scanned for.
    in_table = {value.code for value in vars(table).values() if isinstance(value, Rule)}
    with_python_examples = {rule.code for rule in all_rules() if rule.example_format == "python"}
    assert in_table == with_python_examples == set(SCAN_RULES)


@pytest.mark.parametrize("entry", DECLARED, ids=lambda entry: entry.rule.code)
def test_every_declaration_is_complete(entry):
    rule = entry.rule
    assert rule.bad.strip() and rule.good.strip() and rule.rationale and rule.fix
    assert marked(rule.bad, rule.code), f"{rule.code}'s bad example marks no line"
    if entry.after_files:  # judged from what the other rules left: nothing of its own to find
        assert (entry.checks, entry.words, entry.triggers) == ((), (), ())
    else:
        assert entry.checks, f"{rule.code} names no check that reports it"
        assert entry.words, f"{rule.code} has no candidate-line words: no line would be looked at"
        assert entry.triggers, f"{rule.code} has no byte trigger: no file would be parsed for it"
        assert len(CHECKS[rule.code]) == len(entry.checks)
        assert all(issubclass(check, FileCheck) for check in CHECKS[rule.code])


@pytest.mark.parametrize("entry", FOUND_BY_CHECKS, ids=lambda entry: entry.rule.code)
def test_the_bad_example_passes_its_own_byte_trigger_and_the_good_one_need_not(entry):
    code = entry.rule.code
    assert triggered(entry.rule.bad.encode(), {code}) == {code}
    assert triggered(b"import os\nprint(os.getcwd())\n", {code}) == frozenset()


@pytest.mark.parametrize("entry", DECLARED, ids=lambda entry: entry.rule.code)
def test_the_bad_example_fires_through_scan_paths(entry, tmp_path):
    rule = entry.rule
    path = tmp_path / "example.py"
    path.write_text(rule.bad, encoding="utf-8")
    report = scan_paths([path], jobs=1, transformers=lambda: None)
    assert [(f.line, f.code) for f in report.sorted_findings()] == marked(rule.bad, rule.code)
    assert report.problems == [] and report.facts["parsed"] == 1
    only_this_rule = scan_paths([path], jobs=1, select=rule.code, transformers=lambda: None)
    if not entry.after_files:  # DFD302 needs a rule that ran to suppress nothing
        assert [(f.line, f.code) for f in only_this_rule.sorted_findings()] == marked(rule.bad, rule.code)
