"""Text view of `status`: who died, what killed them, what they left idle, what the others do, what to try."""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Set

from dflash_doctor.render.logs_view import render_next_steps, safe

if TYPE_CHECKING:
    from rich.console import Console

    from dflash_doctor.status.facts import StatusFacts
    from dflash_doctor.status.facts import WorkerFacts as StatusWorkerFacts


def _gib(mib: Optional[float]) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f} GiB"


def render_status(console: Console, facts: StatusFacts) -> None:
    workers = facts.get("workers", [])
    dead = [w for w in workers if w["state"] == "dead"]
    _render_dead(console, dead)
    console.print("\n[bold]The others[/]")
    _render_alive(console, workers)
    _render_gpus(console, facts, {w["gpu"] for w in dead})
    console.print()
    render_next_steps(console, facts.get("next_steps"))
    console.print()


def _render_dead(console: Console, dead: List[StatusWorkerFacts]) -> None:
    console.print("[bold]Dead workers[/]")
    if not dead:
        console.print("  none in the log")
    # A dead worker always has its cause (status/join.py sets both from the log's death).
    causes = [(w, w["cause"]) for w in dead if w["cause"] is not None]
    for w, cause in sorted(causes, key=lambda pair: (not pair[1].get("root_cause"), pair[1]["line"])):
        what = cause.get("exception") or (f"killed by {cause['signal']}" if cause.get("signal") else "died")
        first = " [bold](failed first)[/]" if cause.get("root_cause") else ""
        step = "" if w["last_step"] is None else f", last step {w['last_step']}"
        console.print(f"  [red]{safe(w['thread'])}[/] died at log line {cause['line']}{step}: {safe(what)} "
                      f"({cause['code']}){first}")
        if cause.get("message"):
            console.print(f"    [dim]{safe(cause['message'])}[/]")
        if w["gpu"] is None:
            console.print("    GPU unknown: pass --roles or --map NAME=GPU")
            continue
        left = (f"left GPU {w['gpu']} ({safe(w['role'] or 'no role')}) at "
                f"{'?' if w['gpu_utilization'] is None else format(w['gpu_utilization'], '.0f')} % holding "
                f"{_gib(w['gpu_memory_used_mib'])}")
        codes = ", ".join(w["gpu_findings"])
        console.print(f"    {left}" + (f" [dim]({codes})[/]" if codes else ""))


def _render_alive(console: Console, workers: List[StatusWorkerFacts]) -> None:
    for w in workers:
        if w["state"] == "dead":
            continue
        step = "no step logged" if w["last_step"] is None else f"step {w['last_step']}"
        rate = "" if w["last_tok_s"] is None else f", {w['last_tok_s']:,.0f} tok/s"
        gpu = "" if w["gpu"] is None else f" on GPU {w['gpu']}"
        console.print(f"  {safe(w['thread'])}{gpu}: {w['state']}, {step}{rate}")


def _render_gpus(console: Console, facts: StatusFacts, dead_gpus: Set[Optional[int]]) -> None:
    """The GPUs no dead worker explains: a live worker's with findings, and those with no worker at all."""
    for g in facts.get("gpus", []):
        if g["gpu"] in dead_gpus or (g["thread"] is not None and not g["findings"]):
            continue
        util = "?" if g["utilization"] is None else f"{g['utilization']:.0f} %"
        codes = f" [yellow]{', '.join(g['findings'])}[/]" if g["findings"] else ""
        who = f" ({safe(g['thread'])})" if g["thread"] else ""
        console.print(f"  GPU {g['gpu']} {safe(g['role'] or '')}{who}: {util}, {_gib(g['memory_used_mib'])}{codes}")
    if facts.get("unexplained_idle_gpus"):
        console.print(f"  [yellow]idle GPUs with no dead worker mapped to them:[/] "
                      f"{', '.join(map(str, facts['unexplained_idle_gpus']))}")
