"""Text view of `logs` facts: the last step, throughput and fate of every thread."""
from __future__ import annotations


def threads_table(facts: dict):
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("thread", "last step", "at line", "tok/s", "fate"):
        table.add_column(column, no_wrap=column != "fate")
    for name, t in facts.get("threads", {}).items():
        death = t.get("died")
        fate = (f"[red]died[/] line {death['line']}: {escape(str(death['exception']))} ({death['code']})"
                if death else "")
        table.add_row(
            escape(name),
            "-" if t.get("last_step") is None else str(t["last_step"]),
            "-" if t.get("last_step_line") is None else str(t["last_step_line"]),
            "-" if t.get("last_tok_s") is None else f"{t['last_tok_s']:,.0f}",
            fate,
        )
    return table


def render_logs(console, facts: dict) -> None:
    mib = facts.get("bytes", 0) / 2 ** 20
    console.print(f"[bold]Log[/] [dim]{facts.get('path')}: {facts.get('lines', 0):,} lines, {mib:,.1f} MiB, "
                  f"{facts.get('exceptions', 0)} traceback block(s)[/]")
    if facts.get("threads"):
        console.print(threads_table(facts))
    if facts.get("suppressed"):
        console.print(f"[dim]findings beyond the per-rule cap, not listed: {facts['suppressed']}[/]")
    console.print()


def render_finding_live(console, finding) -> None:
    """One finding as it is found by --follow (the full report follows at the end)."""
    from rich.markup import escape

    console.print(f"[dim]{escape(str(finding.path))}:{finding.line}:[/] [bold]{finding.code}[/] {finding.name} "
                  f"{escape(finding.message)}")
