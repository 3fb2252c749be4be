"""Text view of a `pipeline` run: one summary line, throughput and loss, and every worker's health."""
from __future__ import annotations

_OUTCOME_STYLE = {"ok": "green", "error": "bold red", "killed": "bold red", "stopped": "yellow", "hung": "bold red"}


def _rate(tokens_per_s) -> str:
    if tokens_per_s is None:
        return "n/a"
    return f"{tokens_per_s / 1000:.1f} Ktok/s" if tokens_per_s >= 1000 else f"{tokens_per_s:.0f} tok/s"


def _loss(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def render_pipeline(console, facts: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    first = facts.get("start_step", 0)
    console.print(
        f"[bold]pipeline[/] {facts['preset']} · {facts['workers_mode']} · {facts['device_type']} · "
        f"steps {first + 1}-{first + facts['steps']} · [bold]{_rate(facts.get('tokens_per_s'))}[/] · "
        f"loss {_loss(facts.get('loss_first'))} -> {_loss(facts.get('loss_last'))}"
    )
    timing = f"warm-up {facts['warmup_s']:.1f} s · " if facts.get("warmup_s") is not None else ""
    extra = ""
    if facts.get("flops_per_token"):
        extra += f" · {facts['flops_per_token'] / 1e9:.2f} GFLOP/token"
    if facts.get("mfu") is not None:
        extra += f" · MFU {100 * facts['mfu']:.1f}%"
    console.print(f"[dim]{timing}wall {facts['wall_s']:.1f} s{extra}[/]")
    if facts.get("saved_to"):
        console.print(f"[dim]drafter saved to {escape(facts['saved_to'])}[/]")

    table = Table(show_header=True, header_style="bold", box=None)
    for column in ("worker", "role", "device", "outcome", "steps", "error"):
        table.add_column(column, no_wrap=column != "error")
    for worker in facts.get("workers", []):
        style = _OUTCOME_STYLE.get(worker["outcome"], "")
        table.add_row(worker["name"], worker["role"], worker["device"], f"[{style}]{worker['outcome']}[/]",
                      str(worker["steps"]), escape(worker.get("error") or ""))
    console.print(table)
    if facts.get("failed_worker"):
        console.print(f"[bold red]run stopped:[/] worker {escape(facts['failed_worker'])} died; "
                      "the other workers were shut down cleanly")
