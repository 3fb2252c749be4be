"""Human output: findings like a linter (path:line:col CODE name message), facts views, problems on stderr."""
from __future__ import annotations

from typing import Optional, TextIO

from dflash_doctor.findings import Report, Severity

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def console_for(stream: TextIO):
    from rich.console import Console

    return Console(file=stream, highlight=False, soft_wrap=True)


def render_text(report: Report, out: TextIO, err: TextIO, *, facts_view=None, exit_code: int) -> None:
    from rich.markup import escape

    console = console_for(out)
    if facts_view is not None:
        facts_view(console, report.facts)
    for f in report.sorted_findings():
        where = f"{f.path}:{f.line}:{f.column}: " if f.path else ""
        console.print(
            f"{escape(where)}[{_STYLE[f.severity]}]{f.code}[/] [bold]{f.name}[/] {escape(f.message)}"
        )
        chain = f.evidence.get("chain") if isinstance(f.evidence, dict) else None
        if chain:
            console.print(f"    [dim]via {escape(' -> '.join(map(str, chain)))}[/]")
    render_problems_and_summary(report, err, exit_code)


def render_problems_and_summary(report: Report, err: TextIO, exit_code: int, summary: Optional[str] = None) -> None:
    from rich.markup import escape

    console = console_for(err)
    for p in report.problems:
        hint = f" [dim]({escape(p.hint)})[/]" if p.hint else ""
        console.print(f"[magenta]could not check[/] {escape(p.subject)}: {escape(p.reason)}{hint}")
    counts = {s: sum(1 for f in report.findings if f.severity is s) for s in Severity}
    parts = [f"{n} {s.value}{'s' if n != 1 else ''}" for s, n in counts.items() if n]
    found = ", ".join(parts) if parts else "no findings"
    probs = f", {len(report.problems)} problem{'s' if len(report.problems) != 1 else ''}" if report.problems else ""
    console.print(f"[dim]{report.command}: {summary or found}{probs} (exit {exit_code})[/]")
