"""Text view of `gpus` facts: one row per GPU with utilization and memory bars, the processes, the next step."""
from __future__ import annotations

from typing import Optional

from dflash_doctor.render.logs_view import render_next_steps, safe

BAR = 20


def bar(fraction: Optional[float], width: int = BAR) -> str:
    if fraction is None:
        return "[dim]" + "?" * 1 + " " * (width - 1) + "[/]"
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * width)
    colour = "red" if fraction >= 0.95 else "yellow" if fraction >= 0.75 else "green"
    return f"[{colour}]" + "█" * filled + "[/][dim]" + "░" * (width - filled) + "[/]"


def gpus_table(facts: dict):
    from rich.table import Table

    gpus = facts.get("gpus", [])
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("gpu", "role", "utilization", "", "memory", "", "procs"):
        table.add_column(column, no_wrap=True, justify="right" if column in ("gpu", "procs") else "left")
    largest = max((g["memory_used_mib"] or 0 for g in gpus), default=0) or None
    for g in gpus:
        if g.get("lost"):
            table.add_row(str(g["index"]), safe(g.get("role") or "-"), "[magenta]lost[/]", "", "", "", "")
            continue
        util, used, total = g.get("utilization"), g.get("memory_used_mib"), g.get("memory_total_mib")
        scale = total or largest
        memory = "?" if used is None else f"{used / 1024:.1f}" + (f"/{total / 1024:.0f} GiB" if total else " GiB")
        table.add_row(
            str(g["index"]), safe(g.get("role") or "-"),
            bar(None if util is None else util / 100), "?" if util is None else f"{util:.0f} %",
            bar(None if used is None or not scale else used / scale), memory, str(len(g.get("processes", []))),
        )
    return table


def processes_table(facts: dict):
    from rich.table import Table

    rows = [(g["index"], p) for g in facts.get("gpus", []) for p in g.get("processes", [])]
    if not rows:
        return None
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("gpu", "pid", "name", "threads", "state", "memory"):
        table.add_column(column, no_wrap=True)
    for index, p in rows:
        state = p.get("state") or "?"
        table.add_row(str(index), str(p["pid"]), safe(p.get("name") or "?"),
                      "?" if p.get("threads") is None else str(p["threads"]),
                      f"[red]{state}[/]" if state in ("zombie", "gone") else state,
                      "?" if p.get("used_mib") is None else f"{p['used_mib']:.0f} MiB")
    return table


def render_gpus(console, facts: dict) -> None:
    if not facts.get("gpus"):
        return
    if facts.get("source") == "nvml":
        source = f"NVML, {facts.get('samples', 1)} sample(s)"
    else:
        source = safe(facts.get("path"))
    console.print(f"[bold]GPUs[/] [dim]({source})[/]")
    console.print(gpus_table(facts))
    processes = processes_table(facts)
    if processes is not None:
        console.print(processes)
    for skipped in facts.get("skipped_checks", []):
        console.print(f"[dim]not checked: {safe(skipped)}[/]")
    render_next_steps(console, facts.get("next_steps"))
    console.print()
