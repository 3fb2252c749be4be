"""docs/rules.md is generated from the registry; this fails when someone adds or edits a rule and forgets it."""
from __future__ import annotations

import re

from dflash_doctor.render.rules_doc import REGENERATE, RULES_DOC, current_rules_markdown, main, rule_anchor
from dflash_doctor.rules import all_rules


def test_docs_rules_md_is_up_to_date():
    committed = RULES_DOC.read_text(encoding="utf-8") if RULES_DOC.exists() else ""
    assert committed == current_rules_markdown(), f"docs/rules.md is stale; run: {REGENERATE}"


def test_every_rule_has_a_heading_whose_anchor_sarif_links_to():
    text = current_rules_markdown()
    headings = re.findall(r"^### (DFD\d{3}) (\S+)$", text, flags=re.MULTILINE)
    assert headings == [(r.code, r.name) for r in all_rules()]
    for rule in all_rules():
        # GitHub's anchor for "### DFD101 checkpoint-use-reentrant-true": lowercase, spaces to hyphens.
        assert rule_anchor(rule) == f"{rule.code} {rule.name}".lower().replace(" ", "-")
        assert f"](#{rule_anchor(rule)})" in text
        assert rule.bad.rstrip("\n") in text and rule.good.rstrip("\n") in text


def test_check_mode_reports_staleness(tmp_path, capsys):
    stale = tmp_path / "rules.md"
    stale.write_text("# Rules\n")
    assert main(["--check"], doc=stale) == 1
    assert REGENERATE in capsys.readouterr().err
    assert main(["--write"], doc=stale) == 0
    assert main(["--check"], doc=stale) == 0
    assert stale.read_text() == current_rules_markdown()
