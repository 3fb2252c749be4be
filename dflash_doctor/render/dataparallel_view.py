"""Text view of `repro --mode dataparallel`: one row per nn.DataParallel form, then the verdict and the fixes."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from dflash_doctor.repro.dataparallel_facts import DataParallelFacts

_OUTCOME_STYLE = {"ok": "green", "error": "bold red", "hung": "bold magenta"}


def render_dataparallel_facts(console: "Console", facts: "DataParallelFacts") -> None:
    from rich.markup import escape

    from dflash_doctor.render.tables import Column, fitted

    console.print(f"[bold]repro[/] torch {escape(str(facts['torch_version']))} · device {escape(facts['device'])} "
                  f"· {facts['replicas']} replicas · mode dataparallel · mitigation {escape(facts['mitigation'])}")
    if facts.get("cpu_note"):
        console.print(f"[dim]note: {escape(facts['cpu_note'])}[/]")
    columns = [Column("form"), Column("outcome", wrap=False), Column("steps", "right", wrap=False),
               Column("graphs", "right", wrap=False), Column("took s", "right", wrap=False),
               Column("model intact", wrap=False), Column("fix")]
    rows = []
    for form in facts["forms"]:
        style = _OUTCOME_STYLE.get(form["outcome"], "")
        intact = {True: "yes", False: "[bold red]no[/]", None: "-"}[form["model_intact"]]
        rows.append([escape(form["code"]), f"[{style}]{form['outcome']}[/]", str(form["steps"]),
                     str(form["graphs"]), f"{form['seconds']:.1f}", intact,
                     escape(f"{form['fix']}: {form['fix_outcome']}") if form["fix"] else "-"])
    console.print(fitted(console, columns, rows))
    for form in facts["forms"]:
        if form["error"]:
            first = form["error"].splitlines()[0]
            last = [line for line in (form["traceback"] or "").splitlines() if line.strip()][-1:]
            console.print(f"  {escape(form['form'])}: [red]{escape(first[:200])}[/]"
                          + (f" [dim]({escape(last[0][:160])})[/]" if last and last[0] != first else ""))
        if form["model_intact"] is False:
            console.print(f"  {escape(form['form'])}: the user's model after the step has only "
                          f"{escape(str(form['model_tree_after']))} (its submodules are gone)")
    style = "bold red" if facts["verdict"] == "reproduced" else "bold green"
    console.print(f"[{style}]{escape(str(facts['verdict']))}" + (f" ({escape(str(facts['kind']))})" if facts["kind"]
                                                                  else "") + "[/]")
    for fix in facts["fixes"]:
        console.print(f"[dim]fix {escape(fix['name'])}:[/] {escape(fix['api'])} [dim]({escape(fix['caveat'])})[/]")
