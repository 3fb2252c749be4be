"""docs/rules.md, generated from the rule registry so the page can never drift from the code.

Regenerate with `python -m dflash_doctor.render.rules_doc --write`; tests/render/test_rules_doc.py fails when the
committed page is stale. `--write` (on the real page) regenerates every other generated doc too:
docs/mitigations.md (render/mitigations_doc.py) and the registries' lists in the hand-written pages
(render/doc_lists.py), so one command follows a new rule, mitigation or format everywhere.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Iterable, List, Optional

from dflash_doctor.render.rule_links import domain_of, rule_anchor

RULES_DOC = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
REGENERATE = "python -m dflash_doctor.render.rules_doc --write"

_FENCE_LANG = {"python": "python", "torch-layout": "python", "log": "text", "nvidia-smi-csv": "csv"}


def _fenced(text: str, lang: str) -> List[str]:
    # A longer fence than any backtick run inside the example keeps the block closed.
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{lang}", text.rstrip("\n"), fence]


def render_rules_markdown(rules: Iterable) -> str:
    rules = list(rules)
    lines = [
        "# Rules",
        "",
        f"<!-- Generated from the rule registry by `{REGENERATE}`; do not edit by hand. -->",
        "",
        "Every code any dflash-doctor command can report. Codes are a public contract: never renumbered or "
        "reused. `dflash-doctor explain CODE` prints the same text in the terminal, and each rule's two "
        "examples run as tests: the first must fire, the second must stay clean.",
        "",
        "| code | name | severity | reported by | summary |",
        "|---|---|---|---|---|",
    ]
    for rule in rules:
        domain, _ = domain_of(rule.code)
        summary = rule.summary.replace("|", "\\|")
        lines.append(
            f"| [{rule.code}](#{rule_anchor(rule)}) | `{rule.name}` | {rule.severity.value} | {domain} | {summary} |"
        )
    current_domain = None
    for rule in rules:
        domain, title = domain_of(rule.code)
        if domain != current_domain:
            lines += ["", f"## {title}"]
            current_domain = domain
        lang = _FENCE_LANG.get(rule.example_format, "text")
        lines += [
            "",
            f"### {rule.code} {rule.name}",
            "",
            f"**Severity:** {rule.severity.value} · **Summary:** {rule.summary}",
            "",
            rule.rationale,
        ]
        if rule.fix:
            lines += ["", f"**Fix:** {rule.fix}"]
        lines += ["", f"Fires ({rule.example_format}):", ""] + _fenced(rule.bad, lang)
        lines += ["", "Clean:", ""] + _fenced(rule.good, lang)
    return "\n".join(lines) + "\n"


def current_rules_markdown() -> str:
    from dflash_doctor.rules import all_rules

    return render_rules_markdown(all_rules())


def main(argv: Optional[List[str]] = None, doc: Path = RULES_DOC) -> int:
    """`--write` regenerates docs/rules.md; `--check` exits 1 when it is stale; with neither, print it."""
    args = sys.argv[1:] if argv is None else argv
    text = current_rules_markdown()
    if "--write" in args:
        doc.write_text(text, encoding="utf-8")
        if doc == RULES_DOC:  # the real page (tests hand a temporary one): every generated doc with it
            from dflash_doctor.render import doc_lists, mitigations_doc

            mitigations_doc.main(["--write"])
            doc_lists.main(["--write"])
        return 0
    if "--check" in args:
        current = doc.read_text(encoding="utf-8") if doc.exists() else ""
        if current != text:
            sys.stderr.write(f"{doc} is stale; regenerate it with: {REGENERATE}\n")
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
