"""Text views of the rule registry for `explain`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

import sys

from dflash_doctor.render.text import _STYLE, console_for

if TYPE_CHECKING:
    from rich.console import Console

    from dflash_doctor.mitigations import Mitigation
    from dflash_doctor.rules.registry import Rule


def render_rule_list(rules: Iterable[Rule]) -> None:
    from rich.markup import escape

    from dflash_doctor.render.tables import Column, fitted

    console = console_for(sys.stdout)
    columns = [Column("code", wrap=False), Column("name", wrap=False), Column("severity", wrap=False),
               Column("summary")]
    rows = [[rule.code, escape(rule.name), f"[{_STYLE[rule.severity]}]{rule.severity.value}[/]", escape(rule.summary)]
            for rule in rules]
    console.print(fitted(console, columns, rows))


def render_rule(rule: Rule) -> None:
    from rich.markup import escape
    from rich.syntax import Syntax

    console = console_for(sys.stdout)
    console.print(f"[bold]{rule.code}[/] {rule.name} ([{_STYLE[rule.severity]}]{rule.severity.value}[/])")
    console.print(escape(rule.summary))
    console.print()
    console.print(escape(rule.rationale))
    if rule.fix:
        console.print(f"\n[bold]Fix:[/] {escape(rule.fix)}")
    lexer = "python" if rule.example_format in ("python", "torch-layout") else "text"
    console.print("\n[bold red]Bad[/] (fires):")
    console.print(Syntax(rule.bad.rstrip("\n"), lexer, line_numbers=False, theme="ansi_dark"))
    console.print("\n[bold green]Good[/] (clean):")
    console.print(Syntax(rule.good.rstrip("\n"), lexer, line_numbers=False, theme="ansi_dark"))


def rules_json(rules: Sequence[Rule], *, single: bool) -> str:
    import json

    docs = [
        {
            "code": r.code, "name": r.name, "severity": r.severity.value, "summary": r.summary,
            "rationale": r.rationale, "fix": r.fix, "example_format": r.example_format, "bad": r.bad, "good": r.good,
        }
        for r in rules
    ]
    return json.dumps(docs[0] if single else docs, indent=2)


def render_mitigations(console: Console, entries: Sequence[Mitigation], *, ranking: bool) -> None:
    """`explain mitigations` (or one of them) for a terminal: the registry's words as docs/mitigations.md has
    them, laid out as text instead of Markdown."""
    from rich.markup import escape

    from dflash_doctor.render.mitigations_doc import entry_fields, ranking_rows

    if ranking:
        console.print("[bold]Mitigations[/]: every fix repro --mitigation / --matrix, pipeline --mitigation, guards "
                      "and scan know. A fix holds only after repro put it through every stress of its ladder "
                      "against a baseline that reproduced under the same stresses.")
        console.print("\n[bold]Ranking per release[/] (best first; guards ranks for the installed torch; measured: "
                      "those fixes ran on that release, inferred: derived from another release and the source)")
        for family, hazards, plain, with_trace in ranking_rows():
            console.print(f"  [bold]torch {escape(family)}[/] [dim](hazards: {escape(hazards)})[/]")
            for title, fixes in (("any threaded trainer", plain), ("with a thread running its own FX trace",
                                                                   with_trace)):
                console.print(f"    {title}:")
                for rank, (fix, gaps, evidence) in enumerate(fixes, 1):
                    left = f" [yellow](leaves {escape(gaps)})[/]" if gaps else ""
                    console.print(f"      {rank}. {escape(fix)}{left} [dim]{escape(evidence)}[/]")
        console.print()
    for entry in entries:
        flag = " [yellow](not a fix)[/]" if not entry.recommended else ""
        console.print(f"[bold cyan]{escape(entry.name)}[/]{flag}: {escape(entry.summary)}")
        for label, text in entry_fields(entry):
            console.print(f"  [dim]{escape(label)}:[/] {escape(text)}")
        console.print()
