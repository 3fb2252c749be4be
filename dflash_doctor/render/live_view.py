"""Text views of `run` and `attach`: what ran, how it ended, which processes the tool saw."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from rich.markup import escape

from dflash_doctor.printable import printable

if TYPE_CHECKING:
    from rich.console import Console


def _ranks(processes: Sequence[Mapping[str, Any]]) -> str:
    ranks = sorted({p["rank"] for p in processes if p.get("rank") is not None})
    return f" (ranks {', '.join(map(str, ranks))})" if ranks else ""


def render_run_facts(console: Console, facts: dict) -> None:
    command = " ".join(facts.get("command") or [])
    fixes = ", ".join(facts.get("fixes") or []) or "none"
    console.print(f"[bold]run[/] {escape(printable(command))}  [dim]fixes: {escape(fixes)}; cache: "
                  f"{escape(str(facts.get('cache')))}[/]")
    for trial in facts.get("trials") or []:
        processes = trial.get("processes") or []
        ended = "killed on hang" if trial.get("killed_on_hang") else f"exit {trial.get('exit_code')}"
        signals = ", ".join(trial.get("signals_forwarded") or [])
        console.print(f"  trial {trial.get('trial')}: {ended} after {trial.get('seconds')} s, "
                      f"{len(processes)} Python process(es){_ranks(processes)}, {trial.get('findings')} finding(s)"
                      + (f", forwarded {signals}" if signals else ""))
    rate = facts.get("rate") or {}
    if rate.get("trials", 0) > 1:
        console.print(f"  [bold]rate[/]: findings in {rate.get('with_findings')} of {rate.get('trials')} trials, "
                      f"non-zero exit in {rate.get('exit_nonzero')}")


def render_attach_facts(console: Console, facts: dict) -> None:
    console.print(f"[bold]attach[/] pid {facts.get('pid')}: {facts.get('samples')} samples "
                  f"{facts.get('interval_s')} s apart; GPUs: {escape(str(facts.get('gpus')))}")
    for process in facts.get("processes") or []:
        still = ", ".join(process.get("still") or []) or "none"
        gpus = process.get("gpus")
        rank = "" if process.get("rank") is None else f" rank {process['rank']}"
        held = f" on GPU {', '.join(map(str, gpus))}" if gpus else ""
        console.print(f"  pid {process.get('pid')}{rank}{held}: {len(process.get('threads') or [])} threads, not "
                      f"moving: {escape(printable(still))}")
