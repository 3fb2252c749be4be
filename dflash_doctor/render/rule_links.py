"""Where a rule is documented: its domain (which command reports it) and its anchor in docs/rules.md.

Apart from rules_doc.py, which writes that page, because the SARIF and JUnit formats link to it too: the page's
generator regenerates every doc, the formats included, so the formats may not import it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

if TYPE_CHECKING:
    from dflash_doctor.rules.registry import Rule

# (first code, last code, which command reports them); codes are grouped by hundreds in the registry.
DOMAINS = (
    (100, 399, "scan", "Static scan of your sources (`dflash-doctor scan`, `check`)"),
    (400, 499, "gpus", "GPU snapshots (`dflash-doctor gpus`, `status`)"),
    (500, 599, "logs", "Training logs (`dflash-doctor logs`, `status`)"),
    (600, 699, "guards", "The installed torch's guards (`dflash-doctor guards`, `check`)"),
    (700, 799, "repro", "Reproductions (`dflash-doctor repro`, `check --repro`)"),
    (800, 899, "pipeline", "The reference pipeline's workers (`dflash-doctor pipeline`)"),
)


def rule_anchor(rule: Rule) -> str:
    """The anchor GitHub derives from the rule's heading (`### DFD101 checkpoint-use-reentrant-true`)."""
    return f"{rule.code.lower()}-{rule.name}"


def code_domain(code: str) -> str:
    """Which part of the tool reports `code`: scan, gpus, logs, guards, repro (or other)."""
    return domain_of(code)[0]


def domain_of(code: str) -> Tuple[str, str]:
    """(domain, the heading docs/rules.md gives its section) of `code`."""
    number = int(code[3:]) if code[3:].isdigit() else -1
    for first, last, name, title in DOMAINS:
        if first <= number <= last:
            return name, title
    return "other", "Other rules"
