"""Text views of the rule registry for `explain`."""
from __future__ import annotations

import sys

from dflash_doctor.render.text import _STYLE, console_for


def render_rule_list(rules) -> None:
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None)
    for column in ("code", "name", "severity", "summary"):
        table.add_column(column, no_wrap=column in ("code", "name", "severity"))
    for rule in rules:
        table.add_row(rule.code, rule.name, f"[{_STYLE[rule.severity]}]{rule.severity.value}[/]", rule.summary)
    console_for(sys.stdout).print(table)


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
