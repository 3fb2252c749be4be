"""`dflash-doctor explain CODE`: a rule's rationale, fix and its bad/good examples (the same ones the tests run);
`explain mitigations` (or one mitigation's name): what each fix stops and leaves open, from the registry."""
from __future__ import annotations

from typing import Optional

import typer

from dflash_doctor.commands.common import guarded
from dflash_doctor.errors import UsageError
from dflash_doctor.render.help import epilog


def register(app: typer.Typer) -> None:
    @app.command(
        epilog=epilog(["dflash-doctor explain DFD201", "dflash-doctor explain checkpoint-use-reentrant-true",
                       "dflash-doctor explain mitigations", "dflash-doctor explain threadlocal-flag",
                       "dflash-doctor explain --list"]),
    )
    @guarded
    def explain(
        code: Optional[str] = typer.Argument(
            None, help="Rule code (DFD101) or name (checkpoint-use-reentrant-true); `mitigations`, or a mitigation's "
                       "name (threadlocal-flag)."),
        list_rules: bool = typer.Option(False, "--list", "-l", help="List every rule."),
        as_json: bool = typer.Option(False, "--json", help="Print the rule (or, with --list, all rules) as JSON."),
    ) -> int:
        """Explain a rule: why it matters, how to fix it, and an example that fires and one that does not."""
        from dflash_doctor.render.explain_view import render_rule, render_rule_list, rules_json
        from dflash_doctor.rules import all_rules, lookup

        if list_rules and code is not None:
            raise UsageError(f"give a rule ({code!r}) or --list, not both")
        if code is not None and _explains_mitigations(code):
            return _explain_mitigations(code.strip().lower(), as_json)
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


def _explains_mitigations(code: str) -> bool:
    from dflash_doctor import mitigations as registry

    return code.strip().lower() in ("mitigations", *registry.NAMES)


def _explain_mitigations(name: str, as_json: bool) -> int:
    """The registry's own words: docs/mitigations.md's page, or one entry of it."""
    import json

    import sys

    from dflash_doctor import mitigations as registry
    from dflash_doctor.render.explain_view import render_mitigations
    from dflash_doctor.render.text import console_for

    entries = registry.REGISTRY if name == "mitigations" else (registry.get(name),)
    if as_json:
        typer.echo(json.dumps([{"name": e.name, "summary": e.summary, "api": e.api,
                                "covers": sorted(h.value for h in e.covers), "cost": e.cost,
                                "leaves_open": list(registry.caveats_for((e.name,))),
                                "ladder": [s.value for s in e.ladder], "recommended": e.recommended}
                               for e in entries], indent=2))
    else:
        render_mitigations(console_for(sys.stdout), entries, ranking=name == "mitigations")
    return 0
