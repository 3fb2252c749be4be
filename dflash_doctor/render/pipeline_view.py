"""Text view of a `pipeline` run: one summary line, set-up and throughput, every worker's health; and the live
progress on a terminal (what each worker is doing during set-up, then the steps)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional

from dflash_doctor.reference.results import Progress

if TYPE_CHECKING:
    from rich.console import Console

    from dflash_doctor.reference.facts import PipelineFacts

if TYPE_CHECKING:
    from rich.progress import TaskID

_OUTCOME_STYLE = {"ok": "green", "error": "bold red", "killed": "bold red", "stopped": "yellow", "hung": "bold red"}


def _rate(tokens_per_s: Optional[float]) -> str:
    if tokens_per_s is None:
        return "n/a"
    return f"{tokens_per_s / 1000:.1f} Ktok/s" if tokens_per_s >= 1000 else f"{tokens_per_s:.0f} tok/s"


def _loss(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _timing(facts: PipelineFacts) -> str:
    parts = []
    setup_s = facts["setup_s"]
    if setup_s is not None:
        phases = ", ".join(f"{name} {seconds:.1f}" for name, seconds in facts["setup"].items())
        parts.append(f"set-up {setup_s:.1f} s" + (f" ({phases})" if phases else ""))
    warmup_s = facts["warmup_s"]
    if warmup_s is not None:
        parts.append(f"first step done at {warmup_s:.1f} s")
    steps = facts["step_time_s"]
    if steps:
        parts.append(f"step p50 {1000 * steps['p50']:.0f} ms, p90 {1000 * steps['p90']:.0f} ms")
    parts.append(f"wall {facts['wall_s']:.1f} s")
    flops = facts["flops_per_token"]
    if flops:
        parts.append(f"{flops / 1e9:.2f} GFLOP/token")
    mfu = facts["mfu"]
    if mfu is not None:
        parts.append(f"MFU {100 * mfu:.1f}%")
    return " · ".join(parts)


def stopped_summary(facts: PipelineFacts) -> str:
    """`interrupted (SIGINT): stopped 3 workers (...) after 12 of 30 steps; partial report written`."""
    workers = facts["workers"]
    names = ", ".join(f"{w['name']} ({w['phase']})" for w in workers)
    return (f"interrupted ({facts['interrupted']}): stopped {len(workers)} workers [{names}] after "
            f"{facts['steps']} steps; partial report written")


def render_pipeline(console: Console, facts: PipelineFacts) -> None:
    from rich.markup import escape

    from dflash_doctor.render.tables import Column, fitted

    first = facts["start_step"]
    console.print(
        f"[bold]pipeline[/] {facts['preset']} · {facts['workers_mode']} · {facts['device_type']} · "
        f"mitigation {escape(facts['mitigation'])} · steps {first + 1}-{first + facts['steps']} · "
        f"[bold]{_rate(facts['tokens_per_s'])}[/] · "
        f"loss {_loss(facts['loss_first'])} -> {_loss(facts['loss_last'])}"
    )
    console.print(f"[dim]{escape(_timing(facts))}[/]")
    corpus = facts["corpus"]
    if corpus:
        console.print(f"[dim]corpus {corpus['sequences']} x {corpus['seq_len']} tokens in {corpus['seconds']:.1f} s "
                      f"({escape(corpus['decode'])} decode) · target forward {escape(str(facts['target_forward']))}"
                      f" · transport {escape(str(facts['transport']))}[/]")
    saved_to = facts["saved_to"]
    if saved_to:
        console.print(f"[dim]drafter saved to {escape(saved_to)}[/]")

    columns = [Column(header, wrap=header in ("last phase", "error")) for header in
               ("worker", "role", "device", "outcome", "steps", "waited s", "last phase", "error")]
    rows: List[List[str]] = []
    for worker in facts["workers"]:
        style = _OUTCOME_STYLE.get(worker["outcome"], "")
        rows.append([escape(worker["name"]), escape(worker["role"]), escape(worker["device"]),
                     f"[{style}]{worker['outcome']}[/]", str(worker["steps"]), f"{worker['wait_s']:.1f}",
                     escape(worker["phase"]), escape(worker["error"] or "")])
    console.print(fitted(console, columns, rows))
    interrupted, failed = facts["interrupted"], facts["failed_worker"]
    if interrupted:
        console.print(f"[yellow]run stopped by {escape(interrupted)}[/]: partial report")
    elif failed:
        console.print(f"[bold red]run stopped:[/] worker {escape(failed)} failed; "
                      "the other workers were shut down")


class LiveProgress(Progress):
    """The terminal view while a run goes: each worker's set-up phase, then a progress bar of steps. It is a
    `Progress` (reference/results.py): the pipeline calls it, and it never reads the pipeline's state."""

    def __init__(self) -> None:
        import sys

        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as Bar

        self.bar = Bar(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                            console=Console(file=sys.stderr), redirect_stderr=True, transient=True)
        self.task: Optional[TaskID] = None
        self.phases: Dict[str, str] = {}

    @contextmanager
    def running(self, total: int) -> Iterator["LiveProgress"]:
        with self.bar:
            self.task = self.bar.add_task("set-up", total=total, info="")
            yield self

    def phase(self, worker: str, text: str) -> None:
        self.phases[worker] = text
        if self.task is not None:
            latest = " · ".join(f"{name}: {what}" for name, what in list(self.phases.items())[-2:])
            self.bar.update(self.task, info=latest)

    def step(self, done: int, total: int, loss: float, tokens_per_s: Optional[float]) -> None:
        if self.task is not None:
            rate = f" {tokens_per_s:,.0f} tok/s" if tokens_per_s else ""
            self.bar.update(self.task, description="training", completed=done, info=f"loss {loss:.4f}{rate}")
