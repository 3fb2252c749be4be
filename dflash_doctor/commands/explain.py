"""`dflash-doctor explain CODE`: a rule's rationale, fix and its bad/good examples (the same ones the tests run)."""
from __future__ import annotations

from typing import Optional

import typer

from dflash_doctor.commands.common import guarded
from dflash_doctor.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command(
        epilog="Examples:  dflash-doctor explain DFD201  ·  dflash-doctor explain checkpoint-use-reentrant-true  ·  "
        "dflash-doctor explain --list",
    )
    @guarded
    def explain(
        code: Optional[str] = typer.Argument(None, help="Rule code (DFD101) or name (checkpoint-use-reentrant-true)."),
        list_rules: bool = typer.Option(False, "--list", "-l", help="List every rule."),
        as_json: bool = typer.Option(False, "--json", help="Print the rule (or, with --list, all rules) as JSON."),
    ) -> int:
        """Explain a rule: why it matters, how to fix it, and an example that fires and one that does not."""
        from dflash_doctor.render.explain_view import render_rule, render_rule_list, rules_json
        from dflash_doctor.rules import all_rules, lookup

        if list_rules and code is not None:
            raise UsageError(f"give a rule ({code!r}) or --list, not both")
        if list_rules or code is None:
            rules = all_rules()
        else:
            rule = lookup(code)
            if rule is None:
                raise UsageError(f"unknown rule {code!r}; `dflash-doctor explain --list` shows them all")
            rules = [rule]
        if as_json:
            typer.echo(rules_json(rules, single=not (list_rules or code is None)))
        elif list_rules or code is None:
            render_rule_list(rules)
        else:
            render_rule(rules[0])
        return 0
