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
from typing import TYPE_CHECKING, Iterable, List, Optional

if TYPE_CHECKING:
    from dflash_doctor.rules.registry import Rule

RULES_DOC = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
REGENERATE = "python -m dflash_doctor.render.rules_doc --write"

# (first code, last code, which command reports them); codes are grouped by hundreds in the registry.
_DOMAINS = (
    (100, 399, "scan", "Static scan of your sources (`dflash-doctor scan`, `check`)"),
    (400, 499, "gpus", "GPU snapshots (`dflash-doctor gpus`, `status`)"),
    (500, 599, "logs", "Training logs (`dflash-doctor logs`, `status`)"),
    (600, 699, "guards", "The installed torch's guards (`dflash-doctor guards`, `check`)"),
    (700, 799, "repro", "Reproductions (`dflash-doctor repro`, `check --repro`)"),
    (800, 899, "pipeline", "The reference pipeline's workers (`dflash-doctor pipeline`)"),
)
_FENCE_LANG = {"python": "python", "torch-layout": "python", "log": "text", "nvidia-smi-csv": "csv"}


def rule_anchor(rule: Rule) -> str:
    """The anchor GitHub derives from the rule's heading (`### DFD101 checkpoint-use-reentrant-true`)."""
    return f"{rule.code.lower()}-{rule.name}"


def code_domain(code: str) -> str:
    """Which part of the tool reports `code`: scan, gpus, logs, guards, repro (or other)."""
    return _domain(code)[0]


def _domain(code: str) -> tuple:
    number = int(code[3:]) if code[3:].isdigit() else -1
    for first, last, name, title in _DOMAINS:
        if first <= number <= last:
            return name, title
    return "other", "Other rules"


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
        domain, _ = _domain(rule.code)
        summary = rule.summary.replace("|", "\\|")
        lines.append(
            f"| [{rule.code}](#{rule_anchor(rule)}) | `{rule.name}` | {rule.severity.value} | {domain} | {summary} |"
        )
    current_domain = None
    for rule in rules:
        domain, title = _domain(rule.code)
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
