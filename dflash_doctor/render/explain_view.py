"""Text views of the rule registry for `explain`."""
from __future__ import annotations

import sys

from dflash_doctor.render.text import _STYLE, console_for


def render_rule_list(rules) -> None:
    from rich.markup import escape

    from dflash_doctor.render.tables import Column, fitted

    console = console_for(sys.stdout)
    columns = [Column("code", wrap=False), Column("name", wrap=False), Column("severity", wrap=False),
               Column("summary")]
    rows = [[rule.code, escape(rule.name), f"[{_STYLE[rule.severity]}]{rule.severity.value}[/]", escape(rule.summary)]
            for rule in rules]
    console.print(fitted(console, columns, rows))


def render_rule(rule) -> None:
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


def rules_json(rules, *, single: bool) -> str:
    import json

    docs = [
        {
            "code": r.code, "name": r.name, "severity": r.severity.value, "summary": r.summary,
            "rationale": r.rationale, "fix": r.fix, "example_format": r.example_format, "bad": r.bad, "good": r.good,
        }
        for r in rules
    ]
    return json.dumps(docs[0] if single else docs, indent=2)
