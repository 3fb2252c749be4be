"""Text view of `check` facts: one line per part, what ran and how long it took, with the part's headline (the
scan's file count, the guards' or the repro's verdict); the findings follow it (render/text.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from rich.console import Console

    from dflash_doctor.check.facts import CheckFacts


def _headline(facts: CheckFacts, name: str) -> str:
    """The part's result in a few words, read from its own facts; "" for a part that did not run."""
    from rich.markup import escape

    verdict: Optional[str] = None
    if name == "scan" and "scan" in facts:
        files = facts["scan"]["files"]
        return f", {files} file{'' if files == 1 else 's'}"
    if name == "guards" and "guards" in facts:
        verdict = facts["guards"]["verdict"]
    elif name == "repro" and "repro" in facts:
        verdict = facts["repro"].get("verdict")  # None: the repro ended without one (its set-up failed)
    return f", verdict: {escape(str(verdict))}" if verdict is not None else ""


def render_check(console: Console, facts: CheckFacts) -> None:
    for name, seconds in facts["seconds"].items():
        state = "ran" if name in facts["parts"] else "[magenta]could not run[/]"
        console.print(f"[bold]{name}[/] {state} in {seconds:.1f}s{_headline(facts, name)}")
