"""Text view of `gpus` facts: one row per GPU with utilization and memory bars, the processes, the next step."""
from __future__ import annotations

from typing import TYPE_CHECKING

from typing import Optional

from dflash_doctor.render.logs_view import render_next_steps, safe

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from dflash_doctor.gpus.facts import GpusFacts

BAR = 20


def bar(fraction: Optional[float], width: int = BAR) -> str:
    if fraction is None:
        return "[dim]" + "?" * 1 + " " * (width - 1) + "[/]"
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * width)
    colour = "red" if fraction >= 0.95 else "yellow" if fraction >= 0.75 else "green"
    return f"[{colour}]" + "█" * filled + "[/][dim]" + "░" * (width - filled) + "[/]"


def gpus_table(console: Console, facts: GpusFacts) -> RenderableType:
    """One row per GPU; the bar and its figure share a cell, so a list layout keeps them together."""
    from dflash_doctor.render.tables import Column, fitted

    gpus = facts.get("gpus", [])
    columns = [Column("gpu", "right", wrap=False), Column("role", wrap=False), Column("utilization", wrap=False),
               Column("memory", wrap=False), Column("procs", "right", wrap=False)]
    rows = []
    largest = max((g["memory_used_mib"] or 0 for g in gpus), default=0) or None
    for g in gpus:
        if g.get("lost"):
            rows.append([str(g["index"]), safe(g.get("role") or "-"), "[magenta]lost[/]", "", ""])
            continue
        util, used, total = g.get("utilization"), g.get("memory_used_mib"), g.get("memory_total_mib")
        scale = total or largest
        memory = "?" if used is None else f"{used / 1024:.1f}" + (f"/{total / 1024:.0f} GiB" if total else " GiB")
        rows.append([
            str(g["index"]), safe(g.get("role") or "-"),
            f"{bar(None if util is None else util / 100)} {'?' if util is None else f'{util:.0f} %'}",
            f"{bar(None if used is None or not scale else used / scale)} {memory}", str(len(g.get("processes", []))),
        ])
    return fitted(console, columns, rows)


def processes_table(console: Console, facts: GpusFacts) -> Optional[RenderableType]:
    from dflash_doctor.render.tables import Column, fitted

    found = [(g["index"], p) for g in facts.get("gpus", []) for p in g.get("processes", [])]
    if not found:
        return None
    columns = [Column(header, wrap=header == "name") for header in ("gpu", "pid", "name", "threads", "state", "memory")]
    rows = []
    for index, p in found:
        state = p.get("state") or "?"
        rows.append([str(index), str(p["pid"]), safe(p.get("name") or "?"),
                     "?" if p.get("threads") is None else str(p["threads"]),
                     f"[red]{state}[/]" if state in ("zombie", "gone") else state,
                     "?" if p.get("used_mib") is None else f"{p['used_mib']:.0f} MiB"])
    return fitted(console, columns, rows)


def render_gpus(console: Console, facts: GpusFacts) -> None:
    if not facts.get("gpus"):
        return
    if facts.get("source") == "nvml":
        source = f"NVML, {facts.get('samples', 1)} sample(s)"
    else:
        source = safe(facts.get("path"))
    console.print(f"[bold]GPUs[/] [dim]({source})[/]")
    console.print(gpus_table(console, facts))
    processes = processes_table(console, facts)
    if processes is not None:
        console.print(processes)
    for skipped in facts.get("skipped_checks", []):
        console.print(f"[dim]not checked: {safe(skipped)}[/]")
    render_next_steps(console, facts.get("next_steps"))
    console.print()
