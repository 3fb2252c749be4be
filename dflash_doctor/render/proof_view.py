"""Text view of `run --fix`'s proof against its baseline: per race, the rate without and with the fix and the
verdict in repro's words, the amplifiers that ran (to reproduce the result), the next step, the fix to apply."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape

from dflash_doctor.printable import printable

if TYPE_CHECKING:
    from rich.console import Console

    from dflash_doctor.supervise.facts import ProofFacts

_STYLE = {"holds": "bold green", "fails": "bold red", "inconclusive": "yellow"}


def render_proof_facts(console: Console, proof: ProofFacts) -> None:
    label = ",".join(proof["fixes"])
    base, fix = proof["baseline"], proof["fix"]
    console.print(f"[bold]proof[/] --fix {escape(label)} against the same command without it: "
                  f"{base['trials']} + {fix['trials']} trials ({escape(proof['order'])}); cache {proof['cache']}")
    for amplifier in proof["amplifiers"]:
        console.print(f"  amplifier {escape(amplifier['name'])}: {escape(amplifier['what'])}")
    if proof["injected"]:
        console.print("  [dim]a race shown with the foreign trace is one your run has IF a thread traces with "
                      "torch.fx while it runs[/]")
    for row in proof["hazards"]:
        word = row["verdict"]
        console.print(f"  {escape(row['hazard']):<18} without the fix {row['baseline']}/{row['baseline_trials']}, "
                      f"with it {row['fix']}/{row['fix_trials']}: [{_STYLE.get(word, '')}]{word}[/] "
                      f"[dim]({escape(printable(row['reason']))})[/]")
        for step in row["next"]:
            console.print(f"    [dim]next:[/] {escape(printable(step))}")
    if not proof["hazards"]:
        console.print("  no race in either arm and nothing the fix claims to stop: [yellow]inconclusive[/]")
    console.print(f"  verdict: [{_STYLE.get(proof['verdict'], '')}]{proof['verdict']}[/]")
    for line in proof["advice"]:
        console.print(f"  [dim]advice:[/] {escape(printable(line))}")
