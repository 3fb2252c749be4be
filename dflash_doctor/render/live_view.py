"""Text views of `run` and `attach`: what ran, how it ended, which processes the tool saw."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Mapping, Sequence

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
    if facts.get("amplifiers") and not facts.get("proof"):
        console.print(f"  amplifiers: {escape(', '.join(facts['amplifiers']))}")
    proof = facts.get("proof")
    if proof:
        from dflash_doctor.render.proof_view import render_proof_facts

        render_proof_facts(console, proof)
    else:
        for line in facts.get("advice") or []:
            console.print(f"  [dim]advice:[/] {escape(printable(line))}")


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


def finding_lines(code_and_name: str, where: str, message: str, details: Sequence[str], steps: Sequence[str],
                  width: int) -> List[str]:
    """A `run` / `attach` finding laid out for a person at `width` columns (80 on a plain terminal): where and
    which rule on the first line, then the facts that matter one to a line (who died or hung, when, who is to
    blame, each at the user's line), then the fix as a list. Lines are broken at spaces only, never inside a word
    or a path; a path longer than the line stays whole on its own line."""
    width = max(width, 40)
    if where and len(where) + len(code_and_name) > width:  # the location alone, then the rule: no line breaks
        lines = [where.rstrip(), code_and_name]
    else:
        lines = [f"{where}{code_and_name}"]
    lines += _wrapped(message, "  ", "    ", width)
    for detail in details:
        lines += _wrapped(detail, "  ", "      ", width)
    if steps:
        lines.append("  fix:")
        for step in steps:
            lines += _wrapped(step, "    - ", "      ", width)
    return lines


def _wrapped(text: str, first: str, rest: str, width: int) -> List[str]:
    import textwrap

    return textwrap.wrap(printable(text), width=width, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False) or [first.rstrip()]
