"""Text view of `logs` facts: every worker's last step, throughput and fate, the root cause, and what to do next."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from dflash_doctor.printable import printable_log as printable  # tabs spelled out, as logs/ shows them

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from dflash_doctor.findings import Finding

    from dflash_doctor.logs.facts import LogsFacts


def safe(value: object) -> str:
    from rich.markup import escape

    return escape(printable(str(value)))


THREAD_COLUMNS = ("worker", "last step", "at line", "rate", "fate")


def threads_table(console: Console, facts: LogsFacts) -> RenderableType:
    from dflash_doctor.render.tables import Column, fitted

    columns = [Column(header, wrap=header == "fate") for header in THREAD_COLUMNS]
    rows = []
    for name, t in facts.get("threads", {}).items():
        death = t.get("died")
        fate = ""
        if death:
            why = death.get("exception") or (f"killed by {death['signal']}" if death.get("signal") else "died")
            fate = f"[red]died[/] line {death['line']}: {safe(why)} ({death['code']})"
            if death.get("root_cause"):
                fate += " [bold]root cause[/]"
            if death.get("gpu") is not None:
                fate += f", GPU {death['gpu']}"
        rate = t.get("last_rate")
        rows.append([
            safe(name),
            "-" if t.get("last_step") is None else str(t["last_step"]),
            "-" if t.get("last_step_line") is None else str(t["last_step_line"]),
            "-" if rate is None else f"{rate:,.0f} {t.get('rate_unit') or ''}".strip(),
            fate,
        ])
    return fitted(console, columns, rows)


def render_next_steps(console: Console, steps: Optional[Sequence[str]]) -> None:
    if not steps:
        return
    console.print("[bold]Next[/]")
    for step in steps:
        console.print(f"  • {safe(step)}")


def render_logs(console: Console, facts: LogsFacts) -> None:
    mib = facts.get("bytes", 0) / 2 ** 20
    compression = f", {facts['compression']}-compressed" if facts.get("compression") else ""
    console.print(f"[bold]Log[/] [dim]{safe(facts.get('path'))}: {facts.get('lines', 0):,} lines, {mib:,.1f} MiB"
                  f"{compression}, {facts.get('exceptions', 0)} traceback block(s)[/]")
    if facts.get("threads"):
        console.print(threads_table(console, facts))
    root = facts.get("root_cause")
    if root:
        how = f"killed by {root['signal']}" if root.get("signal") else f"exit code {root.get('exitcode')}"
        console.print(f"torchrun: rank {root.get('rank')} failed first ({safe(how)}, host "
                      f"{safe(root.get('host') or '?')})")
    if facts.get("progress_sampled"):
        console.print("[dim]throughput sampled (the end of every MiB of log); deaths and errors read in full[/]")
    if facts.get("suppressed"):
        console.print(f"[dim]findings beyond the per-rule cap, not listed: {facts['suppressed']}[/]")
    render_next_steps(console, facts.get("next_steps"))
    console.print()


def render_finding_live(console: Console, finding: Finding) -> None:
    """One finding as it is found by --follow (the full report follows at the end)."""
    console.print(f"[dim]{safe(finding.path)}:{finding.line}:[/] [bold]{finding.code}[/] {finding.name} "
                  f"{safe(finding.message)}")
