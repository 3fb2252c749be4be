"""The lists of registry entries inside the hand-written docs (README.md, docs/*.md) are the registries' own:
render/doc_lists.py regenerates them, so adding a format, a rule or a mitigation touches no hand-written page."""
from __future__ import annotations

import re

import pytest

from dflash_doctor.render import doc_lists
from dflash_doctor.render.doc_lists import DOC_LISTS, REGENERATE, REPO, hand_written_docs, regenerate
from dflash_doctor.render.formats import OutputFormat
from dflash_doctor.rules import all_rules


def test_every_list_in_the_docs_is_the_registrys():
    assert doc_lists.stale_pages() == [], f"regenerate: {REGENERATE}"


@pytest.mark.parametrize("doc_list", DOC_LISTS, ids=lambda d: d.what)
def test_every_pattern_still_finds_its_list(doc_list):
    # a page reworded so that its list no longer matches would silently stop being regenerated
    assert doc_lists.found_per_list()[doc_list.what] > 0, doc_list.what


def test_a_stale_list_is_rewritten_from_the_registry():
    formats = DOC_LISTS[0]
    text, found = regenerate("takes `--format text|json` and `--output FILE`", formats)
    assert found == 1 and text == f"takes `--format {'|'.join(f.value for f in OutputFormat)}` and `--output FILE`"
    ranges = next(d for d in DOC_LISTS if "range" in d.what)
    logs = sorted(rule.code for rule in all_rules() if rule.code.startswith("DFD5"))
    assert regenerate("(DFD501-502: deaths)", ranges)[0] == f"(DFD501-{logs[-1][3:]}: deaths)"
    assert regenerate("(DFD502-503: a part)", ranges)[0] == "(DFD502-503: a part)"  # not from the first: kept


def test_every_code_the_docs_name_is_registered():
    codes = {rule.code for rule in all_rules()}
    for page in hand_written_docs():
        named = set(re.findall(r"\bDFD\d{3}\b", (REPO / page).read_text(encoding="utf-8")))
        assert named <= codes, (page, sorted(named - codes))
