"""Text views of `run` and `attach`: what ran, how it ended, which processes the tool saw."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from rich.markup import escape

from dflash_doctor.printable import printable

if TYPE_CHECKING:
    from rich.console import Console

    from dflash_doctor.supervise.facts import AttachFacts, RunFacts


def _ranks(processes: Sequence[Mapping[str, Any]]) -> str:
    ranks = sorted({p["rank"] for p in processes if p.get("rank") is not None})
    return f" (ranks {', '.join(map(str, ranks))})" if ranks else ""


def render_run_facts(console: Console, facts: RunFacts) -> None:
    command = " ".join(facts["command"])
    fixes = ", ".join(facts["fixes"]) or "none"
    console.print(f"[bold]run[/] {escape(printable(command))}  [dim]fixes: {escape(fixes)}; cache: "
                  f"{escape(str(facts['cache']))}[/]")
    for trial in facts["trials"]:
        processes = trial["processes"]
        ended = "killed on hang" if trial["killed_on_hang"] else f"exit {trial['exit_code']}"
        signals = ", ".join(trial["signals_forwarded"])
        console.print(f"  trial {trial['trial']}: {ended} after {trial['seconds']} s, "
                      f"{len(processes)} Python process(es){_ranks(processes)}, {trial['findings']} finding(s)"
                      + (f", forwarded {signals}" if signals else ""))
    rate = facts["rate"]
    if rate["trials"] > 1:
        console.print(f"  [bold]rate[/]: findings in {rate['with_findings']} of {rate['trials']} trials, "
                      f"non-zero exit in {rate['exit_nonzero']}")


def render_attach_facts(console: Console, facts: AttachFacts) -> None:
    console.print(f"[bold]attach[/] pid {facts['pid']}: {facts['samples']} samples "
                  f"{facts['interval_s']} s apart; GPUs: {escape(str(facts['gpus']))}")
    for process in facts["processes"]:
        still = ", ".join(process["still"]) or "none"
        gpus = process["gpus"]
        rank = "" if process["rank"] is None else f" rank {process['rank']}"
        held = f" on GPU {', '.join(map(str, gpus))}" if gpus else ""
        console.print(f"  pid {process['pid']}{rank}{held}: {len(process['threads'])} threads, not "
                      f"moving: {escape(printable(still))}")
    children = facts.get("python_children") or []
    if children:
        console.print(f"  [yellow]hint[/]: pid {facts['pid']} has Python child process(es) "
                      f"{', '.join(map(str, children[:8]))}{' ...' if len(children) > 8 else ''} that were not "
                      f"read; a launcher's (or `dflash-doctor run`'s) workers are its children: attach again with "
                      f"--subprocesses")
